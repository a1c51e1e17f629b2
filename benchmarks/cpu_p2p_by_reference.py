"""CPU point-to-point by reference against through the channel, in the same processes, rounds
alternated: the same receive buffer gets a message from a shared-memory tensor (share_memory_():
larger than the channel, it goes by reference, one copy, where the ranks have no CPU to spare;
elsewhere it streams too, decision 0020) and from a private one (streamed through the channel, two
copies), plus Gloo's send of the private one. --cpus N runs each rank on N CPUs (taskset-like).
  send      rank 0 sends to rank 1 (blocking send, blocking recv)
  sendrecv  both ranks send to each other at once (isend + irecv, then wait)
Per-call microseconds: for each round, the max over ranks of `--iters` calls' mean; the median and
range over rounds. The floor is one copy_ of the message into a private buffer on every rank.

    torchrun --nproc_per_node 2 benchmarks/cpu_p2p_by_reference.py [--sizes 8M,16M,64M --rounds 7
        --iters 5 --json FILE]
"""
import argparse
import datetime
import json
import os
import statistics
import subprocess
import time

import torch
import torch.distributed as dist

import pycollectives  # noqa: F401  (registers pycoll)
from pycollectives.bench.report import cpu_model


def git_commit():
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip() or None
    except OSError:
        return None


def parse_size(text):
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(text[:-1]) * units[text[-1].upper()] if text[-1].upper() in units else int(text)


def timed(fn, iters, group):
    dist.barrier(group=group)
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    dist.barrier(group=group)  # a send through the channel may return before its receive ends
    took = torch.tensor([(time.perf_counter() - t0) / iters * 1e6], dtype=torch.float64)
    dist.all_reduce(took, op=dist.ReduceOp.MAX, group=group)
    return took.item()


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="8M,16M,32M,64M")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--iters", type=int, default=5)
    p.add_argument("--json", help="also write the results here")
    p.add_argument("--cpus", type=int, default=0, help="run each rank on this many CPUs (0: all it has)")
    a = p.parse_args()
    if a.cpus:
        local = int(os.environ.get("LOCAL_RANK", "0"))
        cpus = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, cpus[local * a.cpus:(local + 1) * a.cpus] or cpus[:a.cpus])
    dist.init_process_group("pycoll", timeout=datetime.timedelta(seconds=300))
    rank, world = dist.get_rank(), dist.get_world_size()
    assert world == 2, "two ranks"
    gloo = dist.new_group(backend="gloo")
    peer = 1 - rank
    rows = []
    for nbytes in map(parse_size, a.sizes.split(",")):
        n = nbytes // 4
        private = torch.full((n,), float(rank + 1))
        shared = private.clone().share_memory_()
        dst = torch.empty(n)
        floor_src = torch.empty(n).fill_(1.0)

        def send(src, group=None):
            def go():
                if rank == 0:
                    dist.send(src, dst=1, group=group)
                else:
                    dist.recv(dst, src=0, group=group)
            return go

        def sendrecv(src, group=None):
            def go():
                works = [dist.isend(src, dst=peer, group=group), dist.irecv(dst, src=peer, group=group)]
                for w in works:
                    w.wait()
            return go

        variants = {
            "by reference": lambda op: op(shared),
            "channel": lambda op: op(private),
            "gloo": lambda op: op(private, gloo),
        }
        for op_name, op in (("send", send), ("sendrecv", sendrecv)):
            times = {v: [] for v in variants}
            times["floor"] = []
            for v, make in variants.items():  # warm-up: maps the file, faults the pages in
                timed(make(op), 1, None)
            for _ in range(a.rounds):
                for v, make in variants.items():
                    times[v].append(timed(make(op), a.iters, None if v != "gloo" else gloo))
                times["floor"].append(timed(lambda: dst.copy_(floor_src), a.iters, None))
            dst.zero_()
            sendrecv(shared)()  # the floor wrote dst last: check what arrives by reference
            assert torch.all(dst == float(peer + 1)).item(), f"received the wrong bytes at {nbytes}"
            row = {"op": op_name, "bytes": nbytes}
            for v, ts in times.items():
                row[v] = {"median_us": statistics.median(ts), "min_us": min(ts), "max_us": max(ts)}
            rows.append(row)
            if rank == 0:
                med = {v: row[v]["median_us"] for v in times}
                print(f"{op_name:9s} {nbytes >> 20:4d} MiB  by reference {med['by reference']:8.0f} us  "
                      f"channel {med['channel']:8.0f} us ({med['channel'] / med['by reference']:.2f}x)  "
                      f"gloo {med['gloo']:8.0f} us  floor {med['floor']:7.0f} us "
                      f"(of floor: {med['floor'] / med['by reference']:.2f} by reference, "
                      f"{med['floor'] / med['channel']:.2f} channel)", flush=True)
    if rank == 0 and a.json:
        out = {"what": "CPU point-to-point by reference against the channel (benchmarks/cpu_p2p_by_reference.py)",
               "date": datetime.date.today().isoformat(), "cpu": cpu_model(), "cpus": len(os.sched_getaffinity(0)),
               "torch": torch.__version__, "commit": git_commit(), "rounds": a.rounds, "iters": a.iters,
               "command": "torchrun --nproc_per_node 2 benchmarks/cpu_p2p_by_reference.py " + " ".join(
                   f"--{k} {v}" for k, v in (("sizes", a.sizes), ("rounds", a.rounds), ("iters", a.iters), ("cpus", a.cpus))),
               "rows": rows}
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
