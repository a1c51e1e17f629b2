"""Where the time of a CPU all_reduce across 2 simulated hosts x 2 ranks goes (decision 0013).

    python benchmarks/cpu_hierarchical_phases.py [--mib 8] [--reps 3] [--iters 10]

Four ranks on this machine, ranks 0-1 as host node0 and 2-3 as node1 (``PYCOLL_HOSTID``; the
hosts still share the cores, as in ``pycoll-bench --hosts 2``). It times, in one launch, each
row ``--reps`` times with pycoll-bench's timing (``pycollectives.bench.timing.time_calls``: ms per
call, mean of ``--iters`` back-to-back calls, the slowest rank):

- Gloo's flat 4-rank all_reduce of the message (the baseline of the issue across hosts);
- the rail phase alone: two 2-rank Gloo all_reduces of half the message, both rails at once;
- pycoll's all_reduce across the two hosts (the three phases, as ``auto`` runs them);
- the host phases alone, both hosts at once: pycoll's reduce_scatter then all_gather inside each
  host, and for comparison a one-host pycoll all_reduce of the whole message.

If the three phases cost about the rail plus the host phases, overlapping them can gain only
where the two do not compete for the same cores.
"""
import argparse
import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from pycollectives.bench.timing import time_calls

WORLD = 4


def _rank(rank, port, mib, reps, iters):
    os.environ["PYCOLL_HOSTID"] = f"node{rank // 2}"
    import pycollectives  # noqa: F401  (registers the backend)

    dist.init_process_group("gloo", rank=rank, world_size=WORLD, init_method=f"tcp://127.0.0.1:{port}")
    # Every rank creates every group, in the same order.
    control = dist.new_group(backend="gloo")  # barriers and the max over ranks, never timed
    rail = [dist.new_group([0, 2]), dist.new_group([1, 3])][rank % 2]
    across = dist.new_group(list(range(WORLD)), backend="pycoll")
    host = [dist.new_group([0, 1], backend="pycoll"), dist.new_group([2, 3], backend="pycoll")][rank // 2]
    n = (mib << 20) // 4
    whole, half = torch.ones(n), torch.ones(n // 2)
    rows = {
        "gloo flat all_reduce": lambda: dist.all_reduce(whole),
        "rail phase: gloo all_reduce of 1/2, both rails": lambda: dist.all_reduce(half, group=rail),
        "pycoll all_reduce across the hosts": lambda: dist.all_reduce(whole, group=across),
        "host phases: pycoll reduce_scatter + all_gather": lambda: (
            dist.reduce_scatter_tensor(half, whole, group=host), dist.all_gather_into_tensor(whole, half, group=host)),
        "pycoll all_reduce inside each host": lambda: dist.all_reduce(whole, group=host),
    }
    def timed_ms(fn):
        fn()  # warm-up
        t = torch.tensor([time_calls(fn, iters, False, lambda: dist.barrier(group=control))])
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=control)
        return t.item() / 1e3

    times = {name: [] for name in rows}
    for _ in range(reps):
        for name, fn in rows.items():  # interleaved, so a slow stretch of the machine hits every row
            times[name].append(timed_ms(fn))
    if rank == 0:
        print(f"{mib} MiB float32, 2 simulated hosts x 2 ranks, {os.cpu_count()} CPUs, ms per call:")
        for name, ts in times.items():
            print(f"  {name:50s} " + " ".join(f"{t:8.2f}" for t in ts))
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mib", type=int, default=8)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--iters", type=int, default=10)
    a = p.parse_args()
    mp.spawn(_rank, args=(29000 + os.getpid() % 1000, a.mib, a.reps, a.iters), nprocs=WORLD)


if __name__ == "__main__":
    main()
