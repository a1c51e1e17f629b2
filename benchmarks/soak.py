#!/usr/bin/env python3
"""Soak: a long random op sequence on pycoll, checked against Gloo, with
resource checks (issue 21, item 7).  ``make soak`` runs it with the defaults.

    python3 benchmarks/soak.py [--ops 100000] [--nproc 2] [--seed S] [--warmup 1000]

The ranks run the random mix of tests/test_fuzz.py (tests/fuzz/: every
op, dtype, reduce op, size 0..1 MiB, layouts, async waits in random order, four
interleaved groups), every op compared with Gloo unless --no-check.  It passes
only when
  * no op raised and no comparison failed;
  * after the warm-up (--warmup ops, every pending op waited), each rank's
    resident memory (VmRSS, after gc and malloc_trim) grew by less than
    --rss-growth (1%) by the end, and its open file descriptors
    (/proc/self/fd) and threads (/proc/self/task) did not grow;
  * once the ranks have exited, /dev/shm holds no file whose name starts with
    pycoll's prefix ("pycoll-", csrc/transport/shm/shm_transport.cpp) that
    appeared during the run and that no living process maps (segments of other
    jobs running at the same time are not counted; any with the prefix are
    listed under shm_all_after).
It prints one JSON summary on stdout and exits 1 on failure.
"""

import argparse
import glob
import importlib.util
import json
import os
import random
import re
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "tests"))
# The source tree when pycollectives is not installed (as tests/conftest.py does);
# the ranks inherit sys.path.
if importlib.util.find_spec("pycollectives") is None and REPO not in sys.path:
    sys.path.insert(0, REPO)

# glibc raises its mmap threshold (up to 32 MiB) each time a large mapped block is freed, after
# which tensors of 128 KiB to 1 MiB come from the heap, and the free gaps they leave stay resident
# after malloc_trim. Measured (2 ranks, 100,000 ops): with that default, VmRSS grew 1.1% / 2.1%
# while the heap in use grew 1.7 / 2.1 MB and the free heap kept by malloc 10 / 15 MB. A fixed
# threshold (the ranks are started after this line, and read it at exec) keeps the RSS criterion
# about what the processes hold, not about where glibc put it; --glibc-default-heap measures
# without it.
MALLOC_MMAP_THRESHOLD = "131072"
if "--glibc-default-heap" not in sys.argv:
    os.environ.setdefault("MALLOC_MMAP_THRESHOLD_", MALLOC_MMAP_THRESHOLD)

from fuzz import SHM_DIR, SHM_PREFIX, soak_rank  # noqa: E402
from ranks import RankError, run_ranks  # noqa: E402


def shm_names():
    return set(glob.glob(os.path.join(SHM_DIR, SHM_PREFIX + "*")))


def mapped_anywhere():
    """/dev/shm paths that some living process maps."""
    found = set()
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/maps") as f:
                for line in f:
                    i = line.find(SHM_DIR + "/")
                    if i >= 0:
                        found.add(line[i:].rstrip("\n").removesuffix(" (deleted)"))
        except OSError:
            pass
    return found


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ops", type=int, default=100_000, help="ops in the sequence (100000)")
    p.add_argument("--nproc", type=int, default=2, help="ranks (2)")
    p.add_argument("--seed", type=int, default=None, help="sequence seed (random, printed)")
    p.add_argument("--warmup", type=int, default=1000,
                   help="ops before the resource baseline is taken (1000)")
    p.add_argument("--rss-growth", type=float, default=0.01,
                   help="largest allowed RSS growth after the warm-up, as a fraction (0.01)")
    p.add_argument("--sample-every", type=int, default=5000,
                   help="RSS sample interval in ops (reported as rss_kb_max_sampled)")
    p.add_argument("--no-check", action="store_true",
                   help="do not compare with Gloo (pycoll alone: faster, fewer ops in between)")
    p.add_argument("--glibc-default-heap", action="store_true",
                   help="leave glibc's dynamic mmap threshold on in the ranks (see MALLOC_MMAP_THRESHOLD)")
    p.add_argument("--timeout", type=float, default=None,
                   help="seconds before the ranks count as hung (default: 60 + 0.1 s per op)")
    args = p.parse_args(argv)
    seed = args.seed if args.seed is not None else random.randrange(2**31)
    timeout = args.timeout or 60 + 0.1 * args.ops

    summary = {"ops": args.ops, "nproc": args.nproc, "seed": seed, "warmup": args.warmup,
               "checked_against_gloo": not args.no_check,
               "MALLOC_MMAP_THRESHOLD_": os.environ.get("MALLOC_MMAP_THRESHOLD_")}
    print(f"soak: {args.ops} ops on {args.nproc} ranks, seed {seed} ...", file=sys.stderr, flush=True)
    before = shm_names()
    t0 = time.monotonic()
    ok, problems, ranks = True, [], None
    try:
        ranks = run_ranks(args.nproc, soak_rank, seed, args.ops, args.warmup,
                          not args.no_check, args.sample_every, timeout=timeout)
    except RankError as e:
        ok = False
        problems.append(f"a rank failed: {str(e)[:4000]}")
    summary["seconds"] = round(time.monotonic() - t0, 1)

    if ranks is not None:
        summary["ranks"] = []
        for r, res in enumerate(ranks):
            growth = (res["rss_kb_end"] - res["rss_kb_start"]) / res["rss_kb_start"]
            row = {k: res[k] for k in (
                "rss_kb_start", "rss_kb_end", "rss_kb_max_sampled", "fds_start", "fds_end",
                "threads_start", "threads_end", "failures")}
            row["rss_growth_pct"] = round(100 * growth, 3)
            row["seconds"] = round(res["seconds"], 1)
            row["ops_per_s_after_warmup"] = round(
                (args.ops - args.warmup) / res["seconds_after_warmup"], 1) \
                if args.ops > args.warmup and res["seconds_after_warmup"] > 0 else None
            # Not criteria: what grew (anonymous, file-backed, shared memory -- pycoll's
            # workspace pages count as RssShmem once touched), and the second half's
            # growth, which tells a leak (still growing) from a long warm-up (flat).
            for when in ("start", "mid", "end"):
                if res[when]:
                    row[when] = {k: v for k, v in res[when].items() if k != "t"}
            if res["mid"]:
                row["rss_growth_pct_second_half"] = round(
                    100 * (res["rss_kb_end"] - res["mid"]["rss_kb"]) / res["mid"]["rss_kb"], 3)
            row["samples_ops_rss_anon_shmem_fds_threads"] = res["samples"]
            if res["first_failures"]:
                row["first_failures"] = res["first_failures"]
            summary["ranks"].append(row)
            if res["failures"]:
                problems.append(f"rank {r}: {res['failures']} failed comparisons")
            if args.ops > args.warmup and growth >= args.rss_growth:
                problems.append(f"rank {r}: RSS grew {100 * growth:.2f}% after the warm-up "
                                f"({res['rss_kb_start']} -> {res['rss_kb_end']} kB)")
            if res["fds_end"] > res["fds_start"]:
                problems.append(f"rank {r}: open fds grew {res['fds_start']} -> {res['fds_end']}")
            if res["threads_end"] > res["threads_start"]:
                problems.append(f"rank {r}: threads grew {res['threads_start']} -> "
                                f"{res['threads_end']}")
        summary["op_counts_rank0"] = dict(sorted(ranks[0]["counts"].items()))

    after = shm_names()
    leftovers = sorted((after - before) - mapped_anywhere())
    summary["shm_leftovers"] = leftovers
    summary["shm_all_after"] = sorted(after)
    if leftovers:
        problems.append(f"/dev/shm left behind: {leftovers}")
    ok = ok and not problems
    summary["problems"] = problems
    summary["ok"] = ok
    text = json.dumps(summary, indent=1)
    # Lists of numbers (the samples) on one line each.
    text = re.sub(r"\[\s*(-?\d+(?:,\s*-?\d+)*)\s*\]",
                  lambda m: "[" + ", ".join(m.group(1).split()).replace(",,", ",") + "]", text)
    print(text)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
