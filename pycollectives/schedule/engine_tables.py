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

from .errors import ScheduleError
from .ir import IR

_OPS = {"send": 0, "recv": 1, "recv_reduce": 2, "copy": 3, "reduce": 4}
_BUFFERS = {"in": 0, "out": 1, "scratch": 2}
_NO_REGION = (0, 0, 0)


def _region(r) -> Tuple[int, int, int]:
    return _NO_REGION if r is None else (_BUFFERS[r[0]], int(r[1]), int(r[2]))


def engine_tables(ir: IR, max_channels: int = 128, max_lanes: int = 16) -> tuple:
    """The tables of `ir` (checked already) as `_C.set_schedule_source`'s source returns them."""
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
    ranks = []
    for r, lanes in enumerate(ir.steps):
        deps = []
        lane_rows = []
        for lane, steps in enumerate(lanes):
            rows = []
            for s in steps:
                d0 = len(deps)
                deps.extend((int(a), int(b)) for a, b in s.deps)
                src, dst, peer, seq, ch, pch, count = _region(s.src), _region(s.dst), -1, 0, 0, 0, 0
                if s.op == "send":
                    peer, seq = s.peer, s.seq
                    ch, pch, count = out_no[r][(peer, lane)], in_no[peer][(r, lane)], messages[(r, peer, lane)]
                elif s.op in ("recv", "recv_reduce"):
                    peer, seq = s.peer, s.seq
                    ch, pch, count = in_no[r][(peer, lane)], out_no[peer][(r, lane)], messages[(peer, r, lane)]
                    src = _region(sent[(peer, r, lane, seq)])
                rows.append((_OPS[s.op], *src, *dst, peer, seq, ch, pch, count, d0, len(deps)))
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
