"""The fuzzer's core: one rank's side of a seeded random op sequence (the op mix, shared draws,
Gloo helpers and checks, issuing and completing ops). The ops themselves are mixins by family.
"""

import os
import random
import sys

import torch
import torch.distributed as dist

from ranks import ALGOS  # what pycollectives.set_algo accepts
from reference import DTYPES, FLOAT_OPS, INT_OPS, gen, reduce_ref

from .coalesced import CoalescedOps
from .data_movement import DataMovementOps
from .groups import GROUP_WEIGHTS, make_groups
from .point_to_point import PointToPointOps
from .reductions import ReductionOps
from .tensors import as_bytes, compare

# Relative frequency of each op kind.  The first len(KINDS) ops of a
# sequence are every kind once (in a seeded order), so that no kind is left
# out even in a short run.
KINDS = {
    "all_reduce": 14, "reduce": 6, "broadcast": 6, "all_gather": 5,
    "all_gather_into_tensor": 6, "reduce_scatter": 5, "reduce_scatter_tensor": 6,
    "all_to_all": 5, "all_to_all_single": 7, "gather": 4, "scatter": 4, "barrier": 3,
    "send_recv": 6, "batch_isend_irecv": 5, "coalesced": 7,
}
P2P_KINDS = {"send_recv", "batch_isend_irecv"}

MIB = 1 << 20


class FuzzError(RuntimeError):
    pass


class _Pending:
    __slots__ = ("index", "desc", "group", "waitable", "finish")

    def __init__(self, index, desc, group, waitable, finish):
        self.index, self.desc, self.group = index, desc, group
        self.waitable, self.finish = waitable, finish


class FuzzerCore:
    """Everything of a Fuzzer but its ops: the sequence, shared draws, Gloo
    helpers and checks, bookkeeping (arguments: see Fuzzer)."""

    def __init__(self, rank, ws, seed, *, check=True, trace=False, max_bytes=MIB,
                 max_pending=8, groups=None, algos=ALGOS, set_algo_with_pending=None, device="cpu"):
        self.rank, self.ws, self.seed = rank, ws, seed
        # Where pycoll's tensors live; Gloo's and the references stay on CPU.  No rng draw
        # depends on it: a seed gives the same sequence on CPU and on a GPU.
        self.device = torch.device(device)
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        self.rng = random.Random(seed)
        self.check = check
        self.trace = trace
        self.max_bytes = max_bytes
        self.max_pending = max_pending
        self.groups = groups if groups is not None else make_groups(rank, ws)
        self.pending = []
        self.failures = []
        self.n_failures = 0
        self.first_failed_op = None
        self.index = -1
        self.desc = ""
        self.group = None
        self.counts = {}
        self.algos = list(algos or ())
        self.algo = "auto"
        if set_algo_with_pending is None:
            set_algo_with_pending = os.environ.get("PYCOLL_FUZZ_SET_ALGO_PENDING", "1") == "1"
        self.set_algo_with_pending = set_algo_with_pending
        self.first_kinds = list(KINDS)
        self.rng.shuffle(self.first_kinds)

    # ---- context and bookkeeping

    def where(self, index=None, desc=None, group=None):
        index = self.index if index is None else index
        on = "" if self.device.type == "cpu" else f" device={self.device}"
        return (f"[fuzz seed={self.seed} op #{index} ws={self.ws} rank={self.rank}{on} "
                f"group={group or self.group} algo={self.algo}: {desc or self.desc}]")

    def fail(self, what, msg):
        if not self.n_failures:
            self.first_failed_op = self.index
        self.n_failures += 1
        if len(self.failures) < 50:
            self.failures.append(f"{self.where()} {what}: {msg}")

    def expect(self, what, got, ref, bound=None, bitwise=False):
        msg = compare(got, ref, bound, bitwise)
        if msg:
            self.fail(what, msg)

    def count(self, key):
        self.counts[key] = self.counts.get(key, 0) + 1

    def dev(self, t):
        """Fresh CPU tensor `t` where pycoll's tensors live (on CPU, `t` itself)."""
        return t if self.device.type == "cpu" else t.to(self.device)

    def dev_copy(self, t):
        """A copy of CPU tensor `t` where pycoll's tensors live."""
        return t.clone() if self.device.type == "cpu" else t.to(self.device)

    def is_completed(self, w):
        """Work.is_completed() after its wait().  On a GPU, wait() makes the current stream wait
        for the op, not the host (as ProcessGroupNCCL): the op is complete once that stream is."""
        if self.device.type == "cuda":
            torch.cuda.current_stream(self.device).synchronize()
        return w.is_completed()

    def seed_of(self, k=0, rank=None):
        """Seed of a rank's tensor `k` in the current op."""
        rank = self.rank if rank is None else rank
        return (self.seed * 1_000_003 + self.index * 8191 + rank * 131 + k * 17) % 2**62

    # ---- shared draws (every rank, member or not)

    def dtype(self, floats_only=False):
        return self.rng.choice([d for d in DTYPES if d.is_floating_point] if floats_only else DTYPES)

    def redop(self, dtype):
        op = self.rng.choice(FLOAT_OPS if dtype.is_floating_point else INT_OPS)
        factor = 0.25 + 1.75 * self.rng.random() if op == "PREMUL_SUM" else None
        return op, factor

    def numel(self, dtype, mult=1):
        """0, 1, odd sizes, and now and then up to max_bytes over `mult` tensors."""
        cap = max(1, self.max_bytes // dtype.itemsize // mult)
        r = self.rng.random()
        if r < 0.08:
            n = 0
        elif r < 0.16:
            n = 1
        elif r < 0.70:
            n = self.rng.randrange(3, 1025, 2)
        elif r < 0.93:
            n = self.rng.randrange(1025, 32769, 2)
        else:
            n = self.rng.randrange(cap // 4, cap + 1) | 1
        return min(n, cap)

    def shape(self, dtype, mult=1, transposed=False):
        """(shape, layout): 1-D contig or strided, or a 2-D transposed view."""
        r = self.rng.random()
        if transposed and r < 0.1:
            return (self.rng.randrange(2, 40), self.rng.randrange(2, 40)), "transposed"
        n = self.numel(dtype, mult)
        layout = "strided" if r > 0.8 and n >= 2 else "contig"
        return (n,), layout

    def is_async(self):
        return self.rng.random() < 0.3

    def split_matrix(self, size, n):
        """S[i][j]: elements group rank i sends to group rank j (zeros included)."""
        return [[0 if self.rng.random() < 0.2 else self.rng.randrange(0, n + 3)
                 for _ in range(size)] for _ in range(size)]

    # ---- Gloo helpers (members of the group only)

    def gathered(self, grp, x):
        """Every group rank's `x` (any shape; sizes may differ: `numels` per
        group rank when they do), through the Gloo twin."""
        flat = x.detach().contiguous().reshape(-1)
        outs = [torch.empty_like(flat) for _ in range(grp.size)]
        dist.all_gather(outs, flat, group=grp.ref)
        return [o.reshape(x.shape) for o in outs]

    def gathered_uneven(self, grp, flat, numels):
        m = max(numels) if numels else 0
        padded = torch.zeros(m, dtype=flat.dtype)
        padded[:flat.numel()] = flat
        outs = [torch.empty_like(padded) for _ in range(grp.size)]
        dist.all_gather(outs, padded, group=grp.ref)
        return [o[:k] for o, k in zip(outs, numels)]

    def check_identical(self, grp, what, t):
        """`t` must be bitwise identical on every rank of the group."""
        mine = as_bytes(t).clone()
        outs = [torch.empty_like(mine) for _ in range(grp.size)]
        dist.all_gather(outs, mine, group=grp.ref)
        for r, other in enumerate(outs):
            if not torch.equal(other, mine):
                first = int((other != mine).nonzero()[0])
                self.fail(f"{what}: bitwise identity",
                          f"rank {grp.g(r)}'s result differs from rank {self.rank}'s "
                          f"(first at byte {first})")

    def check_reduced(self, what, got, gloo_got, xs, op, dtype, factor=None, part=None):
        """A reduction result against Gloo's (gloo_got, None where Gloo lacks
        the op) and, for float sums and products, the float64 reference from
        the inputs `xs` (None when not needed); `part` slices the references."""
        def cut(t):
            return t if part is None or t is None or not isinstance(t, torch.Tensor) else t[part]

        if dtype == torch.bool:
            if got.numel() and int(as_bytes(got).max()) > 1:
                self.fail(what, f"bool result holds bytes {sorted(set(as_bytes(got).tolist()))[:5]}, "
                                "not only 0/1")
            if gloo_got is None:
                ref, _ = reduce_ref(xs, op, dtype)
                self.expect(what + " vs torch", got, cut(ref))
            else:  # Gloo's bool SUM leaves the count (e.g. 4) in the byte
                self.expect(what + " vs gloo", got, gloo_got.view(torch.uint8) != 0)
            return
        exact = (not dtype.is_floating_point) or op in ("MIN", "MAX")
        if exact:
            if gloo_got is None:
                ref, _ = reduce_ref(xs, op, dtype, factor)
                self.expect(what + " vs torch", got, cut(ref))
            else:
                self.expect(what + " vs gloo", got, gloo_got)
            return
        ref, bound = reduce_ref(xs, op, dtype, factor)
        ref, bound = cut(ref), cut(bound)
        msg = compare(got, ref, bound)
        if msg:
            self.fail(what + " vs float64 reference", msg)
        if gloo_got is not None:
            msg = compare(got, gloo_got.double(), 2 * bound)
            if msg:
                self.fail(what + " vs gloo (within twice the bound)", msg)

    def check_guard(self, guard):
        if guard is None:
            return
        base, saved, now = guard
        for s, n in zip(saved, now(base)):
            msg = compare(n, s, bitwise=True)
            if msg:
                self.fail("memory around the strided view", "was overwritten: " + msg)

    # ---- the sequence

    def run(self, n_ops, start=0, on_op=None):
        for i in range(start, start + n_ops):
            self.step(i)
            if on_op is not None:
                on_op(i)

    def step(self, i):
        self.index = i
        # Now and then every rank forces another algorithm (pycollectives.set_algo
        # applies to every later op of the process; "auto" is the cost model).
        if self.algos and self.rng.random() < 0.03:
            algo = self.rng.choice(self.algos)
            if self.trace:
                print(f"fuzz op #{i}: set_algo({algo!r})", file=sys.stderr, flush=True)
            import pycollectives

            if not self.set_algo_with_pending:
                # By default set_algo runs while async ops are pending: pycoll reads the
                # forced algorithm when an op is issued, so the pending ones keep the
                # old one on every rank (before that fix, ranks could disagree and fail
                # with "collective mismatch ... algo=tree but ... algo=oneshot").
                # PYCOLL_FUZZ_SET_ALGO_PENDING=0 waits for them first.
                self.drain()

            pycollectives.set_algo(algo)
            self.algo = algo
        kind = self.first_kinds[i] if i < len(self.first_kinds) else \
            self.rng.choices(list(KINDS), weights=list(KINDS.values()))[0]
        groups = self.groups
        if kind in P2P_KINDS:
            groups = [g for g in groups if g.size >= 2]
        grp = self.rng.choices(groups, weights=[GROUP_WEIGHTS[g.label] for g in groups])[0]
        self.group = grp
        desc, is_async, runner = getattr(self, "op_" + kind)(grp)
        self.desc = desc
        waitable = finish = None
        if grp.member:
            if self.trace:
                print(f"fuzz op #{i} group={grp}: {desc}", file=sys.stderr, flush=True)
            self.count(kind)
            try:
                waitable, finish = runner()
            except FuzzError:
                raise
            except Exception as e:
                raise FuzzError(f"{self.where()} raised {type(e).__name__}: {e}") from e
        entry = _Pending(i, desc, grp, waitable, finish)
        if is_async:
            self.pending.append(entry)
        else:
            self.complete(entry)
        # Wait some pending work, in a random order that every rank draws alike.
        if self.pending and (len(self.pending) > self.max_pending or self.rng.random() < 0.3):
            k = self.rng.randint(1, len(self.pending))
            order = self.rng.sample(range(len(self.pending)), k)
            done = [self.pending[j] for j in order]
            for e in done:
                self.complete(e)
            self.pending = [e for e in self.pending if e not in done]

    def complete(self, entry):
        if not entry.group.member:
            return
        saved = self.index, self.desc, self.group
        self.index, self.desc, self.group = entry.index, entry.desc, entry.group
        try:
            w = entry.waitable
            if isinstance(w, (list, tuple)):
                for x in w:
                    x.wait()
            elif w is not None:
                w.wait()
            if entry.finish is not None:
                entry.finish()
        except FuzzError:
            raise
        except Exception as e:
            raise FuzzError(f"{self.where()} raised {type(e).__name__} while completing: {e}") from e
        finally:
            self.index, self.desc, self.group = saved

    def drain(self):
        """Wait every pending op (in issue order: needs no draws)."""
        for e in self.pending:
            self.complete(e)
        self.pending = []

    def finish(self):
        self.drain()
        if self.n_failures:
            shown = "\n".join(self.failures[1:8])
            more = f"\n... and {self.n_failures - 8} more" if self.n_failures > 8 else ""
            raise AssertionError(
                f"{self.failures[0]}\n({self.n_failures} failed checks on rank {self.rank}; "
                f"reproduce with PYCOLL_FUZZ_SEED={self.seed} and at least "
                f"PYCOLL_FUZZ_OPS={self.first_failed_op + 1}; the next failures:)\n{shown}{more}")
        return dict(self.counts)

    # ---- ops (the mixins).  Each op_<kind>(grp) draws its parameters (every
    # rank), then returns (description, async?, runner); members call
    # runner() -> (waitable, finish).

    def _data(self, dtype, op, shape, k=0, rank=None):
        return gen(dtype, op, shape, self.seed_of(k, rank))


class Fuzzer(ReductionOps, DataMovementOps, PointToPointOps, CoalescedOps, FuzzerCore):
    """One rank's side of a random op sequence.

    ``fz = Fuzzer(rank, ws, seed); fz.run(n); fz.finish()``.
    check=False skips the Gloo references and comparisons (pycoll alone).
    device: where the tensors handed to pycoll live ("cpu", or "cuda:<i>": the
    rank's GPU, made current); the Gloo twins and the references always work
    on CPU copies of the same inputs, and results are compared on CPU.
    trace: print each op to stderr before issuing it (the rank's log tail
    then shows where a hang or crash happened).
    """
