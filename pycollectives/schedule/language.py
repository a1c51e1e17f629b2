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

A step written with numpy arrays of ranks or chunks (`p.input(r, c)` with r, c arrays) is one step
per element, in order, without a Python object per step: the way to write programs of millions of
steps (the ring at 4,096 ranks has 33 million). Such a call returns no handle.

`send` and `recv` write the two halves of a transfer separately, for schedules whose message
order is their own (they are matched per channel, in order).
"""
from __future__ import annotations

import contextlib
import gc
import math
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from . import collectives
from .errors import ScheduleError
from .ir import IR, Step


_BUFFERS = frozenset(collectives.BUFFERS)


class Ref:
    """`count` chunks from `start` of a buffer ("in", "out" or "scratch") of one rank. rank,
    start and count may be numpy arrays (of one length, or broadcast): a step written with such
    refs is one step per element, in order (a ring's step of N messages in one call)."""
    __slots__ = ("rank", "buffer", "start", "count")

    def __init__(self, rank: int, buffer: str, start: int, count: int = 1):
        if buffer not in _BUFFERS:
            raise ScheduleError(f"unknown buffer {buffer!r}: expected one of {', '.join(collectives.BUFFERS)}")
        # No int() here: a step is written millions of times; the OpTable makes them integers.
        self.rank, self.buffer, self.start, self.count = rank, buffer, start, count

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


KINDS = ("copy", "reduce", "send", "recv", "recv_reduce")
_KIND_CODE = {k: i for i, k in enumerate(KINDS)}
_BUFFER_CODE = {b: i for i, b in enumerate(collectives.BUFFERS)}
# The columns of OpTable, one row per step as written (-1: none).
COLUMNS = ("kind", "src_rank", "src_buf", "src_start", "dst_rank", "dst_buf", "dst_start", "count", "peer",
           "lane", "pieces", "block")


def _is_vector(ref) -> bool:
    return ref is not None and any(isinstance(x, (np.ndarray, list, range)) for x in (ref.rank, ref.start, ref.count))


def _narrow(col: np.ndarray) -> np.ndarray:
    """col in the smallest signed integer type that holds it."""
    if not len(col):
        return col.astype(np.int8)
    lo, hi = int(col.min()), int(col.max())
    for t in (np.int8, np.int16, np.int32, np.int64):
        if np.iinfo(t).min <= lo and hi <= np.iinfo(t).max:
            break
    if lo == hi:  # one value (a lane, a buffer, ...): no memory per row
        return np.broadcast_to(np.array(lo, t), col.shape)
    return col.astype(t)


class OpTable:
    """The steps of a Program as written, in numpy columns (COLUMNS) of the smallest integer type
    that holds them, filled 65,536 rows at a time: a program of 30 million steps takes a few
    hundred MB, not the tens of GB of one object per step. Indexing gives an `_Op`; `column(name)`
    the whole column; `after` maps an op index to its after= indices."""
    FLUSH = 1 << 16
    PART = 1 << 20

    def __init__(self):
        self._rows: List[tuple] = []
        self._cols: Dict[str, List[np.ndarray]] = {c: [] for c in COLUMNS}
        self._small: List[Dict[str, np.ndarray]] = []
        self._small_rows = 0
        self._flushed = 0
        self.after: Dict[int, tuple] = {}

    def __len__(self):
        return self._flushed + len(self._rows)

    def append(self, row: tuple, after: tuple):
        rows = self._rows
        if after:
            self.after[self._flushed + len(rows)] = after
        rows.append(row)
        if len(rows) >= self.FLUSH:
            self._flush()

    def extend(self, columns: Dict[str, np.ndarray]):
        """Rows given as whole columns (steps written for arrays of ranks or chunks)."""
        self._flush()
        self._add_part({name: np.asarray(columns[name], np.int64) for name in COLUMNS}, len(columns["kind"]))

    def _flush(self):
        if not self._rows:
            return
        a = np.array(self._rows, dtype=np.int64)
        self._add_part({name: a[:, i] for i, name in enumerate(COLUMNS)}, len(self._rows))
        self._rows = []

    def _add_part(self, cols, n):
        # Small parts are joined into parts of a million rows: many small arrays freed later
        # would stay in the process's heap.
        self._small.append(cols)
        self._small_rows += n
        self._flushed += n
        if self._small_rows >= self.PART:
            self._join_small()

    def _join_small(self):
        if not self._small:
            return
        for name in COLUMNS:
            self._cols[name].append(_narrow(np.concatenate([c[name] for c in self._small])))
        self._small, self._small_rows = [], 0

    def column(self, name: str) -> np.ndarray:
        """The whole column, its parts joined once (in the widest type among them)."""
        self._flush()
        self._join_small()
        parts = self._cols[name]
        if not parts:
            return np.zeros(0, np.int8)
        if len(parts) > 1 and all(p.strides == (0,) for p in parts) and len({int(p[0]) for p in parts}) == 1:
            parts[:] = [np.broadcast_to(parts[0][:1].copy(), (self._flushed,))]
        elif len(parts) > 1:
            t = np.result_type(*parts)
            out = np.empty(self._flushed, t)
            at = 0
            while parts:  # part by part, so that the column is not held twice
                part = parts.pop(0)
                out[at:at + len(part)] = part
                at += len(part)
            parts.append(out)
        return parts[0]

    def row(self, i: int) -> tuple:
        if i >= self._flushed:
            return self._rows[i - self._flushed]
        return tuple(int(self.column(c)[i]) for c in COLUMNS)

    def __getitem__(self, i: int) -> _Op:
        if i < 0:
            i += len(self)
        kind, sr, sb, ss, dr, db, ds, count, peer, lane, pieces, block = self.row(i)
        src = Ref(sr, collectives.BUFFERS[sb], ss, count) if sb >= 0 else None
        dst = Ref(dr, collectives.BUFFERS[db], ds, count) if db >= 0 else None
        return _Op(KINDS[kind], src, dst, None if peer < 0 else peer, lane, pieces, self.after.get(i, ()),
                   None if block < 0 else block, i)

    def __iter__(self):
        for i in range(len(self)):
            yield self[i]


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
        self._ops = OpTable()
        self._n = 0
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
        # Runs once per step written (tens of millions for a ring at 4,096 ranks): kept lean.
        block = self._block
        if block is not None:
            if pieces != 1:
                raise ScheduleError("pieces= inside pipelined(): the block already cuts its steps into pieces")
            block, pieces = block
        else:
            block = -1
        if pieces < 1 or lane < 0:
            raise ScheduleError(f"pieces >= 1 and lane >= 0, not pieces={pieces}, lane={lane}")
        n = self._n
        if after:
            for h in after:
                if not isinstance(h, Handle) or not 0 <= h.index < n:
                    raise ScheduleError(f"after= takes handles of earlier steps, not {h!r}")
            after = tuple(h.index for h in after)
        if _is_vector(src) or _is_vector(dst):
            if after:
                raise ScheduleError("after= takes handles of single steps, not of steps written for arrays")
            self._add_vector(kind, src, dst, peer, int(lane), int(pieces), block)
            self._ir = None
            return None
        if src is not None:
            if dst is not None:
                if src.count != dst.count:
                    raise ScheduleError(f"{kind} of {src.count} chunks into {dst.count} chunks: {src!r} -> {dst!r}")
                row = (_KIND_CODE[kind], src.rank, _BUFFER_CODE[src.buffer], src.start, dst.rank,
                       _BUFFER_CODE[dst.buffer], dst.start, src.count, -1, int(lane), int(pieces), block)
            else:
                row = (_KIND_CODE[kind], src.rank, _BUFFER_CODE[src.buffer], src.start, -1, -1, -1, src.count,
                       peer, int(lane), int(pieces), block)
        else:
            row = (_KIND_CODE[kind], -1, -1, -1, dst.rank, _BUFFER_CODE[dst.buffer], dst.start, dst.count,
                   peer, int(lane), int(pieces), block)
        self._ops.append(row, after)
        self._n = n + 1
        self._ir = None
        return Handle(n)

    def _add_vector(self, kind, src, dst, peer, lane, pieces, block):
        """One step per element of the arrays among the refs' ranks, starts and counts, in order."""
        fields = [src.rank, src.start, src.count] if src is not None else []
        fields += [dst.rank, dst.start, dst.count] if dst is not None else []
        try:
            arrays = np.broadcast_arrays(*[np.asarray(f, np.int64) for f in fields])
        except ValueError:
            raise ScheduleError(f"{kind}: the arrays of ranks and chunks differ in length") from None
        n = arrays[0].size
        cols = {"kind": np.full(n, _KIND_CODE[kind]), "peer": np.full(n, -1 if peer is None else peer),
                "lane": np.full(n, lane), "pieces": np.full(n, pieces), "block": np.full(n, block)}
        if src is not None:
            cols["src_rank"], cols["src_start"], cols["count"] = (a.ravel() for a in arrays[:3])
            cols["src_buf"] = np.full(n, _BUFFER_CODE[src.buffer])
            arrays = arrays[3:]
        else:
            cols["src_rank"] = cols["src_buf"] = cols["src_start"] = np.full(n, -1)
        if dst is not None:
            if src is not None and np.any(cols["count"] != arrays[2].ravel()):
                raise ScheduleError(f"{kind} of chunks into a different number of chunks: {src!r} -> {dst!r}")
            cols["dst_rank"], cols["dst_start"], cols["count"] = (a.ravel() for a in arrays)
            cols["dst_buf"] = np.full(n, _BUFFER_CODE[dst.buffer])
        else:
            cols["dst_rank"] = cols["dst_buf"] = cols["dst_start"] = np.full(n, -1)
        self._ops.extend(cols)
        self._n += n

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
        self.ops = list(p._ops)
        self.P = 1
        for op in self.ops:
            self.P = self.P * op.pieces // math.gcd(self.P, op.pieces)
        self.K = p.chunks * self.P
        self.lanes = max(max((op.lane for op in self.ops), default=0) + 1, 1)
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
        self.referenced = {a for op in self.ops for a in op.after}
        self.identity = not p.inplace

    def run(self) -> IR:
        p = self.p
        ops = self.ops
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
            prev = self.ops[a]
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
