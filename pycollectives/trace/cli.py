"""pycoll-trace: reads the flight-recorder dumps of a job.

  pycoll-trace analyze DIR              which rank is missing from which op, what differs (exit 1 if anything)
  pycoll-trace timeline DIR -o job.json one Chrome/Perfetto trace of the job
"""
import argparse
import sys

from .analyze import analyze
from .load import load_dumps
from .timeline import timeline


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        prog="pycoll-trace", description="Reads the flight-recorder dumps of a job (one file per rank).",
        epilog="docs/tracing.md says where dumps go and how to find the rank that hangs.")
    sub = p.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("analyze", help="match every group's ops across ranks and say what is wrong")
    a.add_argument("dir", help="folder holding the dumps (or one dump file)")
    t = sub.add_parser("timeline", help="write one Chrome trace-event file of the job")
    t.add_argument("dir", help="folder holding the dumps (or one dump file)")
    t.add_argument("-o", "--output", default="pycoll_timeline.json", help="where to write it (default: %(default)s)")
    args = p.parse_args(argv)

    try:
        dumps = load_dumps(args.dir)
    except FileNotFoundError as e:
        print(f"pycoll-trace: {e}", file=sys.stderr)
        return 2
    if not dumps:
        why = "".join(f"\n  {path}: {reason}" for path, reason in dumps.skipped[:10])
        print(f"pycoll-trace: no flight-recorder dump in {args.dir}{why}", file=sys.stderr)
        return 2
    if args.cmd == "analyze":
        report = analyze(dumps)
        print(report.text())
        return 0 if report.ok else 1
    trace = timeline(dumps, args.output)
    evs = trace["traceEvents"]
    slices = sum(1 for e in evs if e["ph"] == "X" and e.get("cat") == "op")
    open_ = sum(1 for e in evs if e["ph"] == "X" and e["name"].endswith("(not completed)"))
    print(f"wrote {args.output}: {len(dumps)} ranks, {slices} op slices ({open_} not completed); "
          f"open it in https://ui.perfetto.dev or chrome://tracing")
    return 0


if __name__ == "__main__":
    sys.exit(main())
