"""A job that hangs on purpose, to try the flight recorder: rank 1 skips one all_reduce.

    torchrun --nproc-per-node 3 examples/find_a_hang.py --dumps /tmp/hang/rank_
    pycoll-trace analyze /tmp/hang
    pycoll-trace timeline /tmp/hang -o /tmp/hang.json     # open in ui.perfetto.dev

The other ranks wait in that all_reduce until the group's timeout (--timeout, seconds), raise, dump
their flight recorders and ask every rank of the group to dump too; rank 1, busy in Python, dumps
from pycollectives' background thread.
"""
import argparse
import datetime
import os
import time

import torch
import torch.distributed as dist

import pycollectives  # noqa: F401  (registers "pycoll")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dumps", default="/tmp/hang/rank_", help="dump file prefix (the rank is appended)")
    p.add_argument("--timeout", type=float, default=5.0, help="the group's timeout in seconds")
    p.add_argument("--skip", type=int, default=1, help="the rank that skips the all_reduce")
    args = p.parse_args()
    # torch's variable for the dump prefix; it must be set before the first op records.
    os.environ.setdefault("TORCH_FR_DUMP_TEMP_FILE", args.dumps)
    os.makedirs(os.path.dirname(os.environ["TORCH_FR_DUMP_TEMP_FILE"]) or ".", exist_ok=True)
    dist.init_process_group("pycoll", timeout=datetime.timedelta(seconds=args.timeout))
    rank = dist.get_rank()
    grads = torch.randn(1 << 16)
    for step in range(10):
        dist.all_reduce(grads)
        if step == 6 and rank == args.skip:
            time.sleep(args.timeout + 5)  # "busy in Python": this rank never calls the next all_reduce
            break
    else:
        return  # the other ranks raised in the all_reduce rank 1 skipped
    print(f"rank {rank}: skipped an all_reduce; the others have timed out", flush=True)


if __name__ == "__main__":
    try:
        main()
    except RuntimeError as e:
        print(f"rank {dist.get_rank()}: {str(e).splitlines()[0]}", flush=True)
        time.sleep(2)  # let the peers' dump requests be answered before the process exits
