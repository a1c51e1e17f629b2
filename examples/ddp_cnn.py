"""Train a small CNN on CIFAR-10-shaped data with DistributedDataParallel.

Each rank reads its share of the training set through a DistributedSampler
(reshuffled every epoch with set_epoch); rank 0 logs; the test accuracy is
all-reduced over the ranks.  CIFAR-10 is read from ``--data`` (the python
version, the directory holding data_batch_1..5 and test_batch) when given,
else a synthetic, learnable CIFAR-10-shaped set is used.  ``--hook
powersgd|signsgd`` compresses the gradients with pycollectives' DDP hooks
(PowerSGD of rank ``--powersgd-rank``, or 1-bit signs).  Prints the step
time (ms/step, warm-up steps excluded), the final loss and, with a hook, the
bytes it sent per step; with ``--compare nccl|gloo`` it trains the same
steps on that backend too and prints both.

    python examples/ddp_cnn.py                        # all GPUs (or 2 CPU ranks)
    python examples/ddp_cnn.py --device cpu --compare gloo
    python examples/ddp_cnn.py --device cpu --hook powersgd --powersgd-rank 1
    torchrun --nproc_per_node=2 examples/ddp_cnn.py --device cpu
"""

import torch
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from common import (
    CNN, StepTimer, base_parser, cifar10, count_params, finish_args, launch, mean_over_ranks,
    param_norm, sum_over_ranks,
)


def register_hook(ddp, args, run):
    """Attach --hook (pycollectives.hooks) to `ddp`; returns its state, None for no hook."""
    if args.hook == "none":
        return None
    from pycollectives import hooks

    if args.hook == "powersgd":
        # The first 2 steps average plainly (PowerSGD's warm-up), then rank-r factors.
        state = hooks.PowerSGDState(process_group=run.group, matrix_approximation_rank=args.powersgd_rank,
                                    start_powerSGD_iter=2, random_seed=args.seed)
        ddp.register_comm_hook(state, hooks.powersgd_hook)
    else:
        state = hooks.SignSGDState(process_group=run.group)
        ddp.register_comm_hook(state, hooks.signsgd_hook)
    return state


def train(args, run):
    model = CNN(args.width).to(run.device)
    if args.sync_bn:
        model = nn.SyncBatchNorm.convert_sync_batchnorm(model, process_group=run.group)
    ddp = DDP(model, process_group=run.group,
              device_ids=[run.local_rank] if run.device.type == "cuda" else None)
    hook = register_hook(ddp, args, run)
    opt = torch.optim.SGD(ddp.parameters(), lr=args.lr, momentum=0.9, weight_decay=5e-4)

    x, y = cifar10(args, True, args.samples)
    xt, yt = cifar10(args, False, max(args.samples // 5, run.world_size))
    train_set, test_set = TensorDataset(x, y), TensorDataset(xt, yt)
    sampler = DistributedSampler(train_set, num_replicas=run.world_size, rank=run.rank,
                                 shuffle=True, seed=args.seed, drop_last=True)
    loader = DataLoader(train_set, batch_size=args.batch, sampler=sampler, drop_last=True,
                        pin_memory=run.device.type == "cuda")
    steps_per_epoch = len(loader) if args.steps is None else min(args.steps, len(loader))
    run.log(f"CNN width {args.width}: {count_params(model) / 1e6:.2f} M parameters; "
            f"{len(train_set)} training images ({'CIFAR-10' if args.data else 'synthetic'}), "
            f"{run.world_size} ranks x batch {args.batch}, {args.epochs} epochs x "
            f"{steps_per_epoch} steps, hook {args.hook}"
            + (f" (rank {args.powersgd_rank})" if args.hook == "powersgd" else ""))

    timer = StepTimer(run.device, args.warmup)
    losses, step = [], 0
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)  # a different shuffle every epoch, the same on every rank
        ddp.train()
        for i, (xb, yb) in enumerate(loader):
            if i == steps_per_epoch:
                break
            timer.step(step)
            if hook is not None and step == args.warmup:
                hook.stats.reset()  # count the timed steps only
            xb = xb.to(run.device, non_blocking=True)
            yb = yb.to(run.device, non_blocking=True)
            opt.zero_grad(set_to_none=True)
            loss = nn.functional.cross_entropy(ddp(xb), yb)
            loss.backward()
            opt.step()
            losses.append(loss.detach())
            step += 1
        timer.pause()
        acc = evaluate(ddp, test_set, run)
        epoch_losses = mean_over_ranks(losses[-steps_per_epoch:], run)
        run.log(f"epoch {epoch + 1}/{args.epochs}: train loss {sum(epoch_losses) / len(epoch_losses):.4f}, "
                f"test accuracy {acc * 100:.2f}%")
        timer.resume()
    ms = timer.ms_per_step(run)
    out = {"losses": mean_over_ranks(losses, run), "ms_per_step": ms,
           "param_norm": param_norm(model.parameters()), "test_accuracy": acc}
    if hook is not None:  # this rank's payload into the hook's collectives, per timed step
        out["hook_bytes_per_step"] = hook.stats.sent_bytes / max(step - args.warmup, 1)
        out["plain_bytes_per_step"] = hook.stats.raw_bytes / max(step - args.warmup, 1)
    return out


@torch.no_grad()
def evaluate(ddp, test_set, run):
    """Accuracy over the whole test set: each rank scores its share, the
    counts are all-reduced."""
    ddp.eval()
    sampler = DistributedSampler(test_set, num_replicas=run.world_size, rank=run.rank, shuffle=False)
    loader = DataLoader(test_set, batch_size=256, sampler=sampler)
    correct = total = 0
    for xb, yb in loader:
        pred = ddp.module(xb.to(run.device)).argmax(1).cpu()
        correct += int((pred == yb).sum())
        total += len(yb)
    return sum_over_ranks(correct, run) / sum_over_ranks(total, run)


def parse_args(argv=None):
    p = base_parser(__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--width", type=int, default=None, help="channels of the first stage (64 GPU, 16 CPU)")
    p.add_argument("--samples", type=int, default=None,
                   help="synthetic training images (10000 GPU, 1024 CPU; CIFAR-10 has 50000)")
    p.add_argument("--sync-bn", action="store_true", help="SyncBatchNorm (GPU only)")
    p.add_argument("--hook", choices=["none", "powersgd", "signsgd"], default="none",
                   help="DDP communication hook of pycollectives.hooks")
    p.add_argument("--powersgd-rank", type=int, default=4, help="PowerSGD matrix rank")
    args = p.parse_args(argv)
    steps_given = args.steps
    args = finish_args(args)
    args.steps = steps_given  # here: a cap on steps per epoch (None: the whole epoch)
    on_gpu = args.device == "cuda"
    if args.batch is None:
        args.batch = 128 if on_gpu else 32
    if args.width is None:
        args.width = 64 if on_gpu else 16
    if args.samples is None:
        args.samples = 10000 if on_gpu else 1024
    if args.lr is None:
        args.lr = 0.05
    if args.sync_bn and not on_gpu:
        raise SystemExit("--sync-bn: torch's SyncBatchNorm runs on GPUs only")
    return args


def main():
    launch(train, parse_args())


if __name__ == "__main__":
    main()
