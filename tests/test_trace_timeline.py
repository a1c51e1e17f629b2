"""pycoll-trace timeline on synthetic dumps (tests/trace_dumps.py): the trace-event format rules
(ph, ts, pid, tid on every event, dur on complete events, ordered, slices nesting per track) and
ranks lined up on one clock."""
import json

from trace_dumps import T0, Job

from pycollectives.trace import timeline
from pycollectives.trace.cli import main


def check_format(trace):
    """The rules every trace must follow; returns the X events."""
    assert set(trace) >= {"traceEvents", "displayTimeUnit"} and trace["displayTimeUnit"] == "ns"
    evs = trace["traceEvents"]
    for ev in evs:
        for key in ("ph", "ts", "pid", "tid"):
            assert key in ev, (key, ev)
        if ev["ph"] == "X":
            assert isinstance(ev["dur"], (int, float)) and ev["dur"] >= 0, ev
    ts = [ev["ts"] for ev in evs]
    assert ts == sorted(ts)
    xs = [ev for ev in evs if ev["ph"] == "X"]
    tracks = {}
    for ev in xs:
        tracks.setdefault((ev["pid"], ev["tid"]), []).append(ev)
    for key, slices in tracks.items():
        open_ends = []
        for ev in sorted(slices, key=lambda e: (e["ts"], -e["dur"])):
            end = ev["ts"] + ev["dur"]
            while open_ends and open_ends[-1] <= ev["ts"] + 1e-6:
                open_ends.pop()
            assert not open_ends or end <= open_ends[-1] + 1e-6, f"{ev} overlaps without nesting on {key}"
            open_ends.append(end)
    return xs


def names(trace, what):
    """{(pid, tid): name} of the thread_name (or {pid: name} of process_name) metadata."""
    out = {}
    for ev in trace["traceEvents"]:
        if ev["ph"] == "M" and ev["name"] == what:
            out[(ev["pid"], ev["tid"]) if what == "thread_name" else ev["pid"]] = ev["args"]["name"]
    return out


def test_clean_job_format_and_alignment(tmp_path):
    job = Job()
    for _ in range(3):
        job.coll("all_reduce", sizes=[(1024,)])
    job.coll("all_gather", sizes=[(256,)], out_sizes=[(768,)], dtypes=["Half"])
    job.write(tmp_path)
    trace = timeline(tmp_path)
    xs = check_format(trace)
    assert len(xs) == 12
    assert names(trace, "process_name") == {0: "rank 0 (h 4000)", 1: "rank 1 (h 4001)", 2: "rank 2 (h 4002)"}
    assert set(names(trace, "thread_name").values()) == {"pycoll-exec"}
    # rank r's clock starts r us later; every op on it starts at the same offset from its first
    first = {ev["pid"]: ev for ev in xs if ev["args"]["seq"] == 1}
    created = {r: job.entries[r][0]["time_discovered_started_ns"] for r in range(3)}
    t0 = min(e["time_created_ns"] for es in job.entries.values() for e in es)
    assert t0 == T0 + 10_000
    for r in range(3):
        assert first[r]["ts"] == round((created[r] - t0) / 1000, 3)
    assert first[1]["ts"] - first[0]["ts"] == 1.0 and first[2]["ts"] - first[0]["ts"] == 2.0
    ag = [ev for ev in xs if ev["name"] == "all_gather" and ev["pid"] == 0][0]
    assert ag["dur"] == 50.0
    assert {k: ag["args"][k] for k in ("op", "group", "seq", "bytes", "dtype", "algorithm", "plan", "state")} == {
        "op": "all_gather", "group": "0 (default_pg)", "seq": 4, "bytes": 768 * 2, "dtype": "Half",
        "algorithm": "ring", "plan": "", "state": "completed"}


def test_not_completed_not_started_and_p2p(tmp_path):
    job = Job(world=2)
    job.coll("all_reduce")
    job.op(0, "send", peer=1)
    job.op(1, "recv", peer=0)
    job.op(0, "all_reduce", state="started")
    job.op(1, "all_reduce", state="scheduled")
    job.dump_time = {0: T0 + 10_000_000, 1: T0 + 10_000_000}
    job.write(tmp_path)
    trace = timeline(tmp_path)
    xs = check_format(trace)
    hung = [ev for ev in xs if ev["name"] == "all_reduce (not completed)"]
    assert len(hung) == 1 and hung[0]["pid"] == 0 and hung[0]["args"]["state"] == "started"
    start = job.entries[0][-1]["time_discovered_started_ns"]
    t0 = job.entries[0][0]["time_created_ns"]
    assert hung[0]["ts"] == round((start - t0) / 1000, 3)
    assert hung[0]["dur"] == round((T0 + 10_000_000 - start) / 1000, 3)  # to the dump time
    inst = [ev for ev in trace["traceEvents"] if ev["ph"] == "i"]
    assert [(ev["pid"], ev["name"]) for ev in inst] == [(1, "all_reduce (not started)")]
    assert {(ev["pid"], ev["name"], ev["args"]["peer"]) for ev in xs if ev["args"]["op"] in ("send", "recv")} == {
        (0, "send -> 1", 1), (1, "recv <- 0", 0)}


def test_overlapping_async_ops_get_their_own_track(tmp_path):
    job = Job(world=1)
    a = job.op(0, "all_reduce", start=T0, dur_ns=100_000)
    job.op(0, "all_reduce", start=T0 + 50_000, dur_ns=100_000)  # overlaps a, not inside it
    job.op(0, "barrier", start=T0 + 10_000, dur_ns=5_000, sizes=[], dtypes=[])  # inside a: nests
    job.op(0, "broadcast", start=T0 + 20_000, dur_ns=1_000, thread="pycoll-cuda")
    job.write(tmp_path)
    trace = timeline(tmp_path)
    xs = check_format(trace)
    tn = names(trace, "thread_name")
    where = {(ev["args"]["seq"], ev["name"]): tn[(ev["pid"], ev["tid"])] for ev in xs}
    assert where == {(1, "all_reduce"): "pycoll-exec", (3, "barrier"): "pycoll-exec",
                     (2, "all_reduce"): "pycoll-exec #2", (4, "broadcast"): "pycoll-cuda"}
    assert a["time_created_ns"] == T0


def test_cta_phases_are_child_slices(tmp_path):
    job = Job(world=1)
    e = job.op(0, "all_reduce", start=T0, dur_ns=100_000)
    s = e["time_discovered_started_ns"]
    e["cta_phases"] = [
        {"name": "reduce", "start_ns": s + 1_000, "end_ns": s + 40_000, "cta": 0},
        {"name": "broadcast", "start_ns": s + 40_000, "end_ns": s + 90_000, "cta": 0},
        {"name": "reduce", "start_ns": s + 2_000, "end_ns": s + 45_000, "cta": 1},  # beside CTA 0's
        {"name": "late", "start_ns": s + 95_000, "end_ns": s + 500_000, "cta": 0},  # cut at the op's end
    ]
    job.write(tmp_path)
    trace = timeline(tmp_path)
    xs = check_format(trace)
    tn = names(trace, "thread_name")
    op = [ev for ev in xs if ev["cat"] == "op"][0]
    phases = sorted(((tn[(ev["pid"], ev["tid"])], ev["name"], ev["args"]["cta"]) for ev in xs if ev["cat"] == "cta"))
    assert phases == [("pycoll-exec", "broadcast", 0), ("pycoll-exec", "late", 0), ("pycoll-exec", "reduce", 0),
                      ("pycoll-exec cta 1", "reduce", 1)]
    for ev in xs:
        if ev["cat"] == "cta":
            assert op["ts"] <= ev["ts"] and ev["ts"] + ev["dur"] <= op["ts"] + op["dur"] + 1e-6
            assert ev["args"]["op"] == "all_reduce" and ev["args"]["seq"] == 1


def test_cli_writes_the_file(tmp_path, capsys):
    job = Job()
    job.coll("all_reduce")
    job.coll("all_reduce", skip=[1], state="started")
    job.write(tmp_path / "dumps")
    out = tmp_path / "job.json"
    assert main(["timeline", str(tmp_path / "dumps"), "-o", str(out)]) == 0
    assert capsys.readouterr().out.startswith(f"wrote {out}: 3 ranks, 5 op slices (2 not completed)")
    trace = json.load(open(out))
    xs = check_format(trace)
    assert sorted((ev["pid"], ev["name"]) for ev in xs if ev["args"]["seq"] == 2) == [
        (0, "all_reduce (not completed)"), (2, "all_reduce (not completed)")]
