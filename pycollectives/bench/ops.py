"""The collectives pycoll-bench measures: buffers, the torch.distributed call, busbw factor.

Terms (nccl-tests):
  size   bytes of the op's largest buffer: all_gather's output, reduce_scatter's input,
         all_to_all's input (= output), the buffer itself for the others.
  count  elements in that buffer; ``chunk`` = count / world, one rank's share.
  algbw  size / time.
  busbw  algbw * factor(world): the bytes each rank's busiest link must carry, normalised so
         that the figure is comparable across ops and world sizes (nccl-tests PERFORMANCE.md).
"""
import torch
import torch.distributed as dist

from . import checker

# The 2.14 names (``*_single``) forward to the same backend entry points as the older ones
# and do not warn; fall back to the older names on older torch.
_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor

REDUCE_OP = {
    "sum": dist.ReduceOp.SUM,
    "avg": dist.ReduceOp.AVG,
    "prod": dist.ReduceOp.PRODUCT,
    "min": dist.ReduceOp.MIN,
    "max": dist.ReduceOp.MAX,
}


class Collective:
    """One collective: ``setup`` allocates buffers for a size, ``fill`` writes the known
    inputs, ``bind`` returns a zero-argument callable issuing the op once on a group and
    waiting for it, ``result`` is the tensor ``checker.expected`` describes."""
    name = ""
    reduces = False          # takes a reduce op
    split = False            # the buffer is cut into ``world`` chunks: size must divide
    inplace = "both"         # "both", "always" (in place by definition), "never"
    min_world = 1
    async_op = False         # --async-op: issue with async_op=True, then wait on the Work

    def call(self, fn, *args, **kwargs):
        """A zero-argument callable that issues ``fn(*args, **kwargs)`` once and waits for it."""
        if self.async_op:
            return lambda: fn(*args, async_op=True, **kwargs).wait()
        return lambda: fn(*args, **kwargs)

    @staticmethod
    def busbw_factor(world):
        return 1.0

    def setup(self, count, dtype, device, rank, world, inplace):
        raise NotImplementedError

    def fill(self, bufs, rank, world, reduce_op, root, for_timing):
        """The known inputs (for --check), or ones for timing: cheap to write at any size,
        and repeated in-place products never sink into denormals (slow on CPUs)."""
        src = bufs["input"]
        if for_timing:
            src.fill_(1)
        else:
            src.copy_(checker.pattern(rank, 0, src.numel(), src.dtype, src.device, reduce_op))

    def result(self, bufs):
        return bufs["output"]

    def is_inplace(self, inplace):
        return {"both": bool(inplace), "always": True, "never": False}[self.inplace]


class SeparateBuffers(Collective):
    """An op with an input and an output buffer of the same size that never alias."""
    inplace = "never"

    def setup(self, count, dtype, device, rank, world, inplace):
        return {"input": torch.empty(count, dtype=dtype, device=device),
                "output": torch.empty(count, dtype=dtype, device=device)}


class AllReduce(Collective):
    name = "all_reduce"
    reduces = True
    inplace = "always"

    @staticmethod
    def busbw_factor(world):
        return 2.0 * (world - 1) / world

    def setup(self, count, dtype, device, rank, world, inplace):
        buf = torch.empty(count, dtype=dtype, device=device)
        return {"input": buf, "output": buf}

    def bind(self, bufs, group, op, root, rank, world):
        x = bufs["input"]
        return self.call(dist.all_reduce, x, op=op, group=group)


class Reduce(AllReduce):
    name = "reduce"

    @staticmethod
    def busbw_factor(world):
        return 1.0

    def bind(self, bufs, group, op, root, rank, world):
        x = bufs["input"]
        dst = dist.get_global_rank(group, root)
        return self.call(dist.reduce, x, dst, op=op, group=group)


class Broadcast(Collective):
    name = "broadcast"
    inplace = "always"

    def setup(self, count, dtype, device, rank, world, inplace):
        buf = torch.empty(count, dtype=dtype, device=device)
        return {"input": buf, "output": buf}

    def bind(self, bufs, group, op, root, rank, world):
        x = bufs["input"]
        src = dist.get_global_rank(group, root)
        return self.call(dist.broadcast, x, src, group=group)


class AllGather(Collective):
    name = "all_gather"
    split = True

    @staticmethod
    def busbw_factor(world):
        return (world - 1) / world

    def setup(self, count, dtype, device, rank, world, inplace):
        chunk = count // world
        out = torch.empty(count, dtype=dtype, device=device)
        inp = out.narrow(0, rank * chunk, chunk) if inplace else torch.empty(chunk, dtype=dtype, device=device)
        return {"input": inp, "output": out}

    def fill(self, bufs, rank, world, reduce_op, root, for_timing):
        if not for_timing:
            bufs["output"].fill_(checker.SENTINEL)   # a rank's chunk that is never written shows up
        super().fill(bufs, rank, world, reduce_op, root, for_timing)

    def bind(self, bufs, group, op, root, rank, world):
        out, inp = bufs["output"], bufs["input"]
        return self.call(_all_gather, out, inp, group=group)


class ReduceScatter(Collective):
    name = "reduce_scatter"
    reduces = True
    split = True

    @staticmethod
    def busbw_factor(world):
        return (world - 1) / world

    def setup(self, count, dtype, device, rank, world, inplace):
        chunk = count // world
        inp = torch.empty(count, dtype=dtype, device=device)
        out = inp.narrow(0, rank * chunk, chunk) if inplace else torch.empty(chunk, dtype=dtype, device=device)
        return {"input": inp, "output": out}

    def bind(self, bufs, group, op, root, rank, world):
        out, inp = bufs["output"], bufs["input"]
        return self.call(_reduce_scatter, out, inp, op=op, group=group)


class AllToAll(SeparateBuffers):
    name = "all_to_all"
    split = True

    @staticmethod
    def busbw_factor(world):
        return (world - 1) / world


    def bind(self, bufs, group, op, root, rank, world):
        out, inp = bufs["output"], bufs["input"]
        return self.call(dist.all_to_all_single, out, inp, group=group)


class SendRecv(SeparateBuffers):
    """nccl-tests' sendrecv: every rank sends its buffer to rank+1 and receives rank-1's,
    both at once (one batch_isend_irecv, so NCCL groups them and cannot deadlock)."""
    name = "sendrecv"
    min_world = 2


    def bind(self, bufs, group, op, root, rank, world):
        nxt = dist.get_global_rank(group, (rank + 1) % world)
        prv = dist.get_global_rank(group, (rank - 1) % world)
        p2p = [dist.P2POp(dist.isend, bufs["input"], nxt, group),
               dist.P2POp(dist.irecv, bufs["output"], prv, group)]

        def run():
            for work in dist.batch_isend_irecv(p2p):
                work.wait()
        return run


class Send(SeparateBuffers):
    """One direction: rank 2i sends its buffer to rank 2i+1 with ``dist.send``, which receives it
    with ``dist.recv`` (a last rank of an odd world idles). Back-to-back calls, so the time per call
    is what a stream of messages between a pipeline's stages gets."""
    name = "send"
    min_world = 2


    def bind(self, bufs, group, op, root, rank, world):
        if rank % 2 == 0 and rank + 1 < world:
            dst = dist.get_global_rank(group, rank + 1)
            x = bufs["input"]
            return lambda: dist.send(x, dst, group=group)
        if rank % 2 == 1:
            src = dist.get_global_rank(group, rank - 1)
            y = bufs["output"]
            return lambda: dist.recv(y, src, group=group)
        return lambda: None


class PingPong(SeparateBuffers):
    """A round trip: rank 0 sends its buffer to rank 1 and receives it back; rank 1 receives and
    sends what it got back (the other ranks idle). A call is the whole round trip, so half the
    time is one message's latency; busbw counts both messages."""
    name = "pingpong"
    min_world = 2

    @staticmethod
    def busbw_factor(world):
        return 2.0


    def bind(self, bufs, group, op, root, rank, world):
        peer = dist.get_global_rank(group, 1 - rank) if rank < 2 else None
        x, y = bufs["input"], bufs["output"]
        if rank == 0:
            def run():
                dist.send(x, peer, group=group)
                dist.recv(y, peer, group=group)
            return run
        if rank == 1:
            def run():
                dist.recv(y, peer, group=group)
                dist.send(y, peer, group=group)
            return run
        return lambda: None


COLLECTIVES = {c.name: c() for c in (AllReduce, AllGather, ReduceScatter, Broadcast, Reduce, AllToAll, SendRecv,
                                     Send, PingPong)}
DEFAULT_OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast")


def skip_reason(op, nbytes, elem_size, world):
    """Why ``op`` cannot run at ``nbytes`` bytes on ``world`` ranks, or None."""
    coll = COLLECTIVES[op]
    if world < coll.min_world:
        return f"{op} needs at least {coll.min_world} ranks"
    if nbytes % elem_size:
        return f"{nbytes} B is not a whole number of {elem_size}-byte elements"
    if coll.split and nbytes // elem_size < world:
        return f"{nbytes} B holds fewer than {world} {elem_size}-byte elements (one per rank)"
    return None


def run_count(op, nbytes, elem_size, world):
    """The elements ``op`` runs with at a swept size of ``nbytes``. An op that cuts its buffer
    into one chunk per rank takes the largest multiple of ``world`` that fits (as nccl-tests
    does), so a sweep of powers of two on 3 ranks measures every size instead of none; the row
    records the bytes that ran."""
    count = nbytes // elem_size
    return count - count % world if COLLECTIVES[op].split else count
