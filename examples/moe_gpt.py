"""Train a mixture-of-experts GPT with expert parallelism (all_to_all token dispatch).

Every block's MLP is a mixture of experts: ``--experts-per-rank`` experts on
each rank (ranks x that many in all), a linear router with softmax and top-2
choice (weights renormalised over the two), a capacity of ``--capacity-factor``
x the even share of token slots per expert (tokens beyond it are dropped and
pass on through the residual only), and the Switch/GShard load-balancing loss
(``--aux-coef``).  Tokens travel to the rank of their expert and back with
``all_to_all_single`` and uneven split sizes, after an all_to_all of the
per-expert counts; the backward pass runs the reverse all_to_all.  The rest of
the model (attention, embeddings, router) is data-parallel: its gradients are
averaged with one all_reduce per step, the experts' are not.
Prints the step time (ms/step, warm-up steps excluded); with ``--compare
nccl|gloo`` it trains the same steps on that backend too and prints both.

    python examples/moe_gpt.py                        # all GPUs (or 2 CPU ranks)
    python examples/moe_gpt.py --compare nccl --experts-per-rank 4
    python examples/moe_gpt.py --device cpu --nproc 3 --compare gloo
    torchrun --nproc_per_node=2 examples/moe_gpt.py --device cpu --compare gloo
"""

import math
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

from common import (
    GPT, Block, StepTimer, _init_weights, add_gpt_args, autocast, base_parser, finish_args,
    generator, gpu_count, launch, lm_loss, mean_over_ranks, sum_over_ranks, token_batches,
)

# Half the depth of the dense examples' default: with 2 experts per rank of
# hidden width 2 x dim the model has about 93 M parameters per rank.
MOE_GPU = dict(layers=6, batch=8)


class AllToAll(torch.autograd.Function):
    """all_to_all_single of the rows of `x` whose backward sends the gradients
    back the way the rows came (the same splits, swapped)."""

    @staticmethod
    def forward(ctx, x, send_splits, recv_splits, group):
        ctx.send_splits, ctx.recv_splits, ctx.group = send_splits, recv_splits, group
        return _all_to_all_rows(x, send_splits, recv_splits, group)

    @staticmethod
    def backward(ctx, grad):
        return _all_to_all_rows(grad, ctx.recv_splits, ctx.send_splits, ctx.group), None, None, None


def _all_to_all_rows(x, send_splits, recv_splits, group):
    out = x.new_empty((sum(recv_splits),) + tuple(x.shape[1:]))
    dist.all_to_all_single(out, x.contiguous(), output_split_sizes=recv_splits,
                           input_split_sizes=send_splits, group=group)
    return out


class Experts(nn.Module):
    """This rank's experts: GELU MLPs dim -> hidden -> dim, weights stacked
    along dim 0.  Expert e is initialised from its own generator (seed,
    layer, e), so the experts are the same whatever the rank count, and the
    global RNG stays in step across ranks (the dense weights must agree)."""

    def __init__(self, dim: int, hidden: int, first: int, count: int, seed: int, layer: int):
        super().__init__()
        self.w_in = nn.Parameter(torch.empty(count, hidden, dim))
        self.b_in = nn.Parameter(torch.zeros(count, hidden))
        self.w_out = nn.Parameter(torch.empty(count, dim, hidden))
        self.b_out = nn.Parameter(torch.zeros(count, dim))
        with torch.no_grad():
            for j in range(count):
                g = generator(seed, "expert", layer, first + j)
                nn.init.normal_(self.w_in[j], std=0.02, generator=g)
                nn.init.normal_(self.w_out[j], std=0.02, generator=g)

    def forward(self, x: torch.Tensor, counts: list) -> torch.Tensor:
        """`x`: rows grouped by local expert, counts[j] rows for expert j."""
        ys = [F.linear(F.gelu(F.linear(rows, self.w_in[j], self.b_in[j])), self.w_out[j], self.b_out[j])
              for j, rows in enumerate(x.split(counts))]
        return torch.cat(ys) if len(ys) > 1 else ys[0]


class MoE(nn.Module):
    """Top-k routed mixture of experts over the ranks of `group`, expert e on
    rank e // experts_per_rank.  After forward, `aux_loss` holds this layer's
    load-balancing loss and `dropped` the number of token slots over capacity."""

    def __init__(self, dim, hidden, experts_per_rank, top_k, capacity_factor, group, seed, layer):
        super().__init__()
        self.group = group
        self.world = dist.get_world_size(group)
        self.per_rank = experts_per_rank
        self.n_experts = experts_per_rank * self.world
        self.top_k, self.capacity_factor = top_k, capacity_factor
        self.gate = nn.Linear(dim, self.n_experts, bias=False)
        first = dist.get_rank(group) * experts_per_rank
        self.experts = Experts(dim, hidden, first, experts_per_rank, seed, layer)
        self.aux_loss = self.dropped = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x = x.reshape(-1, shape[-1])
        n_tokens, n_experts, k, w = x.shape[0], self.n_experts, self.top_k, self.world

        # Route in fp32 even under autocast (Switch's selective precision:
        # a bf16 softmax makes the choice of expert noisy).
        with torch.autocast(x.device.type, enabled=False):
            probs = F.softmax(F.linear(x.float(), self.gate.weight.float()), dim=-1)
        weights, chosen = probs.topk(k, dim=-1)
        weights = weights / weights.sum(dim=-1, keepdim=True)

        # Switch/GShard balance loss: n_experts * sum_e (share of tokens whose
        # first choice is e) * (mean router probability of e); 1 when even.
        first_share = F.one_hot(chosen[:, 0], n_experts).float().mean(0)
        self.aux_loss = n_experts * (first_share * probs.mean(0)).sum()

        # Token slots in priority order, every first choice before any second
        # (GShard), so that overflow drops second choices first.
        slot_expert = chosen.t().reshape(-1)
        slot_weight = weights.t().reshape(-1)
        slot_token = torch.arange(n_tokens, device=x.device).repeat(k)
        one_hot = F.one_hot(slot_expert, n_experts)
        position = (one_hot.cumsum(0) * one_hot).sum(1) - 1  # place in its expert's queue
        capacity = math.ceil(self.capacity_factor * n_tokens * k / n_experts)
        kept = (position < capacity).nonzero().squeeze(1)
        self.dropped = slot_expert.numel() - kept.numel()
        # Sort the kept slots by expert: destination ranks are then contiguous.
        kept = kept[torch.argsort(slot_expert[kept], stable=True)]
        send_expert, send_token, send_weight = slot_expert[kept], slot_token[kept], slot_weight[kept]

        # Tell every rank how many rows it gets for each of its experts.
        send_counts = torch.bincount(send_expert, minlength=n_experts)
        recv_counts = torch.empty_like(send_counts)
        dist.all_to_all_single(recv_counts, send_counts, group=self.group)
        # The split sizes must be Python ints: one device-to-host copy per layer.
        send_splits = send_counts.view(w, self.per_rank).sum(1)
        recv_splits = recv_counts.view(w, self.per_rank).sum(1)
        host = torch.cat([send_splits, recv_splits, recv_counts]).tolist()
        send_splits, recv_splits = host[:w], host[w:2 * w]
        recv_counts_host = host[2 * w:]  # [source rank][local expert]

        rows = x[send_token]
        if torch.is_autocast_enabled(x.device.type):
            # The experts compute in the autocast dtype anyway: send half the bytes.
            rows = rows.to(torch.get_autocast_dtype(x.device.type))
        received = AllToAll.apply(rows, send_splits, recv_splits, self.group)

        # Received rows come grouped by source rank, then by local expert;
        # the experts want them grouped by expert.
        per_expert = [sum(recv_counts_host[r * self.per_rank + j] for r in range(w))
                      for j in range(self.per_rank)]
        if self.per_rank > 1:
            expert_of_row = torch.arange(self.per_rank, device=x.device).repeat(w).repeat_interleave(
                recv_counts, output_size=received.shape[0])
            by_expert = torch.argsort(expert_of_row, stable=True)
            out_rows = self.experts(received[by_expert], per_expert)[torch.argsort(by_expert)]
        else:
            out_rows = self.experts(received, per_expert)
        returned = AllToAll.apply(out_rows, recv_splits, send_splits, self.group)

        # Weighted sum of each token's (at most k) expert outputs; dropped
        # slots add nothing.
        contrib = returned.float() * send_weight.unsqueeze(1)
        out = x.new_zeros(n_tokens, shape[-1]).index_add(0, send_token, contrib.to(x.dtype))
        return out.view(shape)


class MoEBlock(Block):
    """common.Block's attention, then a mixture of experts instead of its MLP."""

    def __init__(self, dim, heads, moe: MoE):
        super().__init__(dim, heads)
        del self.fc, self.out
        self.moe = moe

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.attend(x)
        return x + self.moe(self.ln2(x))


class MoEGPT(GPT):
    """common.GPT (embeddings, final LayerNorm, head, forward) with MoE blocks."""

    def __init__(self, args, group):
        super().__init__(0, args.dim, args.heads, args.seq, args.vocab)
        self.blocks = nn.ModuleList(
            MoEBlock(args.dim, args.heads,
                     MoE(args.dim, args.expert_hidden, args.experts_per_rank, args.top_k,
                         args.capacity_factor, group, args.seed, layer))
            for layer in range(args.layers))
        self.blocks.apply(_init_weights)  # touches Linear/Embedding only, not the experts

    def moe_layers(self):
        return [blk.moe for blk in self.blocks]

    def expert_parameters(self):
        return [p for m in self.moe_layers() for p in m.experts.parameters()]


def train(args, run):
    model = MoEGPT(args, run.group).to(run.device)
    expert_params = model.expert_parameters()
    is_expert = {id(p) for p in expert_params}
    dense_params = [p for p in model.parameters() if id(p) not in is_expert]
    n_dense = sum(p.numel() for p in dense_params)
    n_expert_local = sum(p.numel() for p in expert_params)
    n_experts = args.experts_per_rank * run.world_size
    run.log(f"MoE GPT {(n_dense + n_expert_local * run.world_size) / 1e6:.1f} M parameters "
            f"({n_dense / 1e6:.1f} M dense + {n_experts} experts of "
            f"{n_expert_local / args.experts_per_rank / args.layers / 1e6:.2f} M x {args.layers} layers), "
            f"{(n_dense + n_expert_local) / 1e6:.1f} M per rank; {args.layers} layers, dim {args.dim}, "
            f"{args.heads} heads, seq {args.seq}, vocab {args.vocab}, expert hidden {args.expert_hidden}, "
            f"top-{args.top_k}, capacity factor {args.capacity_factor}, aux coef {args.aux_coef}; "
            f"{run.world_size} ranks, batch {args.batch} per rank, amp={args.amp}")
    fused = {"fused": True} if run.device.type == "cuda" else {}
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0, **fused)
    data = token_batches(args, run.rank, args.steps, run.device)
    slots_per_step = args.batch * args.seq * args.top_k * args.layers

    timer = StepTimer(run.device, args.warmup)
    losses, aux_losses, dropped = [], [], []
    for step, [(x, y)] in enumerate(data):
        timer.step(step)
        opt.zero_grad(set_to_none=True)
        with autocast(args, run.device):
            loss = lm_loss(model(x), y)
        aux = torch.stack([m.aux_loss for m in model.moe_layers()]).sum()
        (loss + args.aux_coef * aux).backward()
        sync_gradients(dense_params, expert_params, run)
        opt.step()
        losses.append(loss.detach())
        aux_losses.append(aux.detach() / args.layers)
        dropped.append(sum(m.dropped for m in model.moe_layers()) / slots_per_step)
        if args.log_every and (step + 1) % args.log_every == 0 and run.is_main:
            print(f"[{run.backend}] step {step + 1}/{args.steps} loss {loss.item():.4f} "
                  f"aux {aux.item() / args.layers:.4f} dropped {dropped[-1]:.3f}", flush=True)
    ms = timer.ms_per_step(run)
    # Each rank holds the dense weights (the same everywhere) and its own experts.
    local = sum(float(p.detach().double().pow(2).sum()) for p in expert_params)
    if run.is_main:
        local += sum(float(p.detach().double().pow(2).sum()) for p in dense_params)
    return {"losses": mean_over_ranks(losses, run), "ms_per_step": ms,
            "param_norm": math.sqrt(sum_over_ranks(local, run)),
            "aux_loss": mean_over_ranks(aux_losses[-1:], run)[0],
            "dropped_fraction": mean_over_ranks(dropped[-1:], run)[0]}


def sync_gradients(dense_params, expert_params, run):
    """Dense gradients: mean over the ranks (data parallel), one all_reduce
    of a flat buffer.  Expert gradients already sum every rank's tokens,
    i.e. they are the gradient of the sum of the ranks' losses: divide by
    the rank count to make it the mean's, like the dense ones; never average
    them across ranks, each rank holds different experts."""
    grads = [p.grad for p in dense_params]
    flat = _flatten_dense_tensors(grads)
    dist.all_reduce(flat, group=run.group)
    flat.div_(run.world_size)
    for g, reduced in zip(grads, _unflatten_dense_tensors(flat, grads)):
        g.copy_(reduced)
    torch._foreach_div_([p.grad for p in expert_params], run.world_size)


def parse_args(argv=None):
    p = base_parser(__doc__.splitlines()[0])
    add_gpt_args(p)
    g = p.add_argument_group("mixture of experts (GPU default: 6 layers, batch 8)")
    g.add_argument("--experts-per-rank", type=int, default=2)
    g.add_argument("--expert-hidden", type=int, default=None,
                   help="expert MLP width (default 2 x dim: top-2 then costs about what "
                        "the dense 4 x dim MLP does)")
    g.add_argument("--top-k", type=int, default=2, help="experts per token")
    g.add_argument("--capacity-factor", type=float, default=1.25,
                   help="expert capacity as a multiple of an even share of the token slots")
    g.add_argument("--aux-coef", type=float, default=0.01, help="weight of the load-balancing loss")
    p.add_argument("--log-every", type=int, default=0, help="rank-0 loss every N steps (0: off)")
    args = p.parse_args(argv)
    on_gpu = (args.device or ("cuda" if gpu_count() > 0 else "cpu")) == "cuda"
    if on_gpu:
        for k, v in MOE_GPU.items():
            if getattr(args, k) is None:
                setattr(args, k, v)
    args = finish_args(args, gpt=True)
    if args.expert_hidden is None:
        args.expert_hidden = 2 * args.dim
    if args.experts_per_rank < 1:
        raise SystemExit("--experts-per-rank must be at least 1")
    world = int(os.environ.get("WORLD_SIZE", args.nproc))  # torchrun's, else ours
    if not 1 <= args.top_k <= args.experts_per_rank * world:
        raise SystemExit(f"--top-k {args.top_k}: need 1 to {args.experts_per_rank * world} "
                         f"(the expert count)")
    return args


def main():
    launch(train, parse_args())


if __name__ == "__main__":
    main()
