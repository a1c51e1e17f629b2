"""A CPU DDP training step four ways, in the same processes, rounds alternated:
  pycoll                 DDP over pycoll, torch's CPU allocator (buckets staged through shared memory)
  pycoll+shared          the same with pycollectives.use_shared_cpu_memory() on for its steps
                         (buckets and gradients are shared-memory files; peers read them in place)
  pycoll+shared,staged   the allocator on, but over a group with PYCOLL_CPU_SHARED_TENSORS=off: what
                         the allocator's cache alone changes (the ops stage as with torch's allocator)
  gloo                   DDP over Gloo
Per-step milliseconds: for each round, the max over ranks of `--steps` steps' mean; the median
and range over rounds. Each variant has its own model (same initial weights) and its own DDP.

    torchrun --nproc_per_node 2 benchmarks/cpu_ddp_shared_memory.py [--width 1024 --depth 8
        --batch 16 --rounds 7 --steps 10 --json FILE]
"""
import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import pycollectives


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def make_model(width, depth):
    torch.manual_seed(0)
    layers = []
    for _ in range(depth):
        layers += [torch.nn.Linear(width, width), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--width", type=int, default=1024)
    p.add_argument("--depth", type=int, default=8)
    p.add_argument("--batch", type=int, default=16, help="samples per rank")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--json", help="also write the results here")
    p.add_argument("--commit", default="", help="the commit measured, recorded in the --json file")
    a = p.parse_args()
    dist.init_process_group("pycoll", timeout=datetime.timedelta(seconds=300))
    rank, world = dist.get_rank(), dist.get_world_size()
    gloo = dist.new_group(backend="gloo")
    os.environ["PYCOLL_CPU_SHARED_TENSORS"] = "off"  # read when the group is made
    staged = dist.new_group(backend="pycoll")
    del os.environ["PYCOLL_CPU_SHARED_TENSORS"]
    ctrl = dist.new_group(backend="gloo")
    x = torch.randn(a.batch, a.width)

    variants = {}
    for name, group, shared in (("pycoll", None, False), ("pycoll+shared", None, True),
                                ("pycoll+shared,staged", staged, True), ("gloo", gloo, False)):
        pycollectives.use_shared_cpu_memory(shared)
        variants[name] = (DDP(make_model(a.width, a.depth), process_group=group), shared)
    pycollectives.use_shared_cpu_memory(False)

    def step(ddp):
        for prm in ddp.parameters():
            prm.grad = None
        ddp(x).square().mean().backward()

    # Warm-up: DDP rebuilds its buckets during the second step; the allocator's cache fills.
    for ddp, shared in variants.values():
        pycollectives.use_shared_cpu_memory(shared)
        for _ in range(3):
            step(ddp)
    pycollectives.use_shared_cpu_memory(False)

    times = {name: [] for name in variants}
    for _ in range(a.rounds):
        for name, (ddp, shared) in variants.items():
            pycollectives.use_shared_cpu_memory(shared)
            dist.barrier(group=ctrl)
            t0 = time.perf_counter()
            for _ in range(a.steps):
                step(ddp)
            ms = torch.tensor([(time.perf_counter() - t0) / a.steps * 1e3], dtype=torch.float64)
            dist.all_reduce(ms, op=dist.ReduceOp.MAX, group=ctrl)
            times[name].append(ms.item())
    pycollectives.use_shared_cpu_memory(False)

    grad_mib = sum(prm.numel() for prm in variants["pycoll"][0].parameters()) * 4 / 2**20
    if rank == 0:
        print(f"{world} ranks, {os.cpu_count()} CPUs, {cpu_model()}; "
              f"{a.depth} x Linear({a.width}), {grad_mib:.1f} MiB of gradients, batch {a.batch} per rank")
        base = statistics.median(times["pycoll"])
        for name, ts in times.items():
            med = statistics.median(ts)
            print(f"{name:>20}: {med:8.2f} ms per step (range {min(ts):.2f}-{max(ts):.2f}), "
                  f"{med / base:.2f}x pycoll's time")
        if a.json:
            with open(a.json, "w") as f:
                json.dump(dict(world_size=world, cpus=os.cpu_count(), cpu=cpu_model(), torch=torch.__version__,
                               command="torchrun --nproc_per_node %d benchmarks/cpu_ddp_shared_memory.py %s"
                               % (world, " ".join(sys.argv[1:])),
                               commit=a.commit,
                               date=datetime.date.today().isoformat(), width=a.width, depth=a.depth,
                               batch=a.batch, rounds=a.rounds, steps=a.steps, grad_mib=grad_mib,
                               ms_per_step={k: v for k, v in times.items()}), f, indent=1)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
