"""The job timeline: every rank's dump as one Chrome trace-event file (chrome://tracing,
ui.perfetto.dev). A process per rank, a track per thread, a slice per op; times are the dumps'
wall-clock nanoseconds, shown relative to the earliest time of any rank."""
from __future__ import annotations

import json

from .load import (Dumps, group_desc, group_name, is_p2p, load_dumps, op_name, parse_ranks, peer_of, state,
                   tensor_bytes)

__all__ = ["timeline"]

NOT_COMPLETED = " (not completed)"
NOT_STARTED = " (not started)"


class _Track:
    def __init__(self, name: str, tid: int):
        self.name = name
        self.tid = tid
        self.open_ends = []  # ends (ns) of the slices that contain the next start

    def fits(self, start: int, end: int) -> bool:
        """Places [start, end] here if it nests; slices arrive in order of start."""
        while self.open_ends and self.open_ends[-1] <= start:
            self.open_ends.pop()
        if self.open_ends and end > self.open_ends[-1]:
            return False
        self.open_ends.append(end)
        return True


class _Tracks:
    """A rank's tracks: one per thread name, plus "name #2", ... for slices that overlap without
    nesting, and "name cta N" for a kernel's CTA phases that do not fit under their op."""

    def __init__(self):
        self.by_name = {}
        self.families = {}

    def get(self, name: str) -> _Track:
        t = self.by_name.get(name)
        if t is None:
            t = self.by_name[name] = _Track(name, len(self.by_name) + 1)
        return t

    def place(self, family: str, start: int, end: int, first=None) -> _Track:
        if first is not None and first.fits(start, end):
            return first
        k = 1
        while True:
            t = self.get(family if k == 1 else f"{family} #{k}")
            if t.fits(start, end):
                return t
            k += 1


def _us(ns: int, t0: int) -> float:
    return round((ns - t0) / 1000.0, 3)


def _seq(e) -> int:
    return (e.get("p2p_seq_id") if is_p2p(e) else e.get("collective_seq_id")) or 0


def _times(e, dump_ns):
    """(start, end, completed) in ns, or None for an op that never started."""
    created = e.get("time_created_ns")
    started = e.get("time_discovered_started_ns")
    done = e.get("time_discovered_completed_ns")
    st = state(e)
    if st == "scheduled" and not done:
        return None
    start = started if isinstance(started, int) and started > 0 else created
    if not isinstance(start, int):
        return None
    if st == "completed" and isinstance(done, int) and done > 0:
        return start, max(done, start), True
    end = dump_ns if isinstance(dump_ns, int) else start
    return start, max(end, start), False


def timeline(dumps, out: str | None = None) -> dict:
    """The trace of a job (a folder, or what load_dumps returned); written to `out` when given."""
    if not isinstance(dumps, Dumps):
        dumps = load_dumps(dumps)
    # Earliest time of any rank: what ts 0 is.
    t0 = None
    for d in dumps:
        for e in d.entries:
            for key in ("time_created_ns", "time_discovered_started_ns"):
                v = e.get(key)
                if isinstance(v, int) and v > 0:
                    t0 = v if t0 is None else min(t0, v)
            for ph in e.get("cta_phases") or []:
                v = ph.get("start_ns")
                if isinstance(v, int) and v > 0:
                    t0 = v if t0 is None else min(t0, v)
    if t0 is None:
        t0 = min([d.dump_time_ns for d in dumps if d.dump_time_ns] or [0])

    meta, events = [], []
    for d in dumps:
        pid = d.rank
        host = " ".join(str(x) for x in (d.hostname, d.pid) if x not in ("", None))
        meta.append({"ph": "M", "name": "process_name", "ts": 0, "pid": pid, "tid": 0,
                     "args": {"name": f"rank {d.rank} ({host})" if host else f"rank {d.rank}"}})
        meta.append({"ph": "M", "name": "process_sort_index", "ts": 0, "pid": pid, "tid": 0,
                     "args": {"sort_index": d.rank}})
        members = {}
        for cfg in d.pg_config.values():
            members[str((cfg or {}).get("name"))] = parse_ranks((cfg or {}).get("ranks"))
        items = []
        for e in d.entries:
            thread = str(e.get("thread_name") or "") or f"thread {e.get('thread_id', '?')}"
            times = _times(e, d.dump_time_ns)
            if times is None:
                created = e.get("time_created_ns")
                if isinstance(created, int):
                    items.append((created, created, 2, e, thread, None))
                continue
            start, end, done = times
            items.append((start, end, 0, e, thread, done))
            for ph in e.get("cta_phases") or []:
                s, t = ph.get("start_ns"), ph.get("end_ns")
                if not isinstance(s, int) or not isinstance(t, int):
                    continue
                s, t = max(s, start), min(t, end)  # a child lies within its op
                if t >= s:
                    items.append((s, t, 1, (e, ph), thread, None))
        items.sort(key=lambda x: (x[0], -x[1], x[2]))
        tracks = _Tracks()
        op_track = {}
        for start, end, kind, obj, thread, done in items:
            if kind == 2:  # never started: an instant on the thread's first track
                e = obj
                t = tracks.get(thread)
                events.append({"ph": "i", "s": "t", "name": _name(e) + NOT_STARTED, "cat": "op", "ts": _us(start, t0),
                               "pid": pid, "tid": t.tid, "args": _args(e, members)})
                continue
            if kind == 0:
                e = obj
                t = tracks.place(thread, start, end)
                op_track[id(e)] = t
                ev = {"ph": "X", "name": _name(e) + ("" if done else NOT_COMPLETED), "cat": "op",
                      "ts": _us(start, t0), "dur": round((end - start) / 1000.0, 3), "pid": pid, "tid": t.tid,
                      "args": _args(e, members)}
                if not done:
                    ev["args"]["shown_until"] = "dump time"
                events.append(ev)
            else:
                e, ph = obj
                cta = ph.get("cta", 0)
                t = tracks.place(f"{thread} cta {cta}", start, end, first=op_track.get(id(e)))
                events.append({"ph": "X", "name": str(ph.get("name") or "phase"), "cat": "cta", "ts": _us(start, t0),
                               "dur": round((end - start) / 1000.0, 3), "pid": pid, "tid": t.tid,
                               "args": {"cta": cta, "op": op_name(e), "seq": _seq(e), "group": _group(e)}})
        for t in tracks.by_name.values():
            meta.append({"ph": "M", "name": "thread_name", "ts": 0, "pid": pid, "tid": t.tid, "args": {"name": t.name}})
            meta.append({"ph": "M", "name": "thread_sort_index", "ts": 0, "pid": pid, "tid": t.tid,
                         "args": {"sort_index": t.tid}})
    events.sort(key=lambda ev: (ev["ts"], -ev.get("dur", 0), ev["pid"], ev["tid"]))
    trace = {"traceEvents": meta + events, "displayTimeUnit": "ns",
             "otherData": {"source": "pycoll-trace timeline", "t0_ns": t0, "dumps": dumps.where}}
    if out:
        with open(out, "w") as f:
            json.dump(trace, f)
    return trace


def _group(e) -> str:
    desc = group_desc(e)
    return f"{group_name(e)} ({desc})" if desc else group_name(e)


def _name(e) -> str:
    op = op_name(e)
    if op in ("send", "recv"):
        peer = peer_of(e)
        if peer >= 0:
            return f"send -> {peer}" if op == "send" else f"recv <- {peer}"
    return op


def _args(e, members) -> dict:
    ins = tensor_bytes(e.get("input_sizes"), e.get("input_dtypes"))
    outs = tensor_bytes(e.get("output_sizes"), e.get("output_dtypes"))
    nbytes = None if ins is None and outs is None else max(ins or 0, outs or 0)
    dtypes = []
    for dt in list(e.get("input_dtypes") or []) + list(e.get("output_dtypes") or []):
        if dt not in dtypes:
            dtypes.append(dt)
    args = {
        "op": op_name(e),
        "group": _group(e),
        "seq": _seq(e),
        "bytes": nbytes,
        "dtype": ", ".join(dtypes),
        "algorithm": e.get("algorithm") or "",
        "plan": e.get("plan") or "",
        "state": state(e),
        "engine": e.get("engine") or "",
        "input_sizes": e.get("input_sizes"),
        "output_sizes": e.get("output_sizes"),
        "record_id": e.get("record_id"),
    }
    if is_p2p(e):
        args["peer"] = peer_of(e, members.get(group_name(e)))
    if e.get("error"):
        args["error"] = e["error"]
    return args
