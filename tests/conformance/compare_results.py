"""Which tests changed outcome between two runs of torch's suite (run_shards.py --results).

    python tests/conformance/compare_results.py BEFORE.json AFTER.json

Prints, for each pair of outcomes (e.g. a skip reason -> ok), the tests that went that way, and
the counts of both runs. Used to tell which of the tests the suite skips for pycoll would pass if
enabled: BEFORE is the plain run, AFTER a run with PYCOLL_CONFORMANCE_AS=gloo (or nccl).
"""
import collections
import json
import sys


def kind(outcome):
    return "skipped" if outcome.startswith("skipped") else outcome


def main(before_path, after_path):
    with open(before_path) as f:
        before = json.load(f)
    with open(after_path) as f:
        after = json.load(f)
    for name, run in (("before", before), ("after", after)):
        print(f"{name}: {len(run)} tests,", dict(collections.Counter(kind(v) for v in run.values())))
    changes = collections.defaultdict(list)
    for test in sorted(set(before) | set(after)):
        was, now = before.get(test, "absent"), after.get(test, "absent")
        if was != now:
            changes[(was, kind(now))].append(test)
    for (was, now), tests in sorted(changes.items(), key=lambda kv: (kv[0][1], -len(kv[1]))):
        print(f"\n{len(tests)}: {was} -> {now}")
        for t in tests:
            print("   ", t)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
