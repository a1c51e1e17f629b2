"""A checked program in the form the CPU engine runs (csrc/cpu/schedule_program.h): per rank, per
lane, each step with the numbers of its channels and how many messages each carries per run; for a
receive, the sender's region too (its chunks' lengths bound what moves).

A channel is (sender, receiver, lane). Each rank numbers its outgoing channels by (receiver, lane)
and its incoming ones by (sender, lane); the engine keeps one counter per number in each rank's
control block and one slot ring per outgoing channel in its data region, so a rank has at most
`SCHEDULE_MAX_CHANNELS` of each.

`provide(name, collective, ranks)` is what the engine calls (through `_C.set_schedule_source`) the
first time an op runs a program forced by PYCOLL_ALGO or `set_algo`.
"""
from __future__ import annotations

from typing import Dict, Optional, Tuple

from . import collectives
from .errors import ScheduleError
from .ir import IR

_OPS = {"send": 0, "recv": 1, "recv_reduce": 2, "copy": 3, "reduce": 4}
RECV_REDUCE_SEND = 5  # a receive-reduce into R and the send of R after it, fused (see _forwards)
FUSED_AWAY = 6  # the send of such a pair: nothing left to do
_BUFFERS = {"in": 0, "out": 1, "scratch": 2}
_NO_REGION = (0, 0, 0)


def _region(r) -> Tuple[int, int, int]:
    return _NO_REGION if r is None else (_BUFFERS[r[0]], int(r[1]), int(r[2]))


def _cells(ir: IR, rank: int, region) -> set:
    """The chunks a region covers, as stored (in place, input and output alias)."""
    buf, first, count = region
    return {collectives.storage(ir.collective, ir.inplace, rank, buf, c, ir.chunks) for c in range(first, first + count)}


def _forwards(ir: IR, rank: int) -> set:
    """Lane steps (lane, i) of `rank` where a receive-reduce into R is followed by the send of R and
    R is dead after that send: on its lane nothing reads it before a receive or copy overwrites it,
    and it is not left as output. The engine then reduces the message and R straight into the
    send's slot (one pass instead of two, as the built-in ring does) and leaves R as it was. Only
    where nothing else depends on the pair: no deps on the send, no step of another lane waiting
    for the receive, no other lane touching R."""
    lanes = ir.steps[rank]
    waited = {(a, b) for lane in lanes for s in lane for a, b in s.deps}
    n_out = collectives.buffer_chunks(ir.collective, "out", ir.ranks, ir.chunks, ir.scratch)
    outputs = _cells(ir, rank, ("out", 0, n_out))
    touched = [set().union(*[_cells(ir, rank, r) for s in lane for r in (s.src, s.dst) if r]) for lane in lanes]
    out = set()
    for l, steps in enumerate(lanes):
        others = set().union(*[t for ol, t in enumerate(touched) if ol != l])
        for i in range(len(steps) - 1):
            a, b = steps[i], steps[i + 1]
            if a.op != "recv_reduce" or b.op != "send" or b.src != a.dst or b.deps or (l, i) in waited:
                continue
            pending = _cells(ir, rank, a.dst)
            if pending & others:
                continue
            for s in steps[i + 2:]:
                if not pending or any(_cells(ir, rank, r) & pending for r in s.reads()):
                    break
                if s.op in ("recv", "copy"):
                    pending = pending - _cells(ir, rank, s.dst)
            if not pending or not (pending & outputs or any(
                    _cells(ir, rank, r) & pending for s in steps[i + 2:] for r in s.reads())):
                out.add((l, i))
    return out


def engine_tables(ir: IR, max_channels: int = 128, max_lanes: int = 16, fuse: bool = True) -> tuple:
    """The tables of `ir` (checked already) as `_C.set_schedule_source`'s source returns them.
    `fuse`: receive-reduce-and-forward pairs become one step (see _forwards)."""
    N, L = ir.ranks, max(1, ir.lanes)
    if L > max_lanes:
        raise ScheduleError(f"{ir.name}: {L} lanes; the CPU engine runs at most {max_lanes}")
    messages: Dict[Tuple[int, int, int], int] = {}
    sent: Dict[Tuple[int, int, int, int], tuple] = {}  # (src, dst, lane, seq) -> the sender's region
    largest = 0
    for r, lanes in enumerate(ir.steps):
        for lane, steps in enumerate(lanes):
            for s in steps:
                if s.op == "send":
                    key = (r, s.peer, lane)
                    messages[key] = messages.get(key, 0) + 1
                    sent[(r, s.peer, lane, s.seq)] = s.src
                    largest = max(largest, s.src[2])
    out_no = [dict() for _ in range(N)]
    in_no = [dict() for _ in range(N)]
    for src, dst, lane in sorted(messages):
        out_no[src][(dst, lane)] = len(out_no[src])
        in_no[dst][(src, lane)] = len(in_no[dst])
    for r in range(N):
        for kind, table in (("outgoing", out_no[r]), ("incoming", in_no[r])):
            if len(table) > max_channels:
                raise ScheduleError(f"{ir.name}: rank {r} has {len(table)} {kind} channels (peer x lane); "
                                    f"the CPU engine has room for {max_channels}")
    def send_fields(r, lane, s):
        return (s.peer, s.seq, out_no[r][(s.peer, lane)], in_no[s.peer][(r, lane)], messages[(r, s.peer, lane)])

    ranks = []
    for r, lanes in enumerate(ir.steps):
        deps = []
        lane_rows = []
        fused = _forwards(ir, r) if fuse else set()
        for lane, steps in enumerate(lanes):
            rows = []
            skip = False
            for i, s in enumerate(steps):
                if skip:  # the send of a fused pair: done by the pair's row, kept so indices stay
                    skip = False
                    rows.append((FUSED_AWAY,) + (0,) * 18)
                    continue
                d0 = len(deps)
                deps.extend((int(a), int(b)) for a, b in s.deps)
                src, dst, peer, seq, ch, pch, count = _region(s.src), _region(s.dst), -1, 0, 0, 0, 0
                to = (-1, 0, 0, 0, 0)
                op = _OPS[s.op]
                if s.op == "send":
                    peer, seq, ch, pch, count = send_fields(r, lane, s)
                elif s.op in ("recv", "recv_reduce"):
                    peer, seq = s.peer, s.seq
                    ch, pch, count = in_no[r][(peer, lane)], out_no[peer][(r, lane)], messages[(peer, r, lane)]
                    src = _region(sent[(peer, r, lane, seq)])
                    if (lane, i) in fused:
                        op, skip = RECV_REDUCE_SEND, True
                        to = send_fields(r, lane, steps[i + 1])
                rows.append((op, *src, *dst, peer, seq, ch, pch, count, d0, len(deps), *to))
            lane_rows.append(rows)
        ranks.append((lane_rows, deps))
    root = -1 if ir.root is None else int(ir.root)
    return (ir.name, N, ir.chunks, ir.scratch, ir.channel_depth, L, bool(ir.inplace), root, ir.digest64(),
            largest, max(messages.values(), default=0), max((len(t) for t in out_no), default=0), ranks)


_kept: Dict[Tuple[str, str, int], Optional[tuple]] = {}


def provide(name: str, collective: str, ranks: int) -> Optional[tuple]:
    """The engine's source: the tables of program `name` for `ranks` ranks, or None where it is a
    program of another collective. Raises ScheduleError naming what is wrong."""
    from .. import _C
    from .registry import lookup

    key = (name, collective, ranks)
    if key not in _kept:
        ir = lookup(name, None, ranks)
        _kept[key] = None if ir.collective != collective else engine_tables(
            ir, _C.SCHEDULE_MAX_CHANNELS, _C.SCHEDULE_MAX_LANES)
    return _kept[key]


def forget() -> None:
    """Drops every table kept here and in the engine (a program was unregistered)."""
    from .. import _C

    _kept.clear()
    _C.forget_schedule_programs()
