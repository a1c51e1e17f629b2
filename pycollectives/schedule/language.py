"""The schedule language: a program builds the schedule of one collective over N ranks and C
chunks per rank, as copies and reductions of chunks of each rank's input, output and scratch
buffers, and lowers to the per-rank, per-lane step lists of `ir.IR`.

    p = Program("ring", "all_reduce", ranks=n, chunks=n, inplace=True)
    p.reduce(p.input(0, 1), p.input(1, 1))   # rank 1's input chunk 1 += rank 0's input chunk 1

A copy or reduction between two ranks lowers to a send on the source rank and a receive on the
destination rank, both on the step's lane; one inside a rank to a local step. Steps run in the
order they were written: on each rank the lowering adds, between steps on different lanes, the
dependencies that keep every read after the write it needs and every write after the reads and
writes before it (`order="program"`). With `order="lanes"` it adds none: each lane is ordered,
other lanes only through `after=` and messages, and the checker finds what is left unordered.

Pipelining is written once: `with p.pipelined(4):` runs the steps of its body once per piece
(a quarter of every chunk), piece after piece, so that piece 1 of a step can travel while piece 0
of the next one does; `pieces=` on a single step cuts that step alone. Steps on disjoint pieces
commute, so this is the same computation as the body written once on whole chunks.

`send` and `recv` write the two halves of a transfer separately, for schedules whose message
order is their own (they are matched per channel, in order).
"""
from __future__ import annotations

import contextlib
import gc
import math
from typing import Dict, List, Optional, Sequence, Tuple

from . import collectives
from .errors import ScheduleError
from .ir import IR, Step


class Ref:
    """`count` chunks from `start` of a buffer ("in", "out" or "scratch") of one rank."""
    __slots__ = ("rank", "buffer", "start", "count")

    def __init__(self, rank: int, buffer: str, start: int, count: int = 1):
        if buffer not in collectives.BUFFERS:
            raise ScheduleError(f"unknown buffer {buffer!r}: expected one of {', '.join(collectives.BUFFERS)}")
        self.rank, self.buffer, self.start, self.count = int(rank), buffer, int(start), int(count)

    def __repr__(self):
        return f"Ref(rank={self.rank}, {self.buffer!r}, {self.start}, {self.count})"


class Handle:
    """What a step returns: pass it to `after=` of a later step on the same rank."""
    __slots__ = ("index",)

    def __init__(self, index: int):
        self.index = index


class _Op:
    __slots__ = ("kind", "src", "dst", "peer", "lane", "pieces", "after", "block", "index")

    def __init__(self, kind, src, dst, peer, lane, pieces, after, block, index):
        self.kind, self.src, self.dst, self.peer, self.lane = kind, src, dst, peer, lane
        self.pieces, self.after, self.block, self.index = pieces, after, block, index


class Program:
    """The builder of one collective's schedule (see the module's docstring)."""

    def __init__(self, name: str, collective: str, ranks: int, chunks: int = 1, *, root: Optional[int] = None,
                 inplace: bool = False, scratch: int = 0, channel_depth: int = 2, order: str = "program"):
        collectives.validate(collective, ranks, root, inplace)
        if chunks < 1:
            raise ScheduleError(f"a program needs at least one chunk per rank, not {chunks}")
        if order not in ("program", "lanes"):
            raise ScheduleError(f"order is 'program' or 'lanes', not {order!r}")
        if channel_depth < 1:
            raise ScheduleError(f"channel_depth is at least 1, not {channel_depth}")
        self.name, self.collective, self.ranks, self.chunks = name, collective, ranks, chunks
        self.root, self.inplace, self.scratch_chunks = root, inplace, scratch
        self.channel_depth, self.order = channel_depth, order
        self._ops: List[_Op] = []
        self._block = None  # (id, pieces) while inside pipelined()
        self._blocks = 0
        self._ir: Optional[IR] = None

    # Regions -----------------------------------------------------------------------------------
    def input(self, rank: int, chunk: int = 0, count: int = 1) -> Ref:
        return Ref(rank, "in", chunk, count)

    def output(self, rank: int, chunk: int = 0, count: int = 1) -> Ref:
        return Ref(rank, "out", chunk, count)

    def scratch(self, rank: int, chunk: int = 0, count: int = 1) -> Ref:
        return Ref(rank, "scratch", chunk, count)

    # Steps -------------------------------------------------------------------------------------
    def copy(self, src: Ref, dst: Ref, *, lane: int = 0, pieces: int = 1, after: Sequence[Handle] = ()) -> Handle:
        """dst = src (between ranks: a send and a receive)."""
        return self._add("copy", src, dst, None, lane, pieces, after)

    def reduce(self, src: Ref, dst: Ref, *, lane: int = 0, pieces: int = 1, after: Sequence[Handle] = ()) -> Handle:
        """dst = dst op src (between ranks: a send and a receive that reduces)."""
        return self._add("reduce", src, dst, None, lane, pieces, after)

    def send(self, src: Ref, to: int, *, lane: int = 0, after: Sequence[Handle] = ()) -> Handle:
        """The sending half alone: src.rank sends src to rank `to` (matched in order by a recv)."""
        return self._add("send", src, None, int(to), lane, 1, after)

    def recv(self, dst: Ref, frm: int, *, reduce: bool = False, lane: int = 0,
             after: Sequence[Handle] = ()) -> Handle:
        """The receiving half alone: dst.rank receives the next message from rank `frm`."""
        return self._add("recv_reduce" if reduce else "recv", None, dst, int(frm), lane, 1, after)

    @contextlib.contextmanager
    def pipelined(self, pieces: int):
        """Runs the body's steps once per piece of every chunk, piece after piece."""
        if self._block is not None:
            raise ScheduleError("pipelined() blocks do not nest")
        if pieces < 1:
            raise ScheduleError(f"pieces is at least 1, not {pieces}")
        self._blocks += 1
        self._block = (self._blocks, int(pieces))
        try:
            yield self
        finally:
            self._block = None

    def _add(self, kind, src, dst, peer, lane, pieces, after) -> Handle:
        if self._block is not None and pieces != 1:
            raise ScheduleError("pieces= inside pipelined(): the block already cuts its steps into pieces")
        if pieces < 1 or lane < 0:
            raise ScheduleError(f"pieces >= 1 and lane >= 0, not pieces={pieces}, lane={lane}")
        if src is not None and dst is not None and src.count != dst.count:
            raise ScheduleError(f"{kind} of {src.count} chunks into {dst.count} chunks: {src!r} -> {dst!r}")
        for h in after:
            if not isinstance(h, Handle) or not 0 <= h.index < len(self._ops):
                raise ScheduleError(f"after= takes handles of earlier steps, not {h!r}")
        block = self._block[0] if self._block else None
        if self._block:
            pieces = self._block[1]
        self._ops.append(_Op(kind, src, dst, peer, int(lane), int(pieces), tuple(h.index for h in after),
                             block, len(self._ops)))
        self._ir = None
        return Handle(len(self._ops) - 1)

    # Lowering ----------------------------------------------------------------------------------
    def lower(self) -> IR:
        """The IR (cached until the next step is added)."""
        if self._ir is None:
            with _no_gc():
                self._ir = _Lowering(self).run()
        return self._ir


@contextlib.contextmanager
def _no_gc():
    """Millions of small tuples and no cycles among them: the cyclic collector only costs time."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


class _Lowering:
    """Emits the steps in program order, each with its predecessors: on its rank the steps whose
    regions it must follow (order="program"), the previous message of its channel, its send (a
    receive), receive k - channel_depth of its channel (send k), and its `after=` steps. With
    order="program" every lane is then sorted by (depth in that graph, program order): a step
    waits only for what it needs (ring: each rank's send of a step goes before its receive), and,
    as every edge goes up in (depth, program order), the lanes cannot deadlock."""

    def __init__(self, p: Program):
        self.p = p
        self.P = 1
        for op in p._ops:
            self.P = self.P * op.pieces // math.gcd(self.P, op.pieces)
        self.K = p.chunks * self.P
        self.lanes = max(max((op.lane for op in p._ops), default=0) + 1, 1)
        self.program_order = p.order == "program"
        self.placed: List[List[List[tuple]]] = [[[] for _ in range(self.lanes)] for _ in range(p.ranks)]
        self.where: List[Tuple[int, int]] = []  # g -> (rank, lane)
        self.depth: List[int] = []
        self.xdeps: Dict[int, List[int]] = {}  # g -> same-rank predecessors on other lanes
        self.send_seq: Dict[Tuple[int, int, int], int] = {}
        self.recv_seq: Dict[Tuple[int, int, int], int] = {}
        self.last_send: Dict[Tuple[int, int, int], int] = {}
        self.recvs: Dict[Tuple[int, int, int], List[int]] = {}
        self.writer: List[Dict] = [{} for _ in range(p.ranks)]
        self.readers: List[Dict] = [{} for _ in range(p.ranks)]
        self.emitted: Dict[object, List[int]] = {}  # op index or (op, piece) -> g, for after=
        self.referenced = {a for op in p._ops for a in op.after}
        self.identity = not p.inplace

    def run(self) -> IR:
        p = self.p
        ops = p._ops
        i = 0
        while i < len(ops):
            op = ops[i]
            if op.block is None:
                for k in range(op.pieces):
                    self.emit(op, k)
                i += 1
                continue
            j = i
            while j < len(ops) and ops[j].block == op.block:
                j += 1
            for k in range(op.pieces):
                for o in ops[i:j]:
                    self.emit(o, k)
            i = j
        index = [0] * len(self.where)
        for lanes in self.placed:
            for lst in lanes:
                if self.program_order:
                    lst.sort(key=lambda e: (e[0], e[1]))
                for idx, e in enumerate(lst):
                    index[e[1]] = idx
        steps = []
        for r, lanes in enumerate(self.placed):
            out_lanes = []
            for lane, lst in enumerate(lanes):
                out = []
                for _, g, st in lst:
                    xs = self.xdeps.get(g)
                    if xs:
                        best: Dict[int, int] = {}
                        for x in xs:
                            xl = self.where[x][1]
                            if best.get(xl, -1) < index[x]:
                                best[xl] = index[x]
                        st = Step(st[0], st[1], st[2], st[3], st[4], tuple(sorted(best.items())))
                    out.append(st)
                out_lanes.append(out)
            steps.append(out_lanes)
        return IR(name=p.name, collective=p.collective, ranks=p.ranks, chunks=self.K, steps=steps,
                  pieces=self.P, root=p.root, inplace=p.inplace, scratch=p.scratch_chunks * self.P,
                  channel_depth=p.channel_depth)

    def regions(self, ref: Ref, piece: int, pieces: int) -> List[Tuple[str, int, int]]:
        """IR regions of piece `piece` of `pieces` of ref. The IR numbers a block's chunks piece
        first: IR chunk i * C + c is piece i of chunk c (C chunks per block, or the scratch's
        size), so that one piece of several neighbouring chunks is one region."""
        P = self.P
        if P == 1:
            return [(ref.buffer, ref.start, ref.count)]
        C = self.p.scratch_chunks if ref.buffer == "scratch" else self.p.chunks
        w = P // pieces
        out = []
        for i in range(piece * w, (piece + 1) * w):
            x, end = ref.start, ref.start + ref.count
            while x < end:  # one region per block the ref touches
                b, c = divmod(x, C) if C else (0, x)
                n = min(end - x, C - c) if C else end - x
                out.append((ref.buffer, b * C * P + i * C + c, n))
                x += n
        return out

    def emit(self, op: _Op, piece: int):
        srcs = self.regions(op.src, piece, op.pieces) if op.src is not None else None
        dsts = self.regions(op.dst, piece, op.pieces) if op.dst is not None else None
        for x in range(len(srcs if srcs is not None else dsts)):
            self.emit_one(op, piece, srcs[x] if srcs is not None else None, dsts[x] if dsts is not None else None)

    def emit_one(self, op: _Op, piece: int, s, d):
        kind, lane = op.kind, op.lane
        if kind == "send":
            self.send(op, piece, op.src.rank, op.peer, s)
        elif kind in ("recv", "recv_reduce"):
            self.recv(op, piece, op.peer, op.dst.rank, kind, d, None)
        elif op.src.rank == op.dst.rank:
            self.place(op, piece, op.src.rank, Step(kind, s, d), [])
        else:
            g = self.send(op, piece, op.src.rank, op.dst.rank, s)
            self.recv(op, piece, op.src.rank, op.dst.rank, "recv" if kind == "copy" else "recv_reduce", d, g)

    def send(self, op, piece, a, b, s) -> int:
        ch = (a, b, op.lane)
        k = self.send_seq.get(ch, 0)
        self.send_seq[ch] = k + 1
        preds = []
        if ch in self.last_send:
            preds.append(self.last_send[ch])
        earlier = self.recvs.get(ch, ())
        if k >= self.p.channel_depth and len(earlier) > k - self.p.channel_depth:
            preds.append(earlier[k - self.p.channel_depth])
        g = self.place(op, piece, a, Step("send", s, None, b, k), preds)
        self.last_send[ch] = g
        return g

    def recv(self, op, piece, a, b, kind, d, sender):
        ch = (a, b, op.lane)
        k = self.recv_seq.get(ch, 0)
        self.recv_seq[ch] = k + 1
        lst = self.recvs.setdefault(ch, [])
        preds = [lst[-1]] if lst else []
        if sender is not None:
            preds.append(sender)
        g = self.place(op, piece, b, Step(kind, None, d, a, k), preds)
        lst.append(g)

    def place(self, op: _Op, piece: int, rank: int, step: Step, preds: List[int]) -> int:
        p = self.p
        if not 0 <= rank < p.ranks:
            raise ScheduleError(f"step {op.index} ({op.kind}) names rank {rank}, but the program has ranks "
                                f"0-{p.ranks - 1}")
        lane = op.lane
        g = len(self.where)
        same = []  # predecessors on this rank
        for a in op.after:  # every step of that op on this rank (its same piece, if pipelined together)
            prev = p._ops[a]
            key = (a, piece) if (prev.block is not None and prev.block == op.block) else a
            same.extend(x for x in self.emitted.get(key, ()) if self.where[x][0] == rank)
        if self.program_order:
            writer, readers = self.writer[rank], self.readers[rank]
            for reg in step.reads():
                for c in self.chunks_of(rank, reg):
                    w = writer.get(c)
                    if w is not None:
                        same.append(w)
                    readers.setdefault(c, []).append(g)
            for reg in step.writes():
                for c in self.chunks_of(rank, reg):
                    w = writer.get(c)
                    if w is not None:
                        same.append(w)
                    for x in readers.pop(c, ()):
                        if x != g:
                            same.append(x)
                    writer[c] = g
            depth = 0
            for x in same:
                if self.depth[x] >= depth:
                    depth = self.depth[x] + 1
            for x in preds:
                if self.depth[x] >= depth:
                    depth = self.depth[x] + 1
        else:
            depth = 0
        xs = [x for x in same if self.where[x][1] != lane]
        if xs:
            self.xdeps[g] = xs
        self.where.append((rank, lane))
        self.depth.append(depth)
        self.placed[rank][lane].append((depth, g, step))
        if op.index in self.referenced:
            for key in (op.index, (op.index, piece)):
                self.emitted.setdefault(key, []).append(g)
        return g

    def chunks_of(self, rank, reg):
        buf, start, count = reg
        if not self.identity:
            p = self.p
            if p.collective in ("all_reduce", "broadcast", "reduce"):
                buf = "in" if buf == "out" else buf
            else:
                return [collectives.storage(p.collective, True, rank, buf, c, self.K)
                        for c in range(start, start + count)]
        return [(buf, start)] if count == 1 else [(buf, c) for c in range(start, start + count)]
