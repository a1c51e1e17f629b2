"""PyTorch's DistributedTest suite on pycoll in parallel shards (`make conformance SHARDS=4`).

The suite runs one test at a time, each in freshly spawned ranks: about 12 minutes on 2 cores for
CPU tensors, longer with PYCOLL_CONFORMANCE_GPU=1. Shards split the tests round-robin by name and
run at once, each with its own TEMP_DIR (the suite's barrier counts files there, so shards cannot
share one). Prints every shard's counts, their sum and the tests that did not pass; exits non-zero
if any failed or errored (expected failures are listed in torch_suite.py).

    python tests/conformance/run_shards.py --shards 4 [-k PATTERN ...]
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SUITE = os.path.join(HERE, "torch_suite.py")
CASE = "TestDistBackendWithSpawnPYCOLL"
# unittest's closing lines: "Ran 5 tests in 11.7s", then "OK (skipped=3)" or
# "FAILED (failures=1, errors=2, skipped=3, expected failures=1)"; failures are headed
# "FAIL: test_x (__main__....)" or "ERROR: test_x (...)".
RAN = re.compile(r"^Ran (\d+) tests? in ")
VERDICT = re.compile(r"^(OK|FAILED)(?: \((.*)\))?$")
FAILED = re.compile(r"^(FAIL|ERROR|UNEXPECTED SUCCESS): (test\w+)")
# Verbose lines: "test_x (__main__.Case.test_x) ... " starts a test; its outcome ends a later line
# (the ranks' own output comes in between).
STARTS = re.compile(r"^(test\w+) \(__main__\.")
OUTCOME = re.compile(r"""(?:^|\.\.\. )(ok|ERROR|FAIL|expected failure|unexpected success|skipped (?:'.*'|".*"))$""")


def outcomes(log_lines):
    """{test: outcome} from one shard's verbose log: ok, ERROR, FAIL, expected failure,
    unexpected success or "skipped '<reason>'" (repr quotes)."""
    found, current = {}, None
    for line in log_lines:
        line = line.rstrip("\n")
        if m := STARTS.match(line):
            current = m.group(1)
        if current and (m := OUTCOME.search(line)):
            found[current] = m.group(1)
            current = None
    return found


def test_names(patterns):
    """The suite's test names, as unittest would load them (the suite reads BACKEND at import)."""
    sys.path.insert(0, HERE)
    import unittest

    import torch_suite

    names = unittest.TestLoader().getTestCaseNames(torch_suite.TestDistBackendWithSpawnPYCOLL)
    if patterns:
        names = [n for n in names if any(p in n for p in patterns)]
    return list(names)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shards", type=int, default=4)
    ap.add_argument("-k", dest="patterns", action="append", default=[], help="substring of test names to run")
    ap.add_argument("--world-size", default="2")
    ap.add_argument("--logs", default=None, help="folder for the shards' logs (default: a temporary one)")
    ap.add_argument("--results", default=None, help="write {test: outcome} as JSON to this file")
    ap.add_argument("--gpu-sets", default=None,
                    help="CUDA_VISIBLE_DEVICES per shard, round-robin, ';'-separated (e.g. '0,1;2,3'), "
                         "so that shards on a 4-GPU machine do not all share two GPUs")
    args = ap.parse_args()

    env = dict(os.environ, BACKEND="pycoll", WORLD_SIZE=args.world_size)
    env.pop("CI", None)  # with CI set, torch's run_tests writes XML reports instead of its summary
    os.environ.update(env)
    os.environ.setdefault("TEMP_DIR", tempfile.mkdtemp(prefix="pycoll-conformance-list-"))  # read at import
    names = test_names(args.patterns)
    if not names:
        sys.exit("no test matches " + " ".join(args.patterns))
    logs = args.logs or tempfile.mkdtemp(prefix="pycoll-conformance-")
    os.makedirs(logs, exist_ok=True)
    shards = [names[i::args.shards] for i in range(args.shards) if names[i::args.shards]]
    gpu_sets = [g for g in (args.gpu_sets or "").split(";") if g]
    procs = []
    t0 = time.monotonic()
    for i, batch in enumerate(shards):
        temp = tempfile.mkdtemp(prefix=f"pycoll-conformance-{i}-")
        os.makedirs(os.path.join(temp, "barrier"))
        log = open(os.path.join(logs, f"shard-{i}.log"), "w")
        cmd = [sys.executable, SUITE, "-v"] + [f"{CASE}.{n}" for n in batch]
        shard_env = dict(env, TEMP_DIR=temp)
        if gpu_sets:
            shard_env["CUDA_VISIBLE_DEVICES"] = gpu_sets[i % len(gpu_sets)]
        procs.append((subprocess.Popen(cmd, env=shard_env, stdout=log, stderr=subprocess.STDOUT), log))
    for p, log in procs:
        p.wait()
        log.close()

    totals = {"ran": 0}
    not_passed, unfinished, per_test = [], [], {}
    for i in range(len(shards)):
        verdict = None
        with open(os.path.join(logs, f"shard-{i}.log"), errors="replace") as f:
            lines = f.readlines()
            per_test.update(outcomes(lines))
            for line in lines:
                line = line.strip()
                if m := RAN.match(line):
                    totals["ran"] += int(m.group(1))
                elif m := VERDICT.match(line):
                    verdict = m.group(1)
                    for part in filter(None, (m.group(2) or "").split(", ")):
                        key, value = part.rsplit("=", 1)
                        totals[key] = totals.get(key, 0) + int(value)
                elif m := FAILED.match(line):
                    not_passed.append(f"{m.group(2)}: {m.group(1)}")
        if verdict is None:
            unfinished.append(i)
    counted = ("failures", "errors", "skipped", "expected failures", "unexpected successes")
    totals["passed"] = totals["ran"] - sum(totals.get(k, 0) for k in counted)
    print(f"{len(names)} tests in {len(shards)} shards, {time.monotonic() - t0:.0f} s; logs in {logs}")
    print(", ".join(f"{k}: {v}" for k, v in totals.items()))
    for i in unfinished:
        print(f"shard {i} ended without unittest's summary (crashed or hung): see shard-{i}.log")
    for line in not_passed:
        print("  " + line)
    if args.results:
        with open(args.results, "w") as f:
            json.dump(dict(sorted(per_test.items())), f, indent=1)
    failed = bool(not_passed) or bool(unfinished) or any(p.returncode != 0 for p, _ in procs)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
