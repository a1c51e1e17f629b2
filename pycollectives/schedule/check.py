"""The checker: runs before anything executes, on the lowered form (what the engines run).

`check(program)` accepts a Program or an IR and raises ScheduleError for the first fault, in this
order: the wrong collective or rank count (when asked for), malformed steps and chunks out of
range (scratch beyond its declared size included), receives without sends and sends without
receives, a cycle in the dependency graph (a deadlock), then, walking the steps in a dependency
order: a step that reads a region whose writer it is not ordered after (read before write), two
unordered writes of one region (write-write race), a write unordered with an earlier read, a
reduction of chunks that must not meet, a contribution counted twice; at the end, every output
chunk against what the collective needs there (and, with identical=True, the same reduction on
every rank).

Happens-before is the order of each lane, the `deps` between lanes, send -> matching receive,
and receive k - channel_depth -> send k on each channel. Provenance is symbolic: a chunk's value
is the multiset of (rank, input chunk) it was reduced from.
"""
from __future__ import annotations

import heapq
from collections import deque
from typing import Dict, List, Optional, Tuple, Union

from . import collectives
from .collectives import BUFFER_NAMES
from .errors import ScheduleError
from .ir import IR, Step

__all__ = ["check", "ScheduleError", "render"]


def check(program, collective: Optional[str] = None, ranks: Optional[int] = None, *,
          identical: bool = False) -> IR:
    """Checks a Program or IR (see the module's docstring); returns the IR.

    identical=True also requires that every rank's copy of an output chunk comes from the same
    reductions in the same order (a copy of one result), so that floating-point results are
    bitwise equal on all ranks, as data-parallel training needs."""
    ir = program if isinstance(program, IR) else program.lower()
    c = _Checker(ir, collective, ranks)
    c.identical = identical
    c.run()
    return ir


def render(value, chunk: Optional[int] = None) -> str:
    """r0+r1+r1, with :cN after a rank where the contribution is input chunk N (shown unless N == chunk)."""
    if not value:
        return "nothing"
    return "+".join(f"r{q}" if c == chunk else f"r{q}:c{c}" for q, c in value)


def _diff(have, need) -> str:
    from collections import Counter

    h, n = Counter(have), Counter(need)
    notes = []
    for (q, c), k in sorted(h.items()):
        if k > 1:
            notes.append(f"rank {q} {_times(k)}")
    missing = sorted(set(n) - set(h))
    if missing:
        notes.append("missing " + ", ".join(f"rank {q}" if len({c for _, c in need}) == 1 else f"rank {q} chunk {c}"
                                             for q, c in missing))
    extra = sorted(set(h) - set(n))
    if extra:
        notes.append("not wanted: " + ", ".join(f"rank {q} chunk {c}" for q, c in extra))
    return f" ({'; '.join(notes)})" if notes else ""


def _times(k):
    return {2: "twice", 3: "three times"}.get(k, f"{k} times")


class _Checker:
    def __init__(self, ir: IR, collective, ranks):
        self.ir, self.want_collective, self.want_ranks = ir, collective, ranks
        self.identical = False

    # Names -------------------------------------------------------------------------------------
    def where(self, node) -> str:
        r, l, i = node
        return f"rank {r}, step {i} (lane {l})"

    def loc(self, buf: str, chunk: int) -> str:
        s = f"{BUFFER_NAMES.get(buf, buf)} chunk {chunk}"
        ir = self.ir
        P = ir.pieces
        if P > 1:  # IR chunk i * C + c of a block is piece i of chunk c
            C = (ir.scratch if buf == "scratch" else ir.chunks) // P
            b, j = divmod(chunk, C * P) if C else (0, chunk)
            if C:
                s += f" (piece {j // C} of chunk {b * C + j % C})"
        return s

    def fail(self, node, msg):
        raise ScheduleError(f"{self.where(node)}: {msg}" if node is not None else msg)

    # The passes --------------------------------------------------------------------------------
    def run(self):
        self.structure()
        self.graph()
        self.walk()

    def structure(self):
        ir = self.ir
        if ir.collective not in collectives.COLLECTIVES:
            raise ScheduleError(f"program {ir.name!r}: unknown collective {ir.collective!r}")
        if self.want_collective is not None and ir.collective != self.want_collective:
            raise ScheduleError(f"program {ir.name!r} is a schedule of {ir.collective}, "
                                f"but {self.want_collective} was asked for (wrong collective)")
        if self.want_ranks is not None and ir.ranks != self.want_ranks:
            raise ScheduleError(f"program {ir.name!r} was built for {ir.ranks} ranks, "
                                f"but the group has {self.want_ranks} (wrong rank count)")
        if len(ir.steps) != ir.ranks:
            raise ScheduleError(f"program {ir.name!r} declares {ir.ranks} ranks but has steps for "
                                f"{len(ir.steps)} (wrong rank count)")
        try:
            collectives.validate(ir.collective, ir.ranks, ir.root, ir.inplace)
        except ScheduleError as e:
            raise ScheduleError(f"program {ir.name!r}: {e}") from None
        if ir.chunks < 1 or ir.pieces < 1 or ir.chunks % ir.pieces or ir.scratch < 0 or ir.channel_depth < 1:
            raise ScheduleError(f"program {ir.name!r}: bad sizes (chunks={ir.chunks}, pieces={ir.pieces}, "
                                f"scratch={ir.scratch}, channel_depth={ir.channel_depth})")
        size = {b: collectives.buffer_chunks(ir.collective, b, ir.ranks, ir.chunks, ir.scratch)
                for b in collectives.BUFFERS}
        self.size = size
        for r, lanes in enumerate(ir.steps):
            for l, lst in enumerate(lanes):
                for i, s in enumerate(lst):
                    node = (r, l, i)
                    if not isinstance(s, Step) or s.op not in ("send", "recv", "recv_reduce", "copy", "reduce"):
                        self.fail(node, f"unknown step {s!r}")
                    want_src = s.op in ("send", "copy", "reduce")
                    want_dst = s.op != "send"
                    if (s.src is not None) != want_src or (s.dst is not None) != want_dst:
                        self.fail(node, f"a {s.op} step has {'a' if want_src else 'no'} source and "
                                        f"{'a' if want_dst else 'no'} destination: {s.to_json()}")
                    if s.op in ("send", "recv", "recv_reduce"):
                        if not isinstance(s.peer, int) or not 0 <= s.peer < ir.ranks or s.peer == r:
                            self.fail(node, f"{s.op} names peer {s.peer!r}: a peer is another rank of 0-{ir.ranks - 1}")
                        if not isinstance(s.seq, int) or s.seq < 0:
                            self.fail(node, f"{s.op} has no message number (seq {s.seq!r})")
                    elif s.src[2] != s.dst[2]:
                        self.fail(node, f"{s.op} of {s.src[2]} chunks into {s.dst[2]} chunks")
                    for reg in (s.src, s.dst):
                        if reg is not None:
                            self.bounds(node, reg)
                    for dl, di in s.deps:
                        if not (0 <= dl < len(lanes) and 0 <= di < len(lanes[dl])):
                            self.fail(node, f"depends on step {di} of lane {dl}, which rank {r} does not have")

    def bounds(self, node, reg):
        buf, start, count = reg
        if buf not in self.size:
            self.fail(node, f"unknown buffer {buf!r}")
        n = self.size[buf]
        if count < 1:
            self.fail(node, f"{self.loc(buf, start)}: a region has at least one chunk, not {count}")
        if start < 0 or start + count > n:
            bad = start if start < 0 or start >= n else n
            if buf == "scratch":
                self.fail(node, f"{self.loc(buf, bad)} is beyond the declared scratch of {n} chunks "
                                f"(scratch overflow: the step uses chunks {start}-{start + count - 1})")
            self.fail(node, f"{self.loc(buf, bad)} is out of range: the {BUFFER_NAMES[buf]} has chunks "
                            f"0-{n - 1} (the step uses {start}-{start + count - 1})")

    def graph(self):
        """Numbers the steps, matches messages, builds the predecessors, finds cycles."""
        ir = self.ir
        self.nodes: List[Tuple[int, int, int]] = []
        self.base: Dict[Tuple[int, int], int] = {}
        for r, lanes in enumerate(ir.steps):
            for l, lst in enumerate(lanes):
                self.base[(r, l)] = len(self.nodes)
                self.nodes.extend((r, l, i) for i in range(len(lst)))
        sends: Dict[Tuple[int, int, int, int], int] = {}
        recvs: Dict[Tuple[int, int, int, int], int] = {}
        # A channel is first in, first out: its messages are numbered in the order of its lane.
        for r, lanes in enumerate(ir.steps):
            for l, lst in enumerate(lanes):
                nxt = {}
                for i, s in enumerate(lst):
                    if s.op in ("send", "recv", "recv_reduce"):
                        key = (s.op == "send", s.peer)
                        want = nxt.get(key, 0)
                        if s.seq != want:
                            way = f"to rank {s.peer}" if s.op == "send" else f"from rank {s.peer}"
                            self.fail((r, l, i), f"message {s.seq} {way} on lane {l} comes where message "
                                                 f"{want} is next: a channel's messages go in order")
                        nxt[key] = want + 1
        for n, (r, l, i) in enumerate(self.nodes):
            s = ir.steps[r][l][i]
            if s.op == "send":
                key = (r, s.peer, l, s.seq)
                if key in sends:
                    self.fail((r, l, i), f"message {s.seq} to rank {s.peer} on lane {l} is sent twice")
                sends[key] = n
            elif s.op in ("recv", "recv_reduce"):
                key = (s.peer, r, l, s.seq)
                if key in recvs:
                    self.fail((r, l, i), f"message {s.seq} from rank {s.peer} on lane {l} is received twice")
                recvs[key] = n
        for key, n in recvs.items():
            if key not in sends:
                s = self.step(n)
                self.fail(self.nodes[n], f"receive from rank {s.peer} (message {s.seq} on lane {key[2]}) "
                                         f"has no matching send (unmatched receive)")
        for key, n in sends.items():
            if key not in recvs:
                s = self.step(n)
                self.fail(self.nodes[n], f"send to rank {s.peer} (message {s.seq} on lane {key[2]}) "
                                         f"is never received (unmatched send)")
        self.match = {}  # recv node -> send node
        preds: List[List[int]] = [[] for _ in self.nodes]
        D = ir.channel_depth
        for key, rn in recvs.items():
            sn = sends[key]
            self.match[rn] = sn
            a, b = self.step(sn).src[2], self.step(rn).dst[2]
            if a != b:
                self.fail(self.nodes[rn], f"receives {b} chunks, but the matching send "
                                          f"({self.where(self.nodes[sn])}) sends {a}")
            preds[rn].append(sn)
            src, dst, lane, seq = key
            if seq >= D:
                earlier = recvs.get((src, dst, lane, seq - D))
                if earlier is not None:
                    preds[sn].append(earlier)
        for n, (r, l, i) in enumerate(self.nodes):
            if i > 0:
                preds[n].append(n - 1)
            for dl, di in self.step(n).deps:
                preds[n].append(self.base[(r, dl)] + di)
        self.preds = preds
        # Kahn's algorithm, lowest node first: a topological order, or the steps left in a cycle.
        succ: List[List[int]] = [[] for _ in self.nodes]
        indeg = [0] * len(self.nodes)
        for n, ps in enumerate(preds):
            for m in ps:
                succ[m].append(n)
            indeg[n] = len(ps)
        ready = [n for n in range(len(self.nodes)) if indeg[n] == 0]
        heapq.heapify(ready)
        order = []
        while ready:
            n = heapq.heappop(ready)
            order.append(n)
            for m in succ[n]:
                indeg[m] -= 1
                if indeg[m] == 0:
                    heapq.heappush(ready, m)
        if len(order) != len(self.nodes):
            self.cycle(indeg)
        self.order = order
        self.pos = [0] * len(self.nodes)
        for k, n in enumerate(order):
            self.pos[n] = k

    def step(self, n) -> Step:
        r, l, i = self.nodes[n]
        return self.ir.steps[r][l][i]

    def cycle(self, indeg):
        left = {n for n in range(len(self.nodes)) if indeg[n] > 0}
        n = min(left)
        seen = {}
        path = []
        while n not in seen:
            seen[n] = len(path)
            path.append(n)
            n = next(m for m in self.preds[n] if m in left)
        loop = path[seen[n]:][::-1]  # in the order the steps would run
        text = " -> ".join(f"{self.where(self.nodes[m])} [{self.step(m).describe()}]" for m in loop)
        first = self.nodes[loop[0]]
        self.fail(first, f"deadlock: each step below must finish before the next one starts, in a cycle: {text} -> back to the first")

    def hb(self, a: int, b: int) -> bool:
        """Does step a finish before step b starts?"""
        if a == b:
            return True
        ra, la, ia = self.nodes[a]
        rb, lb, ib = self.nodes[b]
        if (ra, la) == (rb, lb):
            return ia < ib
        pa = self.pos[a]
        if pa > self.pos[b]:
            return False
        stack, seen = [b], {b}
        while stack:
            n = stack.pop()
            for m in self.preds[n]:
                if m in seen:
                    continue
                r, l, i = self.nodes[m]
                if (r, l) == (ra, la):
                    if i >= ia:
                        return True
                    continue
                if self.pos[m] < pa:
                    continue
                seen.add(m)
                stack.append(m)
        return False

    def walk(self):
        ir = self.ir
        K, coll = ir.chunks, ir.collective
        reducing = coll in collectives.REDUCING

        def where_(r, buf, c):
            return collectives.storage(coll, ir.inplace, r, buf, c, K)

        value: Dict[Tuple[int, str, int], tuple] = {}
        tree: Dict[Tuple[int, str, int], int] = {}  # the reduction tree of a value, interned
        trees: Dict[tuple, int] = {}
        firsts: Dict[int, tuple] = {}

        def intern(key):
            return trees.setdefault(key, len(trees))

        writer: Dict[Tuple[int, str, int], int] = {}
        readers: Dict[Tuple[int, str, int], List[int]] = {}
        n_in = collectives.buffer_chunks(coll, "in", ir.ranks, K, 0)
        for r in range(ir.ranks):
            for c in range(n_in):
                b, sc = where_(r, "in", c)
                value[(r, b, sc)] = ((r, c),)
                tree[(r, b, sc)] = intern((r, c))
        messages: Dict[int, list] = {}

        def cells(r, reg):
            buf, start, count = reg
            return [(r,) + where_(r, buf, c) for c in range(start, start + count)]

        def name_cell(r, reg, k):
            return self.loc(reg[0], reg[1] + k)

        def read(n, r, reg):
            out = []
            for k, cell in enumerate(cells(r, reg)):
                w = writer.get(cell)
                if w is not None and not self.hb(w, n):
                    self.fail(self.nodes[n], f"reads {name_cell(r, reg, k)} that {self.where(self.nodes[w])} "
                                             f"writes, without waiting for that step (read before write)")
                v = value.get(cell)
                if v is None:
                    self.fail(self.nodes[n], f"reads {name_cell(r, reg, k)} before any step writes it "
                                             f"(read before write)")
                readers.setdefault(cell, []).append(n)
                out.append((v, tree.get(cell)))
            return out

        def write(n, r, reg, vals, reduce):
            for k, cell in enumerate(cells(r, reg)):
                w = writer.get(cell)
                if w is not None and not self.hb(w, n):
                    self.fail(self.nodes[n], f"writes {name_cell(r, reg, k)} that {self.where(self.nodes[w])} "
                                             f"also writes, and nothing orders the two (write-write race)")
                for x in readers.get(cell, ()):
                    if x != n and not self.hb(x, n):
                        self.fail(self.nodes[n], f"writes {name_cell(r, reg, k)} that {self.where(self.nodes[x])} "
                                                 f"reads, and nothing orders the two (write before the read "
                                                 f"finished: read-write race)")
                new, new_tree = vals[k]
                if reduce:
                    if not reducing:
                        self.fail(self.nodes[n], f"reduces into {name_cell(r, reg, k)}, but {coll} "
                                                 f"does not reduce")
                    old = value.get(cell)
                    if old is None:
                        self.fail(self.nodes[n], f"reduces into {name_cell(r, reg, k)} before any step "
                                                 f"writes it (read before write)")
                    chunks = {c for _, c in old} | {c for _, c in new}
                    if len(chunks) > 1:
                        self.fail(self.nodes[n], f"reduces {render(new)} into {name_cell(r, reg, k)}, "
                                                 f"which holds {render(old)}: chunks of different "
                                                 f"positions do not add up")
                    new = tuple(heapq.merge(old, new))
                    if len(set(new)) != len(new):
                        c0 = new[0][1]
                        shown = c0 if (cell[1] != "scratch" and cell[2] == c0) else None
                        need = tuple((q, c0) for q in range(ir.ranks))
                        self.fail(self.nodes[n], f"{name_cell(r, reg, k)} holds {render(new, shown)}"
                                                 f"{_diff(new, tuple(sorted(set(new))))} but {coll} needs "
                                                 f"every contribution once ({render(need, shown)})")
                if reduce:  # the same two operands give the same bits, in either order
                    new_tree = intern(("op",) + tuple(sorted((tree[cell], new_tree))))
                value[cell] = new
                tree[cell] = new_tree
                writer[cell] = n
                readers.pop(cell, None)

        for n in self.order:
            r, l, i = self.nodes[n]
            s = ir.steps[r][l][i]
            op = s.op
            if op == "send":
                messages[n] = read(n, r, s.src)
            elif op == "recv" or op == "recv_reduce":
                vals = messages.pop(self.match[n])
                if op == "recv_reduce":
                    read(n, r, s.dst)
                write(n, r, s.dst, vals, op == "recv_reduce")
            else:
                vals = read(n, r, s.src)
                if op == "reduce":
                    read(n, r, s.dst)
                write(n, r, s.dst, vals, op == "reduce")

        n_out = collectives.buffer_chunks(coll, "out", ir.ranks, K, 0)
        for r in range(ir.ranks):
            for c in range(n_out):
                need = collectives.expected(coll, ir.ranks, ir.root, r, c, K)
                if need is None:
                    continue
                cell = (r,) + where_(r, "out", c)
                have = value.get(cell)
                w = writer.get(cell)
                if have == need:
                    if self.identical and coll == "all_reduce":  # the one with copies of a reduction
                        first = firsts.setdefault(c, (r, tree.get(cell), w))
                        if first[1] != tree.get(cell):
                            self.fail(self.nodes[w] if w is not None else None,
                                      f"{'rank ' + str(r) + ': ' if w is None else ''}{self.loc('out', c)} is "
                                      f"reduced in another order than on rank {first[0]}: the results may "
                                      f"differ in their last bits (not identical)")
                    continue
                shown = c if all(x == c for _, x in need) else None
                what = self.loc("out", c)
                if have is None:
                    raise ScheduleError(f"rank {r}: {what} is never written, but {coll} needs "
                                        f"{render(need, shown)} there")
                text = f"{what} holds {render(have, shown)}{_diff(have, need)} but {coll} needs {render(need, shown)}"
                if w is None:
                    raise ScheduleError(f"rank {r}: {text} (no step writes it)")
                self.fail(self.nodes[w], text)
