"""make bench-compare BASE=<git ref>: did the working tree get slower than BASE?

Builds BASE beside the working tree (base_build.py), starts one rank pool on each build, and times
every regression case on both in one launch, interleaved: in every round each case is timed on
BASE, then on the working tree, then on BASE again, back to back.

Why three: on a shared 2-core machine the time of the same call moves by 2-4x between stretches of
a few seconds (seen here: 1 MiB all_reduce at 150 us, then 560 us, on both builds alike), so raw
times across rounds say little. Within one round the three timings see the same machine, so
  the working tree's ratio  W / sqrt(B1 * B2)   (its time against BASE's around it), and
  BASE's own ratio          B2 / B1             (BASE against itself, the same distance apart)
cancel that drift. A case is flagged when the median of the working tree's ratios exceeds 1 by more
than BASE's own spread across its rounds, taken as Tukey's fence of BASE's ratios (1.5 times their
interquartile range: the usual bound beyond which a value is not a sample's own variation), and by
at least --min-change (6%). Why these, measured (docs/regression-benchmarks.md has the numbers):
  - an interquartile range, not max - min: on the 2-core machine one timing in 24 stalls somewhere,
    and max - min of BASE against itself was then 5-30% where its interquartile range was 1.5-10%;
  - BASE's ratios, not its raw times: there the same call switches between two speeds 4x apart
    every few seconds, on both builds alike; raw times mix the two, the ratios cancel them;
  - the floor: on GPUs BASE agrees with itself to 0.1-0.9% at 16-256 MiB, tighter than two pools
    of one build agree with each other (up to 1%; up to 5% on 10-20 us host-bound calls), a
    per-process offset that no spread of one build can show. A change under 6% is below what one
    launch resolves.

    python benchmarks/regression/compare.py --base HEAD~3 [--rounds 8] [--cases 'all_reduce-*']
    python benchmarks/regression/compare.py --base HEAD --inject all_reduce   # must flag all_reduce
    python benchmarks/regression/compare.py --base-env PYCOLL_FR_BUFFER_SIZE=0   # one build, two settings

Settings mode: with --base-env NAME=VALUE (repeatable) and no --base, both sides run the working
tree's build, BASE with those variables set (and the working tree with --work-env ones): e.g. the
flight recorder off (BASE) against on (the working tree, its default).

--inject wraps the matching cases' call on the working-tree side with a delay of --inject-frac
(10%) of BASE's time per call, where the call spends it (rank_server.py): a self-test of the
method that touches no library code.
Exit status: 1 when a case is flagged (or a case fails), else 0.
"""
import argparse
import datetime
import fnmatch
import json
import math
import os
import platform
import shlex
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from base_build import prepare_base  # noqa: E402
from cases import build_cases, case_op  # noqa: E402
from harness import REPO_ROOT  # noqa: E402
from rank_pool import PoolError, RankPool  # noqa: E402


def parse_args(argv):
    p = argparse.ArgumentParser(prog="bench-compare", description=__doc__.split("\n\n")[0])
    p.add_argument("--base", default=None, help="git ref to compare the working tree with (default: the working "
                   "tree itself, with --base-env)")
    p.add_argument("--base-env", action="append", default=[], metavar="NAME=VALUE",
                   help="environment of BASE's ranks (repeatable); without --base, BASE is the working tree")
    p.add_argument("--work-env", action="append", default=[], metavar="NAME=VALUE",
                   help="environment of the working tree's ranks (repeatable)")
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--rounds", type=int, default=None,
                   help="rounds (default 24 on CPU, 8 on GPU); each times every case three times")
    p.add_argument("--round-ms", type=float, default=None,
                   help="target length of one timing (default 30 on CPU, 10 on GPU; at least 50 request "
                        "round trips)")
    p.add_argument("--cases", default=None, help="comma-separated fnmatch patterns of case names")
    p.add_argument("--inject", default="",
                   help="comma-separated ops (all_reduce, sendrecv, ddp, ...) or case-name patterns whose "
                        "working-tree call gets an injected delay")
    p.add_argument("--inject-frac", type=float, default=0.10, help="the injected delay, as a fraction of BASE's time")
    p.add_argument("--min-change", type=float, default=0.06,
                   help="never flag a change below this fraction (what one launch resolves; see above)")
    p.add_argument("--json", default=None, help="write every round's times here")
    p.add_argument("--no-fail", action="store_true", help="exit 0 even when cases are flagged")
    args = p.parse_args(argv)
    if args.base is None and not args.base_env:
        p.error("give --base REF, or --base-env NAME=VALUE to compare one build under two settings")
    args.base_env = _env_pairs(p, args.base_env)
    args.work_env = _env_pairs(p, args.work_env)
    return args


def _env_pairs(parser, items):
    out = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name:
            parser.error(f"expected NAME=VALUE, got {item!r}")
        out[name] = value
    return out


def _device(choice):
    if choice != "auto":
        return choice
    try:
        import torch
        return "cuda" if torch.cuda.is_available() and torch.cuda.device_count() >= 2 else "cpu"
    except Exception:
        return "cpu"


def _injected(case, patterns):
    return any(p == case_op(case) or fnmatch.fnmatch(case["name"], p) for p in patterns)


TUKEY_FENCE = 1.5


def _iqr(xs):
    q1, _, q3 = statistics.quantiles(xs, n=4, method="inclusive")
    return q3 - q1


def verdict(base_before, work, base_after, min_change=0.06):
    """(change, spread, flagged) from the rounds of one case (three timings per round, see above)."""
    work_ratio = [w / math.sqrt(b1 * b2) for b1, w, b2 in zip(base_before, work, base_after)]
    base_ratio = [b2 / b1 for b1, b2 in zip(base_before, base_after)]
    change = statistics.median(work_ratio) - 1.0
    spread = TUKEY_FENCE * _iqr(base_ratio)
    return change, spread, change > max(spread, min_change)


def _fmt_us(us):
    return f"{us:,.1f}" if us < 1e4 else f"{us:,.0f}"


def print_table(rows, out=sys.stdout):
    head = ("case", "calls", "BASE us", "work us", "change", "BASE spread", "")
    lines = [head]
    for r in rows:
        if r.get("error"):
            lines.append((r["name"], "", "", "", "", "", "ERROR"))
            continue
        lines.append((r["name"] + (" (+delay)" if r["delay_us"] else ""), str(r["calls"]), _fmt_us(r["base_median_us"]),
                      _fmt_us(r["work_median_us"]), f"{100 * r['change']:+.1f}%", f"{100 * r['spread']:.1f}%",
                      "SLOWER" if r["flagged"] else ""))
    widths = [max(len(line[i]) for line in lines) for i in range(len(head))]
    for i, line in enumerate(lines):
        print("  ".join(c.ljust(w) if j == 0 else c.rjust(w) for j, (c, w) in enumerate(zip(line, widths))), file=out)
        if i == 0:
            print("  ".join("-" * w for w in widths), file=out)


def run(args):
    device = _device(args.device)
    if args.base is None:
        base_tree, base_commit = REPO_ROOT, "working tree"
    else:
        base_tree, base_commit = prepare_base(args.base, log=lambda m: print(m, flush=True))
    base_label = args.base or "working tree"
    if args.base_env:
        base_label += " with " + " ".join(f"{k}={v}" for k, v in args.base_env.items())
    round_s = (args.round_ms or (10.0 if device == "cuda" else 30.0)) / 1e3
    if args.rounds is None:
        args.rounds = 8 if device == "cuda" else 24
    if args.rounds < 4:
        raise SystemExit("bench-compare: --rounds must be at least 4 (the spread is an interquartile range)")
    cases = build_cases(device, args.world, compare=True, pattern=args.cases)
    inject = [p.strip() for p in args.inject.split(",") if p.strip()]
    if not cases:
        raise SystemExit("bench-compare: no case matches --cases")
    t0 = time.monotonic()
    base = RankPool(args.world, device, base_tree, label=f"BASE {base_label}", env=args.base_env)
    try:
        work = RankPool(args.world, device, REPO_ROOT, label="working tree", env=args.work_env)
    except BaseException:
        base.close()
        raise
    rows = []
    try:
        live = []
        for case in cases:
            row = dict(name=case["name"], case=case, delay_us=0.0, error=None)
            rows.append(row)
            try:
                base.prepare(case)
                work.prepare(case)
                calls, _ = base.calls_per_round(case["name"], round_s)
                row["calls"] = calls
                # A first timed round on each side, discarded: warms both up to the same state.
                base_us = base.time(case["name"], calls)
                work.time(case["name"], calls)
                row["injected"] = _injected(case, inject)
                live.append(row)
            except PoolError as exc:
                row["error"] = str(exc).splitlines()[0][:300]
                if "exited" in str(exc) or "no answer" in str(exc):
                    raise
        print(f"bench-compare: {len(live)} cases, {args.rounds} rounds, {device}, {args.world} ranks "
              f"({base.card()})", flush=True)
        for row in live:
            row["base_us"], row["work_us"], row["base_after_us"] = [], [], []
        for r in range(args.rounds):
            for row in live:
                name, calls = row["name"], row["calls"]
                row["base_us"].append(base.time(name, calls))
                # An injected delay is a fraction of the op's time as BASE just measured it: some CPU
                # calls switch between two speeds 4x apart for seconds at a time, so a delay fixed
                # beforehand could be 40% of the op's time, or 2.5%.
                delay = args.inject_frac * row["base_us"][-1] if row["injected"] else 0.0
                row["work_us"].append(work.time(name, calls, delay))
                row["delay_us"] = max(row["delay_us"], delay)
                row["base_after_us"].append(base.time(name, calls))
            print(f"bench-compare: round {r + 1}/{args.rounds} done ({time.monotonic() - t0:.0f} s)", flush=True)
        card = base.card()
    finally:
        base.close()
        work.close()
    for row in rows:
        if row["error"]:
            continue
        row["base_median_us"] = statistics.median(row["base_us"] + row["base_after_us"])
        row["work_median_us"] = statistics.median(row["work_us"])
        row["change"], row["spread"], row["flagged"] = verdict(row["base_us"], row["work_us"], row["base_after_us"],
                                                               args.min_change)
    return dict(device=device, card=card, world=args.world, rounds=args.rounds, round_s=round_s,
                min_change=args.min_change,
                base=base_label, base_commit=base_commit, base_env=args.base_env, work_env=args.work_env,
                inject=inject, inject_frac=args.inject_frac,
                elapsed_s=time.monotonic() - t0, rows=rows)


def main(argv=None):
    args = parse_args(argv)
    result = run(args)
    result["date"] = datetime.date.today().isoformat()
    result["command"] = " ".join(shlex.quote(a) for a in [os.path.relpath(sys.argv[0], REPO_ROOT)] + sys.argv[1:])
    result["host"] = platform.node()
    result["work_commit"] = subprocess.run(["git", "describe", "--always", "--dirty"], cwd=REPO_ROOT,
                                           capture_output=True, text=True).stdout.strip()
    print()
    work_label = "working tree" + "".join(f" {k}={v}" for k, v in result["work_env"].items())
    print(f"BASE {result['base']} ({result['base_commit'][:12]}) vs {work_label} {result['work_commit']}, "
          f"{result['card']}, {result['world']} ranks, {result['rounds']} rounds, {result['elapsed_s']:.0f} s")
    print_table(result["rows"])
    flagged = [r["name"] for r in result["rows"] if r.get("flagged")]
    failed = [r["name"] for r in result["rows"] if r.get("error")]
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as fh:
            json.dump(result, fh, indent=1)
    print()
    if failed:
        print(f"bench-compare: {len(failed)} case(s) failed: {', '.join(failed)}")
    if flagged:
        print(f"bench-compare: SLOWER than BASE: {', '.join(flagged)}")
    else:
        print("bench-compare: no case is slower than BASE beyond BASE's own spread")
    return 1 if (flagged or failed) and not args.no_fail else 0


if __name__ == "__main__":
    sys.exit(main())
