"""Point-to-point from a private tensor into a receive tensor in shared memory, 2 ranks on one
host: written by the sender straight into the receiver's file (csrc/cpu/p2p.h, "Into the
receiver's shared tensor") against the channel's two copies (PYCOLL_CPU_SHARED_TENSORS=off).
pycoll-bench cannot make only the receive buffers shared, hence this script.

  python benchmarks/cpu_p2p_into_receiver.py --out benchmarks/results --name NAME
      [--sizes-mib 16,64] [--budget-s 0.4]

Each size and kind (one-way send: rank 0 to rank 1; sendrecv: both at once) runs for about
budget-s after two warm-up calls, each call between barriers; the row is the median call time, the
slower rank's. Run it with and without PYCOLL_CPU_SHARED_TENSORS=off, alternated, for a
comparison. The JSON holds the card, the date, the command and the setting.
"""
import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def _rank(rank, ws, store_path, sizes_mib, budget_s, queue):
    import pycollectives  # noqa: F401  (registers "pycoll")
    from pycollectives import _C

    torch.set_num_threads(1)
    dist.init_process_group("pycoll", store=dist.FileStore(store_path, ws), rank=rank, world_size=ws)
    peer = 1 - rank
    rows = []
    for mib in sizes_mib:
        n = (mib << 20) // 4
        src = torch.randn(n)
        dst = torch.empty(n).share_memory_()
        for kind in ("send", "sendrecv"):
            def call():
                if kind == "send":
                    if rank == 0:
                        dist.send(src, dst=1)
                    else:
                        dist.recv(dst, src=0)
                else:
                    w = dist.isend(src, dst=peer)
                    dist.recv(dst, src=peer)
                    w.wait()

            times = []
            for i in range(2):  # warm-up; their time sizes the run, the same number of calls on both ranks
                dist.barrier()
                t0 = time.perf_counter()
                call()
                times.append(time.perf_counter() - t0)
            calls = torch.tensor([max(7, int(budget_s / max(times[-1], 1e-6)))])
            dist.broadcast(calls, src=0)
            times = []
            for _ in range(int(calls.item())):
                dist.barrier()
                t0 = time.perf_counter()
                call()
                times.append(time.perf_counter() - t0)
            rows.append({"op": kind, "bytes": mib << 20, "calls": len(times),
                         "time_us": statistics.median(times) * 1e6})
    queue.put((rank, rows, _C._test_p2p_into_receiver()))
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes-mib", default="16,64")
    p.add_argument("--budget-s", type=float, default=0.4)
    p.add_argument("--out", default=None)
    p.add_argument("--name", default="p2p-into-receiver")
    a = p.parse_args()
    sizes = [int(s) for s in a.sizes_mib.split(",")]
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    store = tempfile.mktemp(prefix="pycoll-p2p-into-")
    procs = [ctx.Process(target=_rank, args=(r, 2, store, sizes, a.budget_s, q)) for r in range(2)]
    for pr in procs:
        pr.start()
    got = {}
    for _ in procs:
        rank, rows, written = q.get()
        got[rank] = (rows, written)
    for pr in procs:
        pr.join()
    import pycollectives.settings

    setting = pycollectives.settings.read("PYCOLL_CPU_SHARED_TENSORS")
    rows = []
    for r0, r1 in zip(got[0][0], got[1][0]):
        rows.append({**r0, "time_us": max(r0["time_us"], r1["time_us"])})
        print(f"PYCOLL_CPU_SHARED_TENSORS={setting:3s} {r0['op']:8s} {r0['bytes'] >> 20:3d} MiB "
              f"{rows[-1]['time_us']:9.0f} us  ({r0['calls']} calls)")
    print(f"messages written into the receiver: rank 0 {got[0][1]}, rank 1 {got[1][1]}")
    if a.out:
        cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")),
                   platform.processor())
        doc = {"metadata": {"card": cpu, "device": "cpu", "nproc": len(os.sched_getaffinity(0)),
                            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                            "command": " ".join(["python"] + sys.argv), "PYCOLL_CPU_SHARED_TENSORS": setting,
                            "torch": torch.__version__},
               "results": rows, "written_into_receiver": [got[0][1], got[1][1]]}
        os.makedirs(a.out, exist_ok=True)
        path = os.path.join(a.out, f"{datetime.date.today().isoformat()}-{a.name}.json")
        with open(path, "w") as f:
            json.dump(doc, f, indent=1)
        print("wrote", path)


if __name__ == "__main__":
    main()
