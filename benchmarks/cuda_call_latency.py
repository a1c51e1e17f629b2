"""Where the time of a small CUDA collective goes: per call, for pycoll and NCCL in the same
processes, the GPU time of back-to-back calls (events) and the host time per call, for
  sync    dist.all_reduce(x)                      (runs on the caller's stream)
  async   dist.all_reduce(x, async_op=True).wait() (comm stream + events)
  direct  the backend's allreduce() without the torch.distributed wrapper (pycoll)
  add_    x.add_(0.0), one plain kernel launch for scale
When host time ~ GPU time the call is host-bound; `pycoll-bench --graph` gives the kernel alone.

    torchrun --nproc_per_node 2 benchmarks/cuda_call_latency.py
"""
import datetime
import os
import time

import torch
import torch.distributed as dist

import pycollectives  # noqa: F401  (registers "pycoll")

ITERS = 400
SIZES = (8, 65536, 1 << 20)


def timed(fn, ctrl):
    """(GPU us per call, host us per call), each the max over ranks."""
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    dist.barrier(group=ctrl)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    h0 = time.perf_counter()
    start.record()
    for _ in range(ITERS):
        fn()
    end.record()
    h1 = time.perf_counter()
    end.synchronize()
    t = torch.tensor([start.elapsed_time(end) * 1e3 / ITERS, (h1 - h0) * 1e6 / ITERS], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=ctrl)
    return t.tolist()


def main():
    rank = int(os.environ["RANK"])
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    dist.init_process_group("pycoll", timeout=datetime.timedelta(seconds=60))
    nccl = dist.new_group(backend="nccl")
    ctrl = dist.new_group(backend="gloo")
    opts = dist.AllreduceOptions()
    opts.asyncOp = False
    rows = []
    for nbytes in SIZES:
        x = torch.ones(max(1, nbytes // 4), device="cuda")
        cases = [("pycoll", "direct", lambda: dist.group.WORLD.allreduce([x], opts).wait()),
                 ("-", "add_", lambda: x.add_(0.0))]
        for name, group in (("pycoll", None), ("nccl", nccl)):
            cases.append((name, "sync", lambda g=group: dist.all_reduce(x, group=g)))
            cases.append((name, "async", lambda g=group: dist.all_reduce(x, group=g, async_op=True).wait()))
        for backend, mode, fn in cases:
            rows.append((nbytes, backend, mode, *timed(fn, ctrl)))
    if rank == 0:
        print(f"{'bytes':>8} {'backend':>7} {'mode':>6} {'GPU us/call':>12} {'host us/call':>13}")
        for b, name, mode, gpu, host in rows:
            print(f"{b:>8} {name:>7} {mode:>6} {gpu:>12.2f} {host:>13.2f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
