"""The reference interpreter: runs a schedule's IR on torch tensors for all N ranks in one
process, one step at a time in an order its dependencies allow, with the reductions the engines
implement. Tests compare a program with torch through it; `order="random"` picks among the
ready steps at random, so that a schedule whose result depends on an order it does not enforce
gives different answers on different seeds.

    outs = interpret(ir, inputs, op="sum")   # inputs: one tensor per rank; outs: one per rank
"""
from __future__ import annotations

import random
from collections import deque
from typing import List, Optional, Sequence

import torch

from . import collectives
from .errors import ScheduleError
from .ir import IR

OPS = ("sum", "avg", "product", "min", "max", "premul_sum", "band", "bor", "bxor")


def _op_name(op) -> str:
    if not isinstance(op, str):  # torch.distributed.ReduceOp or a RedOpType
        op = str(op).split(".")[-1]
    name = op.lower()
    if name not in OPS:
        raise ScheduleError(f"unknown reduce op {op!r}: expected one of {', '.join(OPS)}")
    return name


def combine(a: torch.Tensor, b: torch.Tensor, op: str) -> torch.Tensor:
    """a op b, elementwise, in a's dtype (sum for avg and premul_sum: they scale separately)."""
    if a.dtype == torch.bool:
        if op in ("sum", "avg", "max", "bor", "premul_sum"):
            return a | b
        if op in ("product", "min", "band"):
            return a & b
        if op == "bxor":
            return a ^ b
    if op in ("sum", "avg", "premul_sum"):
        return torch.add(a, b)
    if op == "product":
        return torch.mul(a, b)
    if op == "min":
        return torch.minimum(a, b)
    if op == "max":
        return torch.maximum(a, b)
    if a.dtype.is_floating_point or a.dtype.is_complex:
        raise ScheduleError(f"{op} needs an integer dtype, not {a.dtype}")
    return {"band": torch.bitwise_and, "bor": torch.bitwise_or, "bxor": torch.bitwise_xor}[op](a, b)


class _Buffers:
    """The buffers of one rank as flat tensors, with the chunk -> elements map of the IR."""

    def __init__(self, ir: IR, rank: int, x: torch.Tensor, numel: int):
        coll, N, K = ir.collective, ir.ranks, ir.chunks
        self.ir, self.E, self.K = ir, numel, K
        self.s = -(-numel // K) if K else 0
        nin, nout = collectives.blocks(coll, "in", N), collectives.blocks(coll, "out", N)
        x = x.reshape(-1)
        if ir.inplace and coll in ("all_reduce", "broadcast", "reduce"):
            self.inp = x.clone()
            self.out = self.inp
        elif ir.inplace and coll == "all_gather":
            self.out = torch.zeros(nout * numel, dtype=x.dtype)
            self.inp = self.out[rank * numel:(rank + 1) * numel]
            self.inp.copy_(x)
        elif ir.inplace and coll == "reduce_scatter":
            self.inp = x.clone()
            self.out = self.inp[rank * numel:(rank + 1) * numel]
        else:
            self.inp = x.clone()
            self.out = torch.zeros(nout * numel, dtype=x.dtype)
        if self.inp.numel() != nin * numel:
            raise ScheduleError(f"rank {rank}'s input has {self.inp.numel()} elements, "
                                f"{ir.collective} needs {nin} x {numel}")
        self.scratch = torch.zeros(ir.scratch * self.s, dtype=x.dtype)

    def chunk(self, buf: str, c: int) -> torch.Tensor:
        lo, hi = self.ir.chunk_bounds(buf, c, self.E)
        return {"in": self.inp, "out": self.out, "scratch": self.scratch}[buf][lo:hi]

    def region(self, reg) -> List[torch.Tensor]:
        buf, start, count = reg
        return [self.chunk(buf, c) for c in range(start, start + count)]


def interpret(program, inputs: Sequence[torch.Tensor], op="sum", *, factor: Optional[float] = None,
              order: str = "first", seed: int = 0) -> List[torch.Tensor]:
    """Runs the program (Program or IR) on `inputs` (one tensor per rank; for reduce_scatter and
    all_to_all N blocks, else one) and returns each rank's output (for rooted collectives the
    non-root ranks' outputs are what the schedule left there). `factor`: premul_sum's scale."""
    ir = program if isinstance(program, IR) else program.lower()
    op = _op_name(op)
    N, coll = ir.ranks, ir.collective
    if len(inputs) != N:
        raise ScheduleError(f"{len(inputs)} inputs for a program of {N} ranks")
    numel = inputs[0].numel() // collectives.blocks(coll, "in", N)
    if op == "premul_sum" and factor is None:
        raise ScheduleError("premul_sum needs factor=")
    reducing = coll in collectives.REDUCING
    xs = []
    for x in inputs:
        x = x.detach().reshape(-1)
        if reducing and op == "premul_sum":  # each contribution scaled once, before it is reduced
            x = x * torch.tensor(factor, dtype=x.dtype)
        xs.append(x)
    bufs = [_Buffers(ir, r, xs[r], numel) for r in range(N)]

    # The steps in an order the dependencies allow.
    pos = [[0] * len(lanes) for lanes in ir.steps]
    done = [[0] * len(lanes) for lanes in ir.steps]  # steps finished per lane (a prefix)
    channels = {}
    received = {}  # (src, dst, lane) -> how many receives finished
    rng = random.Random(seed)
    total = ir.num_steps()
    D = ir.channel_depth

    def ready(r, l):
        i = pos[r][l]
        lst = ir.steps[r][l]
        if i >= len(lst):
            return False
        s = lst[i]
        for dl, di in s.deps:
            if done[r][dl] <= di:
                return False
        if s.op == "send":
            return received.get((r, s.peer, l), 0) >= s.seq - D + 1
        if s.op in ("recv", "recv_reduce"):
            q = channels.get((s.peer, r, l))
            return bool(q) and q[0][0] == s.seq
        return True

    lanes_all = [(r, l) for r in range(N) for l in range(len(ir.steps[r]))]
    ran = 0
    while ran < total:
        cand = [rl for rl in lanes_all if ready(*rl)]
        if not cand:
            raise ScheduleError(f"the schedule stops after {ran} of {total} steps: no step can run "
                                f"(check() names the cycle or the unmatched message)")
        if order == "random":
            rng.shuffle(cand)
        # Runs every ready lane once per round (or one, at random): a schedule's steps interleave.
        for r, l in (cand if order != "random" else cand[:1 + rng.randrange(len(cand))]):
            if not ready(r, l):
                continue
            s = ir.steps[r][l][pos[r][l]]
            b = bufs[r]
            if s.op == "send":
                channels.setdefault((r, s.peer, l), deque()).append((s.seq, [t.clone() for t in b.region(s.src)]))
            elif s.op in ("recv", "recv_reduce"):
                _, data = channels[(s.peer, r, l)].popleft()
                _apply(b.region(s.dst), data, op, s.op == "recv_reduce")
                key = (s.peer, r, l)
                received[key] = received.get(key, 0) + 1
            else:
                _apply(b.region(s.dst), [t.clone() for t in b.region(s.src)], op, s.op == "reduce")
            pos[r][l] += 1
            done[r][l] += 1
            ran += 1

    outs = []
    for r in range(N):
        out = bufs[r].out.clone()
        if reducing and op == "avg" and (coll != "reduce" or r == ir.root):
            if not out.dtype.is_floating_point:
                raise ScheduleError(f"avg needs a floating-point dtype, not {out.dtype}")
            out = out / N if out.dtype == torch.float64 else (out.double() / N).to(out.dtype)
        outs.append(out)
    return outs


def _apply(dst: List[torch.Tensor], src: List[torch.Tensor], op: str, reduce: bool) -> None:
    for d, s in zip(dst, src):
        n = min(d.numel(), s.numel())
        if n == 0:
            continue
        d, s = d[:n], s[:n]
        d.copy_(combine(d, s, op) if reduce else s)
