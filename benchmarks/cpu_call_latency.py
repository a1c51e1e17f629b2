"""Per-call time of small CPU collectives, the three ways a program waits for one: for pycoll and
Gloo in the same processes, the best of 5 loops of back-to-back all_reduces, max over ranks, in
  blocking  dist.all_reduce(x)
  async     dist.all_reduce(x, async_op=True).wait()
  future    dist.all_reduce(x, async_op=True).get_future().wait()   (DDP's comm hooks wait so)
An async op runs on the group's engine thread; what it costs beyond the blocking call is the
hand-off between threads (docs/performance.md, "Per-call cost on CPU").

    torchrun --nproc_per_node 2 benchmarks/cpu_call_latency.py [--json FILE]
"""
import argparse
import datetime
import json
import os
import time

import torch
import torch.distributed as dist

import pycollectives  # noqa: F401  (registers "pycoll")

SIZES = (4, 4096, 1 << 20)
MODES = ("blocking", "async", "future")


def call(mode, x, group):
    if mode == "blocking":
        return lambda: dist.all_reduce(x, group=group)
    if mode == "async":
        return lambda: dist.all_reduce(x, group=group, async_op=True).wait()
    return lambda: dist.all_reduce(x, group=group, async_op=True).get_future().wait()


def timed(fn, calls, ctrl):
    """Microseconds per call: the best of 5 loops of `calls`, the max over ranks."""
    for _ in range(max(10, calls // 10)):
        fn()
    best = float("inf")
    for _ in range(5):
        dist.barrier(group=ctrl)
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - t0) / calls)
    t = torch.tensor([best * 1e6], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=ctrl)
    return t.item()


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", help="also write the rows here")
    a = p.parse_args()
    dist.init_process_group("pycoll", timeout=datetime.timedelta(seconds=120))
    gloo = dist.new_group(backend="gloo")
    ctrl = dist.new_group(backend="gloo")
    rows = []
    for nbytes in SIZES:
        x = torch.ones(max(1, nbytes // 4))
        calls = 1000 if nbytes < (256 << 10) else 200
        for mode in MODES:
            for name, group in (("pycoll", None), ("gloo", gloo)):
                rows.append(dict(bytes=nbytes, backend=name, mode=mode,
                                 us_per_call=round(timed(call(mode, x, group), calls if name == "pycoll" else calls // 5, ctrl), 2)))
    if dist.get_rank() == 0:
        print(f"{dist.get_world_size()} ranks, {os.cpu_count()} CPUs")
        print(f"{'bytes':>8} {'mode':>9} {'pycoll us':>10} {'gloo us':>9}")
        for i in range(0, len(rows), 2):
            pyc, glo = rows[i], rows[i + 1]
            print(f"{pyc['bytes']:>8} {pyc['mode']:>9} {pyc['us_per_call']:>10.2f} {glo['us_per_call']:>9.2f}")
        if a.json:
            with open(a.json, "w") as f:
                json.dump(dict(world_size=dist.get_world_size(), cpus=os.cpu_count(), torch=torch.__version__,
                               date=datetime.date.today().isoformat(), rows=rows), f, indent=1)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
