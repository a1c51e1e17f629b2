"""Train the GPT-style model of ddp_gpt.py as a pipeline (torch.distributed.pipelining).

The blocks are split evenly into one stage per rank (2 ranks: a 2-stage
pipeline; the first stage also embeds, the last also projects to the
vocabulary and computes the loss), or two stages per rank with
``--schedule interleaved``.  Activations and their gradients travel between
ranks by send/recv.  Prints the step time (ms/step, warm-up steps excluded);
with ``--compare nccl|gloo`` it trains the same steps on that backend too and
prints both.

    python examples/pipeline_gpt.py                   # all GPUs (or 2 CPU ranks)
    python examples/pipeline_gpt.py --schedule gpipe --compare nccl
    torchrun --nproc_per_node=2 examples/pipeline_gpt.py --device cpu --compare gloo
"""

import argparse
import math

import torch
import torch.distributed as dist

from common import (
    GPTStage, StepTimer, add_gpt_args, autocast, base_parser, count_params, finish_args,
    gpt_from_args, launch, lm_loss, sum_over_ranks, token_batches,
)

SCHEDULES = {"gpipe": "ScheduleGPipe", "1f1b": "Schedule1F1B",
             "interleaved": "ScheduleInterleaved1F1B"}


def train(args, run):
    import torch.distributed.pipelining as pp

    per_rank = 2 if args.schedule == "interleaved" else 1
    n_stages = run.world_size * per_rank
    if args.layers < n_stages:
        raise SystemExit(f"--layers {args.layers}: need at least one block per stage ({n_stages} stages)")
    model = gpt_from_args(args)  # every rank builds the whole model from the seed, keeps its stages
    n_params = count_params(model)
    bounds = [round(i * args.layers / n_stages) for i in range(n_stages + 1)]
    ids = [run.rank + k * run.world_size for k in range(per_rank)]
    mods = [GPTStage(model, bounds[i], bounds[i + 1]).to(run.device) for i in ids]
    del model
    stages = [pp.PipelineStage(m, i, n_stages, run.device, group=run.group) for m, i in zip(mods, ids)]
    cls = getattr(pp, SCHEDULES[args.schedule])
    sched = cls(stages if per_rank > 1 else stages[0], n_microbatches=args.microbatches,
                loss_fn=lm_loss)
    run.log(f"GPT {n_params / 1e6:.1f} M parameters ({args.layers} layers, dim {args.dim}, "
            f"{args.heads} heads, seq {args.seq}, vocab {args.vocab}) in {n_stages} stages "
            f"(blocks {bounds}), {args.schedule}, {args.microbatches} micro-batches of {args.batch}, "
            f"amp={args.amp}")
    params = [p for m in mods for p in m.parameters()]
    fused = {"fused": True} if run.device.type == "cuda" else {}
    opt = torch.optim.AdamW(params, lr=args.lr, weight_decay=0.0, **fused)

    # One pipeline: every stage sees the same batches (those of "rank 0").
    batch_args = argparse_copy(args, batch=args.batch * args.microbatches)
    data = token_batches(batch_args, 0, args.steps, run.device)
    first, last = 0 in ids, n_stages - 1 in ids
    timer = StepTimer(run.device, args.warmup)
    losses = []
    for step, [(x, y)] in enumerate(data):
        timer.step(step)
        opt.zero_grad(set_to_none=True)
        mb_losses = []
        with autocast(args, run.device):
            sched.step(*((x,) if first else ()),
                       **(dict(target=y, losses=mb_losses) if last else {}))
        opt.step()
        if last:
            losses.append(torch.stack(mb_losses).mean().detach())
    ms = timer.ms_per_step(run)
    # The last stage's rank has the losses: share them.
    last_rank = dist.get_global_rank(run.group, (n_stages - 1) % run.world_size)
    dev = torch.device("cpu") if dist.get_backend(run.group) == "gloo" else run.device
    t = torch.stack(losses).float().to(dev) if last else torch.zeros(args.steps, device=dev)
    dist.broadcast(t, src=last_rank, group=run.group)
    local = sum(float(p.detach().double().pow(2).sum()) for p in params)
    return {"losses": t.tolist(), "ms_per_step": ms,
            "param_norm": math.sqrt(sum_over_ranks(local, run))}


def argparse_copy(args, **changes):
    d = vars(args).copy()
    d.update(changes)
    return argparse.Namespace(**d)


def parse_args(argv=None):
    p = base_parser(__doc__.splitlines()[0])
    add_gpt_args(p)
    p.add_argument("--schedule", choices=list(SCHEDULES), default="1f1b")
    p.add_argument("--microbatches", type=int, default=None,
                   help="micro-batches per step (default 8 GPU, 4 CPU); --batch is their size")
    args = p.parse_args(argv)
    batch_given = args.batch is not None
    args = finish_args(args, gpt=True)
    if args.microbatches is None:
        args.microbatches = 8 if args.device == "cuda" else 4
    if not batch_given:
        # The pipeline's whole batch (micro-batches x --batch) equals the
        # global batch of ddp_gpt.py's defaults (ranks x --batch).
        args.batch = max(1, args.batch * args.nproc // args.microbatches)
    return args


def main():
    launch(train, parse_args())


if __name__ == "__main__":
    main()
