"""The memory floor of a CPU collective, measured in the same run: every rank at once runs the
one-pass torch op over the bytes it must touch at least once, with the threads pycoll gives a rank.

  all_reduce      x.add_(y) over the message (the issue's definition: read the input and one
                  other operand, write the result)
  reduce_scatter  the ranks' blocks of the input added into the output block: out = b0 + b1, then
                  out += b2, ... (reads the whole input once; with 2 ranks one pass in all).
                  torch.sum over dim 0 does the same work, but took 1.5-3.6x the time of the add
                  for 2 ranks (2-core CI-class machine, one thread, 1-64 MiB), which made every
                  reduce_scatter's fraction of the floor look that much better before 2026-11-29
  all_gather      out.copy_(src) over the whole output (every byte of it is written once)
  broadcast       dst.copy_(src) over the message (a non-root rank writes it once)
  sendrecv        dst.copy_(src) over the message (every rank reads its message once and writes
                  the one it receives once)
  send            dst.copy_(src) on the receiving ranks only (what a receive that read the
                  sender's memory directly would cost); the senders idle
  pingpong        two such copies one after the other on rank 0 (a round trip moves the message
                  twice, the second after the first); the other ranks idle

pycoll-bench prints, for each row, floor time / row time ("of floor": 1.0 means the row runs at
the memory's speed; Gloo's fraction is printed too). The floor assumes no byte is moved twice; a
shared-memory collective also has to cross between cores, so 0.8 of it is a good result.
"""

import torch

from .timing import estimate_seconds, time_calls

FLOOR_OPS = ("all_reduce", "reduce_scatter", "all_gather", "broadcast", "send", "sendrecv", "pingpong")


def threads_per_rank(ranks_on_host):
    """What pycoll's CPU engine gives one rank (csrc/cpu/lane_pool.h: PYCOLL_CPU_THREADS,
    else the CPUs this process may run on, less one, divided by the ranks on the host, at most 16)."""
    from .. import _C

    return _C.cpu_threads_per_rank(ranks_on_host)


def add_blocks(blocks, out):
    """out = blocks[0] + blocks[1] + ... (the reduce_scatter floor's one-pass add)."""
    if blocks.shape[0] == 1:
        return out.copy_(blocks[0])
    torch.add(blocks[0], blocks[1], out=out)
    for k in range(2, blocks.shape[0]):
        out.add_(blocks[k])
    return out


def floor_call(op, count, dtype, world, rank=0):
    """A callable running rank `rank`'s part of the floor's one-pass op for `op` with `count`
    elements (the size the benchmark names: the all_gather output, the reduce_scatter input)."""
    if (op == "send" and rank % 2 == 0) or (op == "pingpong" and rank != 0):
        return lambda: None
    if op == "all_reduce":
        x, y = torch.ones(count, dtype=dtype), torch.ones(count, dtype=dtype)
        return lambda: x.add_(y)
    if op == "reduce_scatter":
        m = count // world
        blocks, out = torch.ones(world, m, dtype=dtype), torch.empty(m, dtype=dtype)
        return lambda: add_blocks(blocks, out)
    if op in ("all_gather", "broadcast", "send", "sendrecv"):
        src, dst = torch.ones(count, dtype=dtype), torch.empty(count, dtype=dtype)
        return lambda: dst.copy_(src)
    if op == "pingpong":
        src, mid, dst = (torch.ones(count, dtype=dtype), torch.empty(count, dtype=dtype),
                         torch.empty(count, dtype=dtype))
        return lambda: (mid.copy_(src), dst.copy_(mid))
    raise ValueError(f"no memory floor for {op}")


def measure_floor(op, count, dtype, world, rank, ranks_on_host, budget_s, ctrl):
    """(microseconds per call of the floor op run by every rank at once, max over ranks; calls)."""
    fn = floor_call(op, count, dtype, world, rank)
    before = torch.get_num_threads()
    torch.set_num_threads(threads_per_rank(ranks_on_host))
    try:
        est = ctrl.max(estimate_seconds(fn, 2, False))
        iters = max(3, min(1000, int(round(budget_s / est)) if est > 0 else 1000))
        return ctrl.max(time_calls(fn, iters, False, ctrl.barrier)), iters
    finally:
        torch.set_num_threads(before)
