"""Train the GPT-style model of ddp_gpt.py with FSDP2 (torch.distributed.fsdp.fully_shard).

Each transformer block is its own FSDP unit (all-gathered before its forward
and backward, its gradients reduce-scattered after), then the root holds the
embeddings and the head.  ``--mp bf16`` (the GPU default) computes with bf16
parameters and reduces gradients in fp32 (MixedPrecisionPolicy);
``--no-reshard`` keeps the gathered parameters between forward and backward.
Prints the step time (ms/step, warm-up steps excluded); with ``--compare
nccl|gloo`` it trains the same steps on that backend too and prints both.

    python examples/fsdp_gpt.py                       # all GPUs (or 2 CPU ranks)
    python examples/fsdp_gpt.py --compare nccl
    torchrun --nproc_per_node=2 examples/fsdp_gpt.py --device cpu --compare gloo
"""

import argparse
import math

import torch

from common import (
    StepTimer, add_gpt_args, base_parser, count_params, finish_args, gpt_from_args, launch,
    lm_loss, mean_over_ranks, sum_over_ranks, token_batches,
)


def train(args, run):
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    model = gpt_from_args(args).to(run.device)
    n_params = count_params(model)
    # A 1-D mesh over this run's process group (so that --compare can shard
    # the same model over a second backend in the same launch).
    mesh = DeviceMesh.from_group(run.group, run.device.type)
    kw = dict(mesh=mesh, reshard_after_forward=args.reshard)
    if args.mp == "bf16":
        kw["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for blk in model.blocks:
        fully_shard(blk, **kw)
    fully_shard(model, **kw)
    run.log(f"GPT {n_params / 1e6:.1f} M parameters ({args.layers} layers, dim {args.dim}, "
            f"{args.heads} heads, seq {args.seq}, vocab {args.vocab}) sharded over "
            f"{run.world_size} ranks, batch {args.batch} per rank, params {args.mp}, "
            f"reshard_after_forward={args.reshard}")
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0, foreach=True)
    data = token_batches(args, run.rank, args.steps, run.device)

    timer = StepTimer(run.device, args.warmup)
    losses = []
    for step, [(x, y)] in enumerate(data):
        timer.step(step)
        opt.zero_grad(set_to_none=True)
        loss = lm_loss(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.detach())
        if args.log_every and (step + 1) % args.log_every == 0 and run.is_main:
            print(f"[{run.backend}] step {step + 1}/{args.steps} loss {loss.item():.4f}", flush=True)
    ms = timer.ms_per_step(run)
    # Norm of the whole model from the local shards.
    local = sum(float(p.to_local().detach().double().pow(2).sum()) for p in model.parameters())
    return {"losses": mean_over_ranks(losses, run), "ms_per_step": ms,
            "param_norm": math.sqrt(sum_over_ranks(local, run))}


def parse_args(argv=None):
    p = base_parser(__doc__.splitlines()[0])
    add_gpt_args(p)
    p.add_argument("--mp", choices=["bf16", "fp32"], default=None,
                   help="parameter dtype in forward/backward (default bf16 on GPU, fp32 on CPU)")
    p.add_argument("--reshard", default=True, action=argparse.BooleanOptionalAction,
                   help="reshard_after_forward")
    p.add_argument("--log-every", type=int, default=0, help="rank-0 loss every N steps (0: off)")
    args = finish_args(p.parse_args(argv), gpt=True)
    if args.mp is None:
        args.mp = "bf16" if args.device == "cuda" else "fp32"
    args.amp = False  # FSDP2's MixedPrecisionPolicy does the casting
    return args


def main():
    launch(train, parse_args())


if __name__ == "__main__":
    main()
