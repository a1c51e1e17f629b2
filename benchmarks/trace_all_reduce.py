# Timeline of an all_reduce kernel (two-shot, split or claimed split one-shot), on 2 GPUs:
#   PYCOLL_CUDA_TRACE=1 PYCOLL_ALGO=twoshot torchrun --nproc_per_node 2 benchmarks/trace_all_reduce.py OUTDIR 16,64
# For each size (MiB): 30 back-to-back eager calls, then the trace of the last one. Prints, per
# rank and CTA group (all CTAs; split: pushers, reducers), min/median/max over the CTAs of every
# stamped event in us from the earliest stamp of the kernel on that rank, the kernel's span and the
# eager time per call (the difference is the gap between back-to-back kernels). Writes the raw rows
# with each rank's absolute origin (%globaltimer, ns) to OUTDIR/trace-r<rank>.json.
# Events (cuda/kernels/trace.cuh): 0 start, 1 end; two-shot: 2, 3, ... after each acquire / execute;
# split: 2+2k / 3+2k per chunk.
import datetime
import json
import os
import sys

import torch
import torch.distributed as dist

rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
torch.cuda.set_device(rank)
import pycollectives  # noqa: E402,F401  (registers the backend)
import pycollectives.settings  # noqa: E402

dist.init_process_group("pycoll", timeout=datetime.timedelta(seconds=60))
pg = dist.group.WORLD._get_backend(torch.device("cuda"))
E = pycollectives._C.trace_events()
out = {}


def stats(xs):
    xs = sorted(xs)
    return f"{xs[0]:7.1f} {xs[len(xs) // 2]:7.1f} {xs[-1]:7.1f}" if xs else "-"


for mib in [int(m) for m in sys.argv[2].split(",")]:
    x = torch.ones((mib << 20) // 4, device="cuda")
    for _ in range(20):
        dist.all_reduce(x)
    torch.cuda.synchronize()
    dist.barrier()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(30):
        dist.all_reduce(x)
    e.record()
    e.synchronize()
    per_call = s.elapsed_time(e) * 1e3 / 30
    rows = pg.cuda_trace()
    ctas = [rows[c * E:(c + 1) * E] for c in range(len(rows) // E)]
    ctas = [r for r in ctas if r[0] != 0 and r[1] != 0]
    t0 = min(r[0] for r in ctas)
    span = (max(r[1] for r in ctas) - t0) / 1e3
    out[mib] = dict(per_call_us=per_call, t0_ns=t0, rows=[list(r) for r in ctas])
    lines = [f"rank {rank} {mib} MiB: per call {per_call:.1f} us, kernel span {span:.1f} us, {len(ctas)} CTAs"]
    groups = [("all", ctas)]
    if pycollectives.settings.read("PYCOLL_ALGO") == "oneshot" and len(ctas) % 2 == 0:
        groups = [("push", ctas[:len(ctas) // 2]), ("reduce", ctas[len(ctas) // 2:])]
    for name, g in groups:
        for ev in range(E - 1):
            xs = [(r[ev] - t0) / 1e3 for r in g if r[ev] != 0]
            if xs:
                lines.append(f"  {name:6s} ev{ev:2d} n={len(xs):3d} min/med/max {stats(xs)}")
    print("\n".join(lines), flush=True)
json.dump(out, open(os.path.join(sys.argv[1], f"trace-r{rank}.json"), "w"))
dist.destroy_process_group()
