"""Shared pieces of the CPU collective tests (test_cpu_*.py): every collective on CPU tensors
against a plain torch computation.

One pytest test per (world size, op family[, algorithm]); each spawns one
world and loops over dtypes x reduce ops x shapes inside the ranks (spawning
costs far more than a small collective).  Every rank generates every rank's
input from a seed (session seed, case number, rank), so each rank can compute
the reference locally and the ranks keep issuing the same collectives even
when a local check fails: failures are collected and reported together, the
first one with all its parameters (`Cases`).
"""

import collections
import contextlib
import os
import re
import sys
import zlib

import pytest
import torch
import torch.distributed as dist

from ranks import ALGOS, IS_GLOO, quiet, set_algo
from reference import FLOAT_OPS, INT_OPS, dist_op, filler, gen, name, reduce_ref

WORLD_SIZES = [1, 2, 3, 4]
P2P_WORLD_SIZES = [2, 3, 4]

# Shapes: ("contig", n) is a fresh 1-D tensor; ("strided", n) a view of every
# other element of a 2n buffer (the elements in between must survive);
# ("transposed", (a, b)) the transpose of a (b, a) tensor (dense but not
# contiguous).  Sizes: empty, one element, odd primes, and a prime above any
# sensible chunk or pipeline size.
SHAPES = [("contig", 0), ("contig", 1), ("contig", 7), ("contig", 1031),
          ("strided", 1031), ("transposed", (7, 13))]
SHAPES_ALL_REDUCE = SHAPES + [("contig", 65537)]
SIZES = [0, 1, 7, 1031]

# What Gloo -- the stand-in while the extension is not built -- gets wrong or
# rejects.  These cases are left out only when PYCOLL_TEST_BACKEND=gloo;
# pycoll must pass them.
GLOO_GAPS = {
    # Non-contiguous tensors: Gloo reads and writes a view as if it were
    # contiguous memory (wrong results, memory between the elements
    # overwritten: all_reduce, reduce, broadcast, scatter), or raises
    # "Tensors must be contiguous" / "input tensor has to be contiguous".
    "strided",
    "transposed",
    # "ProcessGroupGloo::allgather: invalid tensor size": no (W, n) output.
    "all_gather_into_tensor stacked",
    # Checks outputShape[0] * W == inputShape[0]: no (W, n) input.
    "reduce_scatter_tensor stacked",
    # "ProcessGroupGloo::alltoall: invalid tensor size": equal sizes only.
    "all_to_all list uneven",
}


def gloo_cannot(what):
    return IS_GLOO and what in GLOO_GAPS


def shapes(specs):
    return [s for s in specs if not gloo_cannot(s[0])]


MIB8 = 8 << 20


# Forcing an algorithm is a pycoll feature: under Gloo only "auto" runs, and it
# forces nothing.
def algo_params(names):
    return [a if a == "auto" else pytest.param(a, marks=pytest.mark.pycoll_only)
            for a in names]


ALL_REDUCE_ALGOS = algo_params(ALGOS)
SCATTER_GATHER_ALGOS = algo_params(["ring", "twoshot", "auto"])


# --------------------------------------------------------------------------
# inputs, references, comparisons (run inside the ranks)


def reduce_ops(dtype):
    if dtype.is_floating_point:
        ops = FLOAT_OPS
    else:
        ops = INT_OPS
    if IS_GLOO:  # Gloo rejects PREMUL_SUM ("Cannot use ReduceOp.PREMUL_SUM with Gloo")
        ops = [o for o in ops if o != "PREMUL_SUM"]
    return ops


def shape_of(spec):
    layout, n = spec
    return tuple(n) if layout == "transposed" else (n,)


def place(values, spec):
    """A tensor holding `values` in the layout of `spec`, plus a guard: the
    memory around a strided view, which no op may touch."""
    layout, _ = spec
    if layout == "contig":
        return values.clone(), None
    if layout == "strided":
        n = values.numel()
        base = gen(values.dtype, "data", (2 * n,), 987654321 + n)
        view = base[::2]
        view.copy_(values)
        assert not view.is_contiguous() or n <= 1
        return view, (base, base[1::2].clone())
    if layout == "transposed":
        a, b = values.shape
        t = torch.empty((b, a), dtype=values.dtype).t()
        t.copy_(values)
        assert not t.is_contiguous()
        return t, None
    raise ValueError(layout)


def compare(got, ref, bound=None):
    """None when `got` matches, else a message with the first bad element."""
    if tuple(got.shape) != tuple(ref.shape):
        return f"shape {tuple(got.shape)}, expected {tuple(ref.shape)}"
    if got.dtype != (ref.dtype if bound is None else got.dtype):
        return f"dtype {got.dtype}, expected {ref.dtype}"
    if got.numel() == 0:
        return None
    g = got.reshape(-1)
    r = ref.reshape(-1)
    if bound is None:
        if torch.equal(g, r):
            return None
        bad = (g != r).nonzero()
        i = int(bad[0])
        return (f"{bad.numel()} of {g.numel()} elements differ; first at flat index {i}: "
                f"got {g[i].item()!r}, expected {r[i].item()!r}")
    b = bound.reshape(-1) if isinstance(bound, torch.Tensor) else torch.full_like(r, bound)
    err = (g.double() - r).abs()
    bad = ~(err <= b)  # NaN counts as bad
    if not bad.any():
        return None
    idx = bad.nonzero()
    i = int(idx[0])
    return (f"{idx.numel()} of {g.numel()} elements out of tolerance; first at flat index {i}: "
            f"got {g[i].item()!r}, expected {r[i].item()!r} +- {b[i].item():.3g} "
            f"(max error {err.max().item():.3g})")


class CaseError(RuntimeError):
    pass


class Cases:
    """Numbered cases inside one rank, with failures collected."""

    def __init__(self, what, rank, world_size, seed, **fixed):
        self.what = what
        self.rank = rank
        self.world_size = world_size
        self.base_seed = seed
        self.fixed = fixed
        self.count = 0
        self.params = {}
        self.failures = []
        self.pending, self.pending_bytes = [], 0

    def describe(self):
        params = {**self.fixed, **self.params}
        text = " ".join(f"{k}={name(v) if isinstance(v, torch.dtype) else v}"
                        for k, v in params.items())
        return (f"[{self.what} case {self.count}: world_size={self.world_size} "
                f"rank={self.rank} {text} seed={self.base_seed}]")

    @contextlib.contextmanager
    def case(self, **params):
        self.count += 1
        self.params = params
        try:
            yield self
        except CaseError:
            raise
        except Exception as e:
            raise CaseError(f"{self.describe()} raised {type(e).__name__}: {e}") from e

    def seed(self, rank=-1):
        """Seed of `rank`'s input in this case (-1: shared by all ranks)."""
        return (self.base_seed * 1_000_003 + self.count * 8191 + (rank + 1) * 131) % 2**62

    def keyed_seed(self, *key):
        """A seed that depends only on the session seed, the current case's
        parameters and `key` (not on the case number)."""
        text = repr((self.base_seed, sorted(self.params.items()), key))
        return zlib.crc32(text.encode()) * 7919 % 2**62

    def fail(self, what, msg):
        self.failures.append(f"{self.describe()} {what}: {msg}")

    def check(self, what, got, ref, bound=None):
        msg = compare(got, ref, bound)
        if msg:
            self.fail(what, msg)

    def expect(self, cond, what):
        if not cond:
            self.fail(what, "not true")

    def check_guard(self, guard):
        if guard is not None:
            base, saved = guard
            msg = compare(base[1::2], saved)
            if msg:
                self.fail("memory between the strided elements", "was overwritten: " + msg)

    def check_identical(self, t):
        """Every rank's `t` must be bitwise identical.  The bytes are queued
        and compared in batches, one dist.all_gather per batch; the batch
        boundaries depend only on sizes, so every rank flushes at the same
        point.  Every rank must call this (and finish) in the same order."""
        mine = t.detach().contiguous().reshape(-1).view(torch.uint8).clone()
        self.pending.append((self.describe(), mine))
        self.pending_bytes += mine.numel()
        if self.pending_bytes >= (1 << 20):
            self.flush_identical()

    def flush_identical(self):
        if not self.pending:
            return
        mine = torch.cat([b for _, b in self.pending])
        outs = [torch.empty_like(mine) for _ in range(self.world_size)]
        dist.all_gather(outs, mine)
        for r, other in enumerate(outs):
            if torch.equal(other, mine):
                continue
            off = 0
            for desc, b in self.pending:
                seg = other[off:off + b.numel()]
                if not torch.equal(seg, b):
                    first = int((seg != b).nonzero()[0])
                    self.failures.append(
                        f"{desc} bitwise identity: rank {r}'s result differs from "
                        f"rank {self.rank}'s (first at byte {first})")
                off += b.numel()
        self.pending, self.pending_bytes = [], 0

    def finish(self):
        self.flush_identical()
        if self.failures:
            shown = "\n".join(self.failures[1:8])
            more = f"\n... and {len(self.failures) - 8} more" if len(self.failures) > 8 else ""
            raise AssertionError(
                f"{self.failures[0]}\n({len(self.failures)} failed checks in {self.count} "
                f"cases of {self.what} on rank {self.rank}; the next ones:)\n{shown}{more}")
        return self.count


def force(cases, algo):
    """Force `algo` for this rank (pycoll) and check that the backend says so."""
    if IS_GLOO:
        return
    set_algo(algo)
    import pycollectives

    got = pycollectives.get_algo()
    ok = got in (None, "auto") if algo == "auto" else got == algo
    if not ok:
        cases.fail("get_algo", f"returned {got!r} after set_algo({algo!r})")


# With PYCOLL_DEBUG=INFO pycoll logs one line per op to stderr:
#   [pycoll 0/3] allreduce algo=ring bytes=4124 time=12.5us
# which shows whether a forced algorithm really ran.
LOG_LINE = re.compile(r"\[pycoll \d+/\d+\] (\w+) algo=(\w+)")
DIRECT = {"twoshot", "oneshot"}  # all_gather / reduce_scatter's "direct"


def debug_env(algo):
    return {} if IS_GLOO or algo == "auto" else {"PYCOLL_DEBUG": "INFO"}


def check_algo_log(cases, algo, op_prefix, allowed):
    """Every `op_prefix*` op this rank logged ran an algorithm in `allowed`."""
    if IS_GLOO or algo == "auto" or cases.world_size == 1:
        return  # one rank: every algorithm is the same local copy
    sys.stderr.flush()
    with open(os.environ["PYCOLL_TEST_LOG"], errors="replace") as f:
        seen = [m.groups() for m in LOG_LINE.finditer(f.read())]
    ran = collections.Counter(a for op, a in seen if op.startswith(op_prefix))
    if not ran:
        cases.fail("PYCOLL_DEBUG=INFO log", f"no {op_prefix} line with algo= (forced {algo})")
    elif set(ran) - set(allowed):
        cases.fail("forced algorithm", f"set_algo({algo!r}) but {op_prefix} ran {dict(ran)}")


def check_one_all_reduce(cases, rank, ws, dtype, op, n):
    """all_reduce of n elements against the reference, identical on every rank."""
    xs = [gen(dtype, op, (n,), cases.seed(r)) for r in range(ws)]
    t = xs[rank].clone()
    dist.all_reduce(t, op=dist_op(op))
    ref, bound = reduce_ref(xs, op, dtype)
    cases.check("result", t, ref, bound)
    cases.check_identical(t)


# ---------------------------------------------------------------------------------------------
# point-to-point helpers (run inside the ranks)


def no_cpu_to_spare(ws):
    """Large shared sends skip the channel only where the ranks have no CPU to spare (fewer than 2
    per rank, decision 0020): this rank runs on at most `ws` CPUs, as on the 2-core CI machine."""
    os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[:ws])


def elems(dtype, nbytes):
    """How many elements of `dtype` fit in `nbytes`."""
    return nbytes // torch.empty((), dtype=dtype).element_size()


def rank_log():
    """This rank's output so far (its stdout and stderr, ranks.run_ranks)."""
    sys.stderr.flush()
    with open(os.environ["PYCOLL_TEST_LOG"], errors="replace") as f:
        return f.read()


# ---------------------------------------------------------------------------------------------
# point-to-point larger than the channel, the sender's tensor shared ("send": the message goes by
# reference, test_cpu_p2p_by_reference.py) or the receiver's ("recv": the sender writes into it,
# test_cpu_p2p_into_receiver.py). The channel is set to 64 KiB so that messages of a few hundred
# KiB are "larger than the channel".

P2P_CHANNEL = 64 << 10
P2P_ENV = {"PYCOLL_P2P_CHANNEL_BYTES": str(P2P_CHANNEL), "PYCOLL_DEBUG": "INFO"}
P2P_PG_TIMEOUT_S = 4  # p2p_withdrawn_rank's group timeout


def p2p_direct_count(shared):
    """How many messages skipped the channel so far: received by reference ("send", counted by the
    receiver) or written into the receiver ("recv", counted by the sender)."""
    from pycollectives import _C

    return _C._test_p2p_by_reference() if shared == "send" else _C._test_p2p_into_receiver()


def p2p_tensor(t, shared, side):
    """`t` itself, or moved into a shared file where `side` ("send" or "recv") is the shared one."""
    return t.share_memory_() if shared == side else t


def p2p_sender_writes_after_wait(cases, rank, nxt, prv, shared):
    """The send completes only once its bytes are in the receiver's tensor: writing the sent tensor
    after the send returned does not reach the receiver."""
    with cases.case(kind="sender writes after wait"):
        n = elems(torch.float32, 3 * P2P_CHANNEL)
        src = p2p_tensor(gen(torch.float32, "data", (n,), cases.keyed_seed(rank)), shared, "send")
        got = p2p_tensor(filler(torch.float32, (n,)), shared, "recv")
        r = dist.irecv(got, src=prv, tag=6)
        dist.send(src, dst=nxt, tag=6)
        src.fill_(-1.0)
        r.wait()
        dist.barrier()
        cases.check("received the bytes as they were at the send", got,
                    gen(torch.float32, "data", (n,), cases.keyed_seed(prv)))


def p2p_dead_receiver_rank(rank, ws, shared):
    """Rank 1 exits without receiving; rank 0's large send raises within 15 s (returns its error)."""
    import time

    quiet()
    no_cpu_to_spare(ws)
    if rank == 1:
        dist.barrier()
        os._exit(3)  # never receives
    src = p2p_tensor(torch.ones(elems(torch.float32, 3 * P2P_CHANNEL)), shared, "send")
    dist.barrier()
    t0 = time.monotonic()
    try:
        dist.send(src, dst=1)
    except RuntimeError as e:
        took = time.monotonic() - t0
        assert took < 15, f"raised only after {took:.1f}s: {e}"
        return str(e)
    raise AssertionError("a send to a receiver that died returned")


def p2p_withdrawn_rank(rank, ws, shared):
    """Rank 0's large send times out (P2P_PG_TIMEOUT_S) before rank 1 posts its receive: the send
    raises (rank 0 returns its error), and the receive posted afterwards fails instead of delivering
    bytes (rank 1 returns its error and the sum of |received tensor|, which must stay 0)."""
    import time

    quiet()
    no_cpu_to_spare(ws)
    n = elems(torch.float32, 3 * P2P_CHANNEL)
    dist.barrier()
    if rank == 0:
        src = p2p_tensor(torch.ones(n), shared, "send")
        try:
            dist.send(src, dst=1)
        except RuntimeError as e:
            src.fill_(-1.0)  # the caller owns its buffer again once the send has failed
            return str(e)
        raise AssertionError("a send that no receive matched in time returned")
    time.sleep(P2P_PG_TIMEOUT_S + 2)  # past rank 0's deadline
    got = p2p_tensor(torch.zeros(n), shared, "recv")
    try:
        dist.recv(got, src=0)
    except RuntimeError as e:
        return str(e), got.abs().sum().item()
    raise AssertionError(f"the receive of a withdrawn message returned; got {got[:3].tolist()}")


def p2p_spare_cpus_rank(rank, ws, seed, shared):
    """With two CPUs or more per rank, a large send streams through the channel even where it could
    skip it (the channel's two copies then run on two cores at once)."""
    quiet()
    cases = Cases(f"p2p, {shared} tensor shared, spare CPUs", rank, ws, seed)
    n = elems(torch.float32, 3 * P2P_CHANNEL) + 1
    with cases.case():
        mine = gen(torch.float32, "data", (n,), cases.keyed_seed(rank))
        got = p2p_tensor(filler(torch.float32, (n,)), shared, "recv")
        before = p2p_direct_count(shared)
        w = dist.isend(p2p_tensor(mine.clone(), shared, "send"), dst=1 - rank)
        dist.recv(got, src=1 - rank)
        w.wait()
        cases.check("received", got, gen(torch.float32, "data", (n,), cases.keyed_seed(1 - rank)))
        cases.expect(p2p_direct_count(shared) == before, "a send skipped the channel where the ranks have CPUs to spare")
    return cases.finish()


def p2p_size_mismatch_then_good(cases, rank, nxt, prv, shared):
    """Inside a case: a receive of the wrong size fails and names the sizes; the next large message
    still arrives (both ranks' counts of the messages that skip the channel stay in step)."""
    n = elems(torch.float32, 2 * P2P_CHANNEL)
    first = p2p_tensor(gen(torch.float32, "data", (n,), cases.keyed_seed(rank, 1)), shared, "send")
    second = p2p_tensor(gen(torch.float32, "data", (n,), cases.keyed_seed(rank, 2)), shared, "send")
    works = [dist.isend(first, dst=nxt, tag=9), dist.isend(second, dst=nxt, tag=10)]
    try:
        dist.recv(p2p_tensor(filler(torch.float32, (n - 1,)), shared, "recv"), src=prv, tag=9)
        cases.fail("a receive of the wrong size", "did not raise")
    except RuntimeError as e:
        cases.expect("expects" in str(e), f"the error does not name the sizes: {e}")
    got = p2p_tensor(filler(torch.float32, (n,)), shared, "recv")
    dist.recv(got, src=prv, tag=10)
    for w in works:
        w.wait()
    cases.check("received after the mismatch", got, gen(torch.float32, "data", (n,), cases.keyed_seed(prv, 2)))


def p2p_through_the_channel(cases, rank, nxt, prv, shared, kinds):
    """Messages that must not skip the channel arrive as before and are not counted. kinds: (name,
    elements, whether the `shared` side's tensor is shared)."""
    for kind, n, share in kinds:
        with cases.case(kind=kind):
            side = shared if share else None
            got = p2p_tensor(filler(torch.float32, (n,)), side, "recv")
            before = p2p_direct_count(shared)
            w = dist.isend(p2p_tensor(gen(torch.float32, "data", (n,), cases.keyed_seed(rank)), side, "send"),
                           dst=nxt, tag=7)
            dist.recv(got, src=prv, tag=7)
            w.wait()
            cases.check("received", got, gen(torch.float32, "data", (n,), cases.keyed_seed(prv)))
            cases.expect(p2p_direct_count(shared) == before, f"a {kind} message skipped the channel")


def p2p_out_of_order_tags(cases, rank, shared, want):
    """Rank 0 sends rank 1 three large messages with tags 1, 2, 3, which rank 1 receives as 3, 1, 2;
    then the same from any source. The rank that counts (the receiver of messages by reference, the
    sender of messages into the receiver) expects want[any_source] of them to have skipped the channel."""
    n = elems(torch.float32, 4 * P2P_CHANNEL) + 1
    msgs = {tag: gen(torch.float32, "data", (n,), cases.keyed_seed(tag)) for tag in (1, 2, 3)}
    counting = 1 if shared == "send" else 0
    for any_source in (False, True):
        with cases.case(any_source=any_source):
            before = p2p_direct_count(shared)
            if rank == 0:
                srcs = {tag: p2p_tensor(m.clone(), shared, "send") for tag, m in msgs.items()}
                works = [dist.isend(srcs[tag], dst=1, tag=tag) for tag in (1, 2, 3)]
                for w in works:
                    w.wait()
                for tag, m in msgs.items():
                    cases.check(f"sent tensor {tag} unchanged", srcs[tag], m)
            elif rank == 1:
                for tag in (3, 1, 2):
                    got = p2p_tensor(filler(torch.float32, (n,)), shared, "recv")
                    w = dist.irecv(got, src=None if any_source else 0, tag=tag)
                    w.wait()
                    cases.check(f"message {tag}", got, msgs[tag])
                    if any_source:
                        cases.expect(w._source_rank() == 0, f"source {w._source_rank()}, expected 0")
            if rank == counting:
                got = p2p_direct_count(shared) - before
                cases.expect(got == want[any_source], f"{got} messages skipped the channel, expected {want[any_source]}")
            dist.barrier()


def p2p_refused_messages(cases, rank, shared):
    """Rank 0 sends rank 1 three large messages that may not skip the channel (the peer's files
    cannot be mapped): each arrives, the sent tensor unchanged, and none is counted."""
    n = elems(torch.float32, 3 * P2P_CHANNEL) + 5
    counting = 1 if shared == "send" else 0
    for i in range(3):
        with cases.case(message=i):
            m = gen(torch.float32, "data", (n,), cases.keyed_seed(i))
            before = p2p_direct_count(shared)
            if rank == 0:
                src = p2p_tensor(m.clone(), shared, "send")
                dist.send(src, dst=1)
                cases.check("sent tensor unchanged", src, m)
            else:
                got = p2p_tensor(filler(torch.float32, (n,)), shared, "recv")
                dist.recv(got, src=0)
                cases.check("received", got, m)
            if rank == counting:
                cases.expect(p2p_direct_count(shared) == before, "a refused message skipped the channel")
