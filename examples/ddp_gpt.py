"""Train a GPT-style language model with DistributedDataParallel.

bf16 autocast on GPU, gradient accumulation (``--accum``: the first micro-
batches under ``no_sync()``), and a choice of DDP communication hook
(``--hook``): none, torch's fp16/bf16 compression or PowerSGD, or the
pycollectives PowerSGD / signSGD hooks when ``pycollectives.hooks`` exists.
Prints the step time (ms/step, warm-up steps excluded); with ``--compare
nccl|gloo`` it trains the same steps on that backend too and prints both.

    python examples/ddp_gpt.py                       # all GPUs (or 2 CPU ranks)
    python examples/ddp_gpt.py --compare nccl --hook powersgd
    torchrun --nproc_per_node=2 examples/ddp_gpt.py --device cpu --compare gloo
"""

import contextlib

import torch
from torch.nn.parallel import DistributedDataParallel as DDP

from common import (
    StepTimer, add_gpt_args, autocast, base_parser, count_params, finish_args, gpt_from_args,
    launch, lm_loss, mean_over_ranks, param_norm, token_batches,
)

HOOKS = ["none", "fp16", "bf16", "powersgd", "pycoll-powersgd", "pycoll-signsgd"]


def register_hook(ddp, args, run):
    """Attach the --hook to `ddp`, in `run.group`; returns a description."""
    if args.hook == "none":
        return "no hook (DDP's built-in all_reduce)"
    if args.hook in ("fp16", "bf16", "powersgd"):
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

        if args.hook == "powersgd":
            state = powerSGD_hook.PowerSGDState(
                process_group=run.group, matrix_approximation_rank=args.powersgd_rank,
                start_powerSGD_iter=2, min_compression_rate=2, use_error_feedback=True,
                warm_start=True, random_seed=args.seed)
            ddp.register_comm_hook(state, powerSGD_hook.powerSGD_hook)
            return f"torch PowerSGD hook, rank {args.powersgd_rank}"
        hook = default_hooks.fp16_compress_hook if args.hook == "fp16" else default_hooks.bf16_compress_hook
        ddp.register_comm_hook(run.group, hook)
        return f"torch {args.hook} compression hook"
    try:
        from pycollectives import hooks as pyhooks
    except ImportError as e:
        raise SystemExit(f"--hook {args.hook}: pycollectives.hooks is not available ({e})")
    if args.hook == "pycoll-powersgd":
        state = pyhooks.PowerSGDState(process_group=run.group,
                                      matrix_approximation_rank=args.powersgd_rank,
                                      start_powerSGD_iter=2, random_seed=args.seed)
        ddp.register_comm_hook(state, pyhooks.powersgd_hook)
        return f"pycollectives PowerSGD hook, rank {args.powersgd_rank}"
    state = pyhooks.SignSGDState(process_group=run.group)
    ddp.register_comm_hook(state, pyhooks.signsgd_hook)
    return "pycollectives signSGD hook"


def train(args, run):
    model = gpt_from_args(args).to(run.device)
    ddp = DDP(model, process_group=run.group,
              device_ids=[run.local_rank] if run.device.type == "cuda" else None)
    what = register_hook(ddp, args, run)
    run.log(f"GPT {count_params(model) / 1e6:.1f} M parameters ({args.layers} layers, dim {args.dim}, "
            f"{args.heads} heads, seq {args.seq}, vocab {args.vocab}), {run.world_size} ranks, "
            f"micro-batch {args.batch} x {args.accum} accumulation, amp={args.amp}, {what}")
    fused = {"fused": True} if run.device.type == "cuda" else {}
    opt = torch.optim.AdamW(ddp.parameters(), lr=args.lr, weight_decay=0.0, **fused)
    data = token_batches(args, run.rank, args.steps, run.device, micro=args.accum)

    timer = StepTimer(run.device, args.warmup)
    losses = []
    for step, micro in enumerate(data):
        timer.step(step)
        opt.zero_grad(set_to_none=True)
        total = torch.zeros((), device=run.device)
        for m, (x, y) in enumerate(micro):
            sync = m == len(micro) - 1
            with (contextlib.nullcontext() if sync else ddp.no_sync()):
                with autocast(args, run.device):
                    loss = lm_loss(ddp(x), y) / len(micro)
                loss.backward()
            total += loss.detach()
        opt.step()
        losses.append(total)
        if args.log_every and (step + 1) % args.log_every == 0 and run.is_main:
            print(f"[{run.backend}] step {step + 1}/{args.steps} loss {total.item():.4f}", flush=True)
    ms = timer.ms_per_step(run)
    return {"losses": mean_over_ranks(losses, run), "ms_per_step": ms,
            "param_norm": param_norm(model.parameters())}


def parse_args(argv=None):
    p = base_parser(__doc__.splitlines()[0])
    add_gpt_args(p)
    p.add_argument("--accum", type=int, default=1, help="micro-batches per optimizer step")
    p.add_argument("--hook", choices=HOOKS, default="none", help="DDP communication hook")
    p.add_argument("--powersgd-rank", type=int, default=4, help="PowerSGD matrix rank")
    p.add_argument("--log-every", type=int, default=0, help="rank-0 loss every N steps (0: off)")
    args = finish_args(p.parse_args(argv), gpt=True)
    return args


def main():
    launch(train, parse_args())


if __name__ == "__main__":
    main()
