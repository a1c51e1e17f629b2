"""Large CPU collectives on tensors from the shared CPU allocator, each buffer made once and used
by every call (as a training loop reuses its buckets), with a private copy_ and add_ of the same
size for scale: min and median of 5 loops of back-to-back calls, as rank 0 saw them. Unlike
pycoll-bench, whose rows each make fresh buffers and fill them, this keeps the peers' mappings
and caches warm, so two builds (PYTHONPATH) or settings compare on the op alone
(docs/performance.md, "Writing into peers' buffers").

    torchrun --nproc_per_node 2 benchmarks/cpu_shared_tensor_ops.py [--mib 1,4] [--ops ...]
"""
import argparse
import time
import warnings

import torch
import torch.distributed as dist

import pycollectives

OPS = ("all_reduce", "broadcast", "all_gather", "reduce_scatter", "copy", "add")


def timed(fn, iters, loops=5):
    for _ in range(20):
        fn()
    per_call = []
    for _ in range(loops):
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        per_call.append((time.perf_counter() - t0) / iters * 1e6)
    per_call.sort()
    return per_call[0], per_call[len(per_call) // 2]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mib", default="1,4", help="message sizes in MiB (the all_gather input per rank)")
    ap.add_argument("--ops", default=",".join(OPS))
    ap.add_argument("--iters", type=int, default=200)
    args = ap.parse_args()
    warnings.filterwarnings("ignore", category=FutureWarning)  # *_tensor names, deprecated in newer torch
    pycollectives.use_shared_cpu_memory()
    dist.init_process_group("pycoll")
    rank, world = dist.get_rank(), dist.get_world_size()
    ops = args.ops.split(",")
    if rank == 0:
        print(f"# pycollectives from {pycollectives.__file__}, {world} ranks", flush=True)
    for mib in (float(m) for m in args.mib.split(",")):
        count = int(mib * (1 << 18)) // world * world
        x = torch.ones(count)
        gathered = torch.empty(count * world)
        scattered = torch.empty(count // world)
        a, b = torch.ones(count), torch.empty(count)
        calls = {
            "all_reduce": lambda: dist.all_reduce(x),
            "broadcast": lambda: dist.broadcast(x, 0),
            "all_gather": lambda: dist.all_gather_into_tensor(gathered, x),
            "reduce_scatter": lambda: dist.reduce_scatter_tensor(scattered, x),
            "copy": lambda: b.copy_(a),
            "add": lambda: torch.add(a, a, out=b),
        }
        for op in ops:
            best, median = timed(calls[op], args.iters)
            if rank == 0:
                print(f"{op:15s} {mib:6g} MiB  min {best:8.1f} us  median {median:8.1f} us", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
