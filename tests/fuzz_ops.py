"""Seeded random sequences of torch.distributed ops on pycoll, each checked
against the same op on Gloo.

Shared by tests/test_fuzz.py (1,500-3,000 ops per world size, in CI) and
benchmarks/soak.py (``make soak``: 100,000 ops with resource checks).

Every rank draws the same sequence from ``random.Random(seed)``: the op, the
group, dtype, reduce op, sizes, layouts, roots, split matrices, async or not,
and when (and in which order) pending async work is waited.  Tensor contents
are rank-specific (a torch.Generator seeded from seed, op index, rank).

Groups: the default pycoll group ("world"), a second pycoll group over the
same ranks ("dup"), a pycoll group of ranks 1.. ("sub"), and for 3+ ranks
{0, ws-1} ("pair"); each has a Gloo twin over the same ranks.  A rank that is
not in an op's group draws the op's parameters like the others and skips it.

Reference, per op: the same op on the Gloo twin with contiguous copies of the
same inputs, run just before pycoll's.  Where Gloo lacks something
(PREMUL_SUM; all_to_all with uneven lists) the reference is a plain torch
computation on the inputs all_gathered through the Gloo twin.  Integers, bools,
MIN/MAX and data movement are compared exactly (bools by value: Gloo's bool SUM
leaves bytes > 1, pycoll's must be 0/1); float SUM/AVG/PRODUCT/PREMUL_SUM are
compared with a float64 reference computed from the gathered inputs, within the
bound of tests/test_cpu_collectives.py (rigorous for any summation order with
rounding to the dtype at each step), and with Gloo's result within twice that
bound.  Every all_reduce result (plain and coalesced) must also be bitwise
identical on every rank of the group (all_gathered through Gloo).

A mismatch is recorded with the seed, op index and op description, and the
sequence goes on (every rank keeps issuing the same ops); an exception is
re-raised at once with the same context.
"""

import ctypes
import functools
import gc
import os
import random
import sys
import time

import torch
import torch.distributed as dist

from reference import BOOL_P, EPS, dist_op, gen, reduce_ref  # noqa: F401  (shared with test_cpu_collectives.py)

DTYPES = [
    torch.float32, torch.float64, torch.float16, torch.bfloat16,
    torch.int8, torch.uint8, torch.int32, torch.int64, torch.bool,
]
FLOAT_OPS = ["SUM", "AVG", "PRODUCT", "MIN", "MAX", "PREMUL_SUM"]
INT_OPS = ["SUM", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR"]  # also bool

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

# Machine epsilon per float dtype (see reduce_ref).

# Density of True in bool inputs, so that AND-like and OR-like results are
# not constant over 4 ranks.

# Where pycoll's CPU transport names its POSIX shared memory
# (csrc/transport/shm/shm_transport.cpp: "/pycoll-<job token>-<rank>").
SHM_DIR = "/dev/shm"
SHM_PREFIX = "pycoll-"

MIB = 1 << 20

# What pycollectives.set_algo accepts (tests/ranks.py ALGOS).
ALGOS = ("ring", "tree", "oneshot", "twoshot", "auto")


def name(dtype):
    return str(dtype).replace("torch.", "")


# --------------------------------------------------------------------------
# inputs and references (as in tests/test_cpu_collectives.py)






def filler(dtype, shape):
    """Recognisable junk for outputs."""
    if dtype == torch.bool:
        return torch.zeros(shape, dtype=dtype)
    if dtype.is_floating_point:
        return torch.full(shape, 123.0 if dtype != torch.float16 else 77.0, dtype=dtype)
    return torch.full(shape, 99, dtype=dtype)


def place(values, layout, seed=987654321):
    """A tensor holding `values` in `layout`, plus a guard: the memory around
    a strided view, which no op may touch (None for other layouts).
      contig:     a fresh contiguous tensor;
      strided:    every other element of a 2n buffer (1-D values);
      transposed: the transpose of a (b, a) tensor (2-D values);
      rows:       columns 1:1+c of a (r, c + 2) buffer (2-D values)."""
    if layout == "contig":
        return values.clone(), None
    if layout == "strided":
        n = values.numel()
        base = gen(values.dtype, "data", (2 * n,), seed + n)
        view = base[::2]
        view.copy_(values)
        return view, (base, [base[1::2].clone()], lambda b: [b[1::2]])
    if layout == "transposed":
        a, b = values.shape
        t = torch.empty((b, a), dtype=values.dtype).t()
        t.copy_(values)
        return t, None
    if layout == "rows":
        r, c = values.shape
        base = gen(values.dtype, "data", (r, c + 2), seed + r)
        view = base[:, 1:1 + c]
        view.copy_(values)
        return view, (base, [base[:, 0].clone(), base[:, c + 1].clone()],
                      lambda b: [b[:, 0], b[:, c + 1]])
    raise ValueError(layout)






def gloo_has(op):
    """Gloo rejects PREMUL_SUM ("Cannot use ReduceOp.PREMUL_SUM with Gloo")."""
    return op != "PREMUL_SUM"


def _bytes(t):
    flat = t.detach().reshape(-1)
    if flat.numel() and flat.stride(0) != 1:  # e.g. one element of a strided view
        flat = torch.empty(flat.shape, dtype=flat.dtype).copy_(flat)
    return flat.view(torch.uint8)


def compare(got, ref, bound=None, bitwise=False):
    """None when `got` matches `ref`, else a message with the first bad element.
    bitwise: the bytes must match (data movement); bound None: values equal;
    else |got - ref| <= bound (ref float64)."""
    if tuple(got.shape) != tuple(ref.shape):
        return f"shape {tuple(got.shape)}, expected {tuple(ref.shape)}"
    if bound is None and got.dtype != ref.dtype:
        return f"dtype {got.dtype}, expected {ref.dtype}"
    if got.numel() == 0:
        return None
    g = got.reshape(-1)
    r = ref.reshape(-1)
    if bitwise:
        gb, rb = _bytes(g), _bytes(r)
        if torch.equal(gb, rb):
            return None
        bad = ((gb != rb).nonzero() // g.element_size()).unique()
    elif bound is None:
        if torch.equal(g, r):
            return None
        bad = (g != r).nonzero()
    else:
        b = bound.reshape(-1) if isinstance(bound, torch.Tensor) else torch.full_like(r, bound)
        err = (g.double() - r).abs()
        bad_mask = ~(err <= b)  # NaN counts as bad
        if not bad_mask.any():
            return None
        bad = bad_mask.nonzero()
        i = int(bad[0])
        return (f"{bad.numel()} of {g.numel()} elements out of tolerance; first at flat index "
                f"{i}: got {g[i].item()!r}, expected {r[i].item()!r} +- {b[i].item():.3g} "
                f"(max error {err.max().item():.3g})")
    i = int(bad.reshape(-1)[0])
    return (f"{bad.numel()} of {g.numel()} elements differ; first at flat index {i}: "
            f"got {g[i].item()!r}, expected {r[i].item()!r}")


# --------------------------------------------------------------------------
# groups


class Group:
    """A pycoll group and its Gloo twin over the same (global) ranks."""

    def __init__(self, label, members, pg, ref, rank):
        self.label = label
        self.members = list(members)
        self.pg = pg
        self.ref = ref
        self.size = len(self.members)
        self.me = self.members.index(rank) if rank in self.members else -1
        self.member = self.me >= 0

    def g(self, group_rank):
        return self.members[group_rank]

    def __str__(self):
        return f"{self.label}{self.members}"


def make_groups(rank, ws):
    """Every rank creates every group, in the same order."""
    gloo_world = dist.new_group(backend="gloo")
    groups = [Group("world", range(ws), dist.group.WORLD, gloo_world, rank),
              Group("dup", range(ws), dist.new_group(list(range(ws)), backend="pycoll"),
                    gloo_world, rank)]
    subsets = [("sub", list(range(1, ws)))]
    if ws >= 3:
        subsets.append(("pair", [0, ws - 1]))
    for label, members in subsets:
        pg = dist.new_group(members, backend="pycoll")
        ref = dist.new_group(members, backend="gloo")
        groups.append(Group(label, members, pg, ref, rank))
    return groups


GROUP_WEIGHTS = {"world": 45, "dup": 20, "sub": 20, "pair": 15}


# --------------------------------------------------------------------------
# the fuzzer


class FuzzError(RuntimeError):
    pass


class _Pending:
    __slots__ = ("index", "desc", "group", "waitable", "finish")

    def __init__(self, index, desc, group, waitable, finish):
        self.index, self.desc, self.group = index, desc, group
        self.waitable, self.finish = waitable, finish


class Fuzzer:
    """One rank's side of a random op sequence.

    ``fz = Fuzzer(rank, ws, seed); fz.run(n); fz.finish()``.
    check=False skips the Gloo references and comparisons (pycoll alone).
    trace: print each op to stderr before issuing it (the rank's log tail
    then shows where a hang or crash happened).
    """

    def __init__(self, rank, ws, seed, *, check=True, trace=False, max_bytes=MIB,
                 max_pending=8, groups=None, algos=ALGOS, set_algo_with_pending=None):
        self.rank, self.ws, self.seed = rank, ws, seed
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
        return (f"[fuzz seed={self.seed} op #{index} ws={self.ws} rank={self.rank} "
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
        mine = _bytes(t).clone()
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
            if got.numel() and int(_bytes(got).max()) > 1:
                self.fail(what, f"bool result holds bytes {sorted(set(_bytes(got).tolist()))[:5]}, "
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

    # ---- ops.  Each draws its parameters (every rank), then returns
    # (description, async?, runner); members call runner() -> (waitable, finish).

    def _data(self, dtype, op, shape, k=0, rank=None):
        return gen(dtype, op, shape, self.seed_of(k, rank))

    def op_all_reduce(self, grp):
        dtype = self.dtype()
        op, factor = self.redop(dtype)
        shape, layout = self.shape(dtype, transposed=True)
        a = self.is_async()
        use_future = a and self.rng.random() < 0.3
        desc = (f"all_reduce {name(dtype)} {op} shape={shape} {layout}"
                f"{' async' if a else ''}{' (future)' if use_future else ''}")

        def run():
            x = self._data(dtype, op, shape)
            t, guard = place(x, layout)
            gloo_t = xs = None
            if self.check:
                if gloo_has(op):
                    gloo_t = x.clone()
                    dist.all_reduce(gloo_t, op=dist_op(op), group=grp.ref)
                if dtype.is_floating_point or gloo_t is None:
                    xs = self.gathered(grp, x)
            w = dist.all_reduce(t, op=dist_op(op, factor), group=grp.pg, async_op=a)
            if not a and w is not None:
                self.fail("return value", f"sync all_reduce returned {w!r}, not None")
            fut = w.get_future() if use_future else None

            def finish():
                if fut is not None:  # DDP's path: the Work's Future, not Work.wait()
                    val = fut.wait()
                    if not (isinstance(val, list) and len(val) == 1):
                        self.fail("future", f"value is not a list of one tensor: {type(val)}")
                    else:
                        self.expect("future value", val[0], t, bitwise=True)
                elif a and not w.is_completed():
                    self.fail("work", "is_completed() is False after wait()")
                if self.check:
                    self.check_reduced("result", t, gloo_t, xs, op, dtype, factor)
                    self.check_identical(grp, "result", t)
                self.check_guard(guard)
            return (None if use_future else w), finish
        return desc, a, run

    def op_reduce(self, grp):
        dtype = self.dtype()
        op, factor = self.redop(dtype)
        shape, layout = self.shape(dtype, transposed=True)
        root = self.rng.randrange(grp.size)
        a = self.is_async()
        desc = f"reduce {name(dtype)} {op} shape={shape} {layout} root={grp.g(root)}{' async' if a else ''}"

        def run():
            x = self._data(dtype, op, shape)
            t, guard = place(x, layout)
            gloo_t = xs = None
            if self.check:
                if gloo_has(op):
                    gloo_t = x.clone()
                    dist.reduce(gloo_t, dst=grp.g(root), op=dist_op(op), group=grp.ref)
                if dtype.is_floating_point or gloo_t is None:
                    xs = self.gathered(grp, x)
            w = dist.reduce(t, dst=grp.g(root), op=dist_op(op, factor), group=grp.pg, async_op=a)

            def finish():
                if self.check and grp.me == root:
                    self.check_reduced("result on root", t, gloo_t, xs, op, dtype, factor)
                self.check_guard(guard)
            return w, finish
        return desc, a, run

    def op_broadcast(self, grp):
        dtype = self.dtype()
        shape, layout = self.shape(dtype, transposed=True)
        root = self.rng.randrange(grp.size)
        a = self.is_async()
        desc = f"broadcast {name(dtype)} shape={shape} {layout} root={grp.g(root)}{' async' if a else ''}"

        def run():
            x = self._data(dtype, "data", shape)
            t, guard = place(x, layout)
            gloo_t = None
            if self.check:
                gloo_t = x.clone()
                dist.broadcast(gloo_t, src=grp.g(root), group=grp.ref)
            w = dist.broadcast(t, src=grp.g(root), group=grp.pg, async_op=a)

            def finish():
                if self.check:
                    self.expect("result vs gloo", t, gloo_t, bitwise=True)
                self.check_guard(guard)
            return w, finish
        return desc, a, run

    def op_all_gather(self, grp):
        dtype = self.dtype()
        shape, layout = self.shape(dtype, mult=grp.size, transposed=True)
        a = self.is_async()
        desc = f"all_gather (list) {name(dtype)} shape={shape} {layout}{' async' if a else ''}"

        def run():
            x = self._data(dtype, "data", shape)
            inp, guard = place(x, layout)
            refs = None
            if self.check:
                refs = [filler(dtype, shape) for _ in range(grp.size)]
                dist.all_gather(refs, x.clone(), group=grp.ref)
            outs = [filler(dtype, shape) for _ in range(grp.size)]
            w = dist.all_gather(outs, inp, group=grp.pg, async_op=a)

            def finish():
                if self.check:
                    for r in range(grp.size):
                        self.expect(f"output[{r}] vs gloo", outs[r], refs[r], bitwise=True)
                self.expect("input unchanged", inp, x, bitwise=True)
                self.check_guard(guard)
            return w, finish
        return desc, a, run

    def op_all_gather_into_tensor(self, grp):
        dtype = self.dtype()
        (n,), layout = self.shape(dtype, mult=grp.size)
        stacked = self.rng.random() < 0.3
        a = self.is_async()
        desc = (f"all_gather_into_tensor {name(dtype)} n={n} {layout} "
                f"{'stacked (W, n)' if stacked else 'flat (W*n)'} output{' async' if a else ''}")

        def run():
            x = self._data(dtype, "data", (n,))
            inp, guard = place(x, layout)
            ref = None
            if self.check:  # Gloo: flat output only
                ref = filler(dtype, (grp.size * n,))
                dist.all_gather_into_tensor(ref, x.clone(), group=grp.ref)
            out = filler(dtype, (grp.size, n) if stacked else (grp.size * n,))
            w = dist.all_gather_into_tensor(out, inp, group=grp.pg, async_op=a)

            def finish():
                if self.check:
                    self.expect("output vs gloo", out.reshape(-1), ref, bitwise=True)
                self.expect("input unchanged", inp, x, bitwise=True)
                self.check_guard(guard)
            return w, finish
        return desc, a, run

    def _reduce_scatter(self, grp, form):
        dtype = self.dtype()
        op, factor = self.redop(dtype)
        (n,), layout = self.shape(dtype, mult=grp.size)
        stacked = form == "tensor" and self.rng.random() < 0.3
        a = self.is_async()
        what = "reduce_scatter (list)" if form == "list" else \
            f"reduce_scatter_tensor {'stacked (W, n)' if stacked else 'flat (W*n)'} input"
        desc = f"{what} {name(dtype)} {op} n={n} {layout}{' async' if a else ''}"
        W = grp.size

        def run():
            x = self._data(dtype, op, (W * n,))
            buf, guard = place(x, layout)
            gloo_out = xs = None
            if self.check:
                if gloo_has(op):
                    gloo_out = filler(dtype, (n,))
                    if form == "list":
                        dist.reduce_scatter(gloo_out, [c.clone() for c in x.split(n)] if n else
                                            [x.clone() for _ in range(W)],
                                            op=dist_op(op), group=grp.ref)
                    else:
                        dist.reduce_scatter_tensor(gloo_out, x.clone(), op=dist_op(op), group=grp.ref)
                if dtype.is_floating_point or gloo_out is None:
                    xs = self.gathered(grp, x)
            out = filler(dtype, (n,))
            if form == "list":
                chunks = [buf[j * n:(j + 1) * n] for j in range(W)]
                w = dist.reduce_scatter(out, chunks, op=dist_op(op, factor), group=grp.pg, async_op=a)
            else:
                w = dist.reduce_scatter_tensor(out, buf.view(W, n) if stacked else buf,
                                               op=dist_op(op, factor), group=grp.pg, async_op=a)

            def finish():
                if self.check:
                    mine = slice(grp.me * n, (grp.me + 1) * n)
                    self.check_reduced("output", out, gloo_out, xs, op, dtype, factor, part=mine)
                self.expect("input unchanged", buf, x, bitwise=True)
                self.check_guard(guard)
            return w, finish
        return desc, a, run

    def op_reduce_scatter(self, grp):
        return self._reduce_scatter(grp, "list")

    def op_reduce_scatter_tensor(self, grp):
        return self._reduce_scatter(grp, "tensor")

    def op_all_to_all(self, grp):
        dtype = self.dtype()
        W = grp.size
        uneven = self.rng.random() < 0.5
        n = self.numel(dtype, mult=W * W)
        S = self.split_matrix(W, n) if uneven else [[n] * W for _ in range(W)]
        a = self.is_async()
        desc = (f"all_to_all (list) {name(dtype)} "
                f"{'uneven splits ' + str(S) if uneven else f'even n={n}'}{' async' if a else ''}")

        def run():
            me = grp.me
            x = self._data(dtype, "data", (sum(S[me]),))
            ins = [c.clone() for c in x.split(S[me])]
            want = None
            if self.check:
                if not uneven:  # Gloo: equal sizes only ("invalid tensor size")
                    want = [filler(dtype, (S[j][me],)) for j in range(W)]
                    dist.all_to_all(want, [c.clone() for c in ins], group=grp.ref)
                else:  # torch: slice every rank's input, all_gathered through Gloo
                    xs = self.gathered_uneven(grp, x, [sum(S[r]) for r in range(W)])
                    want = [xs[j][sum(S[j][:me]):sum(S[j][:me + 1])] for j in range(W)]
            outs = [filler(dtype, (S[j][me],)) for j in range(W)]
            w = dist.all_to_all(outs, ins, group=grp.pg, async_op=a)

            def finish():
                if self.check:
                    for j in range(W):
                        self.expect(f"output[{j}] vs {'torch' if uneven else 'gloo'}",
                                    outs[j], want[j], bitwise=True)
                for j, c in enumerate(x.split(S[me])):
                    self.expect(f"input[{j}] unchanged", ins[j], c, bitwise=True)
            return w, finish
        return desc, a, run

    def op_all_to_all_single(self, grp):
        dtype = self.dtype()
        W = grp.size
        form = self.rng.choice(["even", "even splits", "uneven", "rows"])
        n = self.numel(dtype, mult=W * W * (3 if form == "rows" else 1))
        S = self.split_matrix(W, n) if form in ("uneven", "rows") and self.rng.random() < 0.7 \
            else [[n] * W for _ in range(W)]
        a = self.is_async()
        desc = (f"all_to_all_single {name(dtype)} {form} "
                f"{('splits ' + str(S)) if S[0][0] != n or len(set(sum(S, []))) > 1 else f'n={n}'}"
                f"{' (rows of 3, strided input)' if form == 'rows' else ''}{' async' if a else ''}")

        def run():
            me = grp.me
            cols = (3,) if form == "rows" else ()
            x = self._data(dtype, "data", (sum(S[me]),) + cols)
            inp, guard = place(x, "rows" if form == "rows" else "contig")
            out_rows = sum(S[j][me] for j in range(W))
            splits = {} if form == "even" else {
                "output_split_sizes": [S[j][me] for j in range(W)],
                "input_split_sizes": list(S[me])}
            ref = None
            if self.check:
                ref = filler(dtype, (out_rows,) + cols)
                dist.all_to_all_single(ref, x.clone(), group=grp.ref, **splits)
            out = filler(dtype, (out_rows,) + cols)
            w = dist.all_to_all_single(out, inp, group=grp.pg, async_op=a, **splits)

            def finish():
                if self.check:
                    self.expect("output vs gloo", out, ref, bitwise=True)
                self.expect("input unchanged", inp, x, bitwise=True)
                self.check_guard(guard)
            return w, finish
        return desc, a, run

    def op_gather(self, grp):
        dtype = self.dtype()
        shape, layout = self.shape(dtype, mult=grp.size, transposed=True)
        root = self.rng.randrange(grp.size)
        a = self.is_async()
        desc = f"gather {name(dtype)} shape={shape} {layout} root={grp.g(root)}{' async' if a else ''}"

        def run():
            x = self._data(dtype, "data", shape)
            inp, guard = place(x, layout)
            is_root = grp.me == root
            refs = None
            if self.check:
                refs = [filler(dtype, shape) for _ in range(grp.size)] if is_root else None
                dist.gather(x.clone(), refs, dst=grp.g(root), group=grp.ref)
            outs = [filler(dtype, shape) for _ in range(grp.size)] if is_root else None
            w = dist.gather(inp, outs, dst=grp.g(root), group=grp.pg, async_op=a)

            def finish():
                if self.check and is_root:
                    for r in range(grp.size):
                        self.expect(f"gathered[{r}] vs gloo", outs[r], refs[r], bitwise=True)
                self.expect("input unchanged", inp, x, bitwise=True)
                self.check_guard(guard)
            return w, finish
        return desc, a, run

    def op_scatter(self, grp):
        dtype = self.dtype()
        shape, layout = self.shape(dtype, mult=grp.size, transposed=True)
        root = self.rng.randrange(grp.size)
        a = self.is_async()
        desc = (f"scatter {name(dtype)} shape={shape} {layout} output root={grp.g(root)}"
                f"{' async' if a else ''}")

        def run():
            is_root = grp.me == root
            xs = [self._data(dtype, "data", shape, k=r) for r in range(grp.size)] if is_root else None
            ref = None
            if self.check:
                ref = filler(dtype, shape)
                dist.scatter(ref, [x.clone() for x in xs] if is_root else None,
                             src=grp.g(root), group=grp.ref)
            out, guard = place(filler(dtype, shape), layout)
            ins = [x.clone() for x in xs] if is_root else None
            w = dist.scatter(out, ins, src=grp.g(root), group=grp.pg, async_op=a)

            def finish():
                if self.check:
                    self.expect("output vs gloo", out, ref, bitwise=True)
                if is_root:
                    for r in range(grp.size):
                        self.expect(f"input[{r}] unchanged", ins[r], xs[r], bitwise=True)
                self.check_guard(guard)
            return w, finish
        return desc, a, run

    def op_barrier(self, grp):
        a = self.is_async()
        desc = f"barrier{' async' if a else ''}"

        def run():
            w = dist.barrier(group=grp.pg, async_op=a)

            def finish():
                if a and not w.is_completed():
                    self.fail("work", "is_completed() is False after wait()")
            return w, finish
        return desc, a, run

    def op_send_recv(self, grp):
        W = grp.size
        src = self.rng.randrange(W)
        dst = self.rng.choice([r for r in range(W) if r != src])
        mode = self.rng.choice(["one way", "one way", "exchange"])
        tag = self.rng.randrange(0, 64)
        dtype = self.dtype()
        shape, layout = self.shape(dtype, transposed=True)
        rlayout = self.rng.choice(["contig", layout])
        send_async = self.rng.random() < 0.5
        recv_async = self.rng.random() < 0.5
        a = self.is_async()
        desc = (f"send/recv {mode} {grp.g(src)}{'<->' if mode == 'exchange' else '->'}{grp.g(dst)} "
                f"tag={tag} {name(dtype)} shape={shape} send {layout} recv {rlayout} "
                f"{'isend' if send_async else 'send'}/{'irecv' if recv_async else 'recv'}"
                f"{' async' if a else ''}")

        def run():
            me = grp.me
            if me not in (src, dst):
                return None, None
            peer = grp.g(dst if me == src else src)
            sends = me == src or mode == "exchange"
            recvs = me == dst or mode == "exchange"
            x = self._data(dtype, "data", shape)
            st, sguard = place(x, layout) if sends else (None, None)
            rt, rguard = place(filler(dtype, shape), rlayout) if recvs else (None, None)
            ref = None
            if self.check:
                ref = filler(dtype, shape) if recvs else None
                ws_ = [dist.isend(x.clone(), dst=peer, group=grp.ref, tag=tag)] if sends else []
                if recvs:
                    dist.recv(ref, src=peer, group=grp.ref, tag=tag)
                for w in ws_:
                    w.wait()
            works = []
            if mode == "exchange":  # both isend first, then receive
                works.append(dist.isend(st, dst=peer, group=grp.pg, tag=tag))
                if recv_async or a:
                    works.append(dist.irecv(rt, src=peer, group=grp.pg, tag=tag))
                else:
                    dist.recv(rt, src=peer, group=grp.pg, tag=tag)
            elif sends:
                if send_async or a:
                    works.append(dist.isend(st, dst=peer, group=grp.pg, tag=tag))
                else:
                    dist.send(st, dst=peer, group=grp.pg, tag=tag)
            else:
                if recv_async or a:
                    works.append(dist.irecv(rt, src=peer, group=grp.pg, tag=tag))
                else:
                    dist.recv(rt, src=peer, group=grp.pg, tag=tag)

            def finish():
                if self.check and recvs:
                    self.expect("received vs gloo", rt, ref, bitwise=True)
                if sends:
                    self.expect("sent tensor unchanged", st, x, bitwise=True)
                self.check_guard(sguard)
                self.check_guard(rguard)
            return works, finish
        return desc, a, run

    def op_batch_isend_irecv(self, grp):
        W = grp.size
        both = self.rng.random() < 0.4
        tag = self.rng.randrange(0, 64)
        dtype = self.dtype()
        n = self.numel(dtype, mult=2)
        a = self.is_async()
        desc = (f"batch_isend_irecv ring{' both ways' if both else ''} tag={tag} "
                f"{name(dtype)} n={n}{' async' if a else ''}")

        def run():
            me = grp.me
            nxt, prv = grp.g((me + 1) % W), grp.g((me - 1) % W)
            fwd = self._data(dtype, "data", (n,), k=0)
            bwd = self._data(dtype, "data", (n,), k=1)
            plan = [("send", fwd, nxt, tag), ("recv", 0, prv, tag)]
            if both:
                plan += [("send", bwd, prv, tag + 1), ("recv", 1, nxt, tag + 1)]

            def ops(pg, bufs, clone):
                out = []
                for kind, t, peer, tg in plan:
                    if kind == "send":
                        out.append(dist.P2POp(dist.isend, t.clone() if clone else t, peer, pg, tg))
                    else:
                        out.append(dist.P2POp(dist.irecv, bufs[t], peer, pg, tg))
                return out

            refs = None
            if self.check:
                refs = [filler(dtype, (n,)), filler(dtype, (n,))]
                for r in dist.batch_isend_irecv(ops(grp.ref, refs, True)):
                    r.wait()
            got = [filler(dtype, (n,)), filler(dtype, (n,))]
            reqs = dist.batch_isend_irecv(ops(grp.pg, got, False))

            def finish():
                if self.check:
                    self.expect("received from prev vs gloo", got[0], refs[0], bitwise=True)
                    if both:
                        self.expect("received from next vs gloo", got[1], refs[1], bitwise=True)
                self.expect("sent tensor unchanged", fwd,
                            self._data(dtype, "data", (n,), k=0), bitwise=True)
            return reqs, finish
        return desc, a, run

    def op_coalesced(self, grp):
        W = grp.size
        form = self.rng.choice(["all_reduce", "all_reduce_coalesced", "all_gather_into_tensor",
                                "reduce_scatter_tensor"])
        k = self.rng.randint(1, 5)
        reduces = form in ("all_reduce", "all_reduce_coalesced", "reduce_scatter_tensor")
        if reduces:  # one dtype and one reduce op per batch
            dtype = self.dtype()
            dtypes = [dtype] * k
            op, factor = self.redop(dtype)
        else:
            dtypes = [self.dtype() for _ in range(k)]
            op, factor = None, None
        mult = W * k if form != "all_reduce" and form != "all_reduce_coalesced" else k
        sizes = [self.numel(d, mult=mult) for d in dtypes]
        a = self.is_async()
        how = "dist.all_reduce_coalesced" if form == "all_reduce_coalesced" else \
            f"_coalescing_manager: {k} x {form}"
        desc = (f"coalesced {how} {[name(d) for d in dtypes] if not reduces else name(dtypes[0])}"
                f"{' ' + op if op else ''} sizes={sizes}{' async' if a else ''}")

        def run():
            xs = [self._data(d, op or "data", (n * (W if form == "reduce_scatter_tensor" else 1),), k=i)
                  for i, (d, n) in enumerate(zip(dtypes, sizes))]
            refs, gath = [None] * k, [None] * k
            if self.check:  # Gloo: one op per tensor
                for i, (d, n) in enumerate(zip(dtypes, sizes)):
                    if form in ("all_reduce", "all_reduce_coalesced"):
                        if gloo_has(op):
                            refs[i] = xs[i].clone()
                            dist.all_reduce(refs[i], op=dist_op(op), group=grp.ref)
                    elif form == "reduce_scatter_tensor":
                        if gloo_has(op):
                            refs[i] = filler(d, (n,))
                            dist.reduce_scatter_tensor(refs[i], xs[i].clone(), op=dist_op(op),
                                                       group=grp.ref)
                    else:
                        refs[i] = filler(d, (W * n,))
                        dist.all_gather_into_tensor(refs[i], xs[i].clone(), group=grp.ref)
                    if reduces and (d.is_floating_point or refs[i] is None):
                        gath[i] = self.gathered(grp, xs[i])
            if form == "all_reduce_coalesced":
                outs = [x.clone() for x in xs]
                w = dist.all_reduce_coalesced(outs, op=dist_op(op, factor), group=grp.pg, async_op=a)
            else:
                if form == "all_reduce":
                    outs = [x.clone() for x in xs]
                elif form == "reduce_scatter_tensor":
                    outs = [filler(d, (n,)) for d, n in zip(dtypes, sizes)]
                else:
                    outs = [filler(d, (W * n,)) for d, n in zip(dtypes, sizes)]
                with dist._coalescing_manager(group=grp.pg, async_ops=a) as cm:
                    for i in range(k):
                        if form == "all_reduce":
                            dist.all_reduce(outs[i], op=dist_op(op, factor), group=grp.pg)
                        elif form == "reduce_scatter_tensor":
                            dist.reduce_scatter_tensor(outs[i], xs[i], op=dist_op(op, factor),
                                                       group=grp.pg)
                        else:
                            dist.all_gather_into_tensor(outs[i], xs[i], group=grp.pg)
                w = cm if a else None

            def finish():
                if not self.check:
                    return
                for i, (d, n) in enumerate(zip(dtypes, sizes)):
                    if form == "all_gather_into_tensor":
                        self.expect(f"output {i} vs gloo", outs[i], refs[i], bitwise=True)
                    elif form == "reduce_scatter_tensor":
                        mine = slice(grp.me * n, (grp.me + 1) * n)
                        self.check_reduced(f"output {i}", outs[i], refs[i], gath[i], op, d, factor,
                                           part=mine)
                    else:
                        self.check_reduced(f"tensor {i}", outs[i], refs[i], gath[i], op, d, factor)
                        self.check_identical(grp, f"tensor {i}", outs[i])
            return w, finish
        return desc, a, run


# --------------------------------------------------------------------------
# rank entry points (run through tests/ranks.py: fn(rank, world_size, ...))


def quiet():
    import warnings

    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", category=UserWarning)


def fuzz_rank(rank, ws, seed, n_ops):
    """The CI fuzz: n_ops random ops, every one checked; returns op counts."""
    quiet()
    fz = Fuzzer(rank, ws, seed, trace=True)
    t0 = time.monotonic()
    fz.run(n_ops)
    counts = fz.finish()
    dist.barrier(group=fz.groups[0].ref)
    return {"counts": counts, "seconds": time.monotonic() - t0}


def _malloc_trim():
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def usage():
    """This process's resident memory (kB), open file descriptors and threads,
    after a garbage collection and malloc_trim (so that RSS counts live memory,
    not free heap that glibc has not returned yet)."""
    gc.collect()
    _malloc_trim()
    status = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "RssAnon", "RssFile", "RssShmem"):
                status[key] = int(value.split()[0])
    fds = len(os.listdir("/proc/self/fd")) - 1  # less the one listdir holds
    names = []
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                names.append(f.read().strip())
        except OSError:  # ended meanwhile
            pass
    threads = len(names)
    shm_kb = 0  # pycoll's segments mapped here: RssShmem grows towards this as pages are touched
    with open("/proc/self/maps") as f:
        for line in f:
            if SHM_DIR + "/" + SHM_PREFIX in line:
                lo, hi = line.split()[0].split("-")
                shm_kb += (int(hi, 16) - int(lo, 16)) // 1024
    by_name = {}
    for n in names:
        by_name[n] = by_name.get(n, 0) + 1
    return {"thread_names": dict(sorted(by_name.items())),
            "rss_kb": status.get("VmRSS"), "rss_anon_kb": status.get("RssAnon"),
            "rss_file_kb": status.get("RssFile"), "rss_shmem_kb": status.get("RssShmem"),
            "pycoll_shm_mapped_kb": shm_kb,
            "fds": fds, "threads": threads}


def soak_rank(rank, ws, seed, n_ops, warmup, check, sample_every):
    """The soak: n_ops random ops (checked unless check=False); resource use
    measured once every pending op is done after `warmup` ops and at the end.
    Mismatches are counted, not raised (the driver fails on them)."""
    quiet()
    fz = Fuzzer(rank, ws, seed, check=check)
    barrier_group = fz.groups[0].ref
    samples = []
    start, mid = {}, {}
    t0 = time.monotonic()

    def measure():
        fz.drain()
        dist.barrier(group=barrier_group)
        return usage()

    def on_op(i):
        done = i + 1
        if done == warmup:
            start.update(measure())
            start["t"] = time.monotonic()
        elif done == n_ops // 2 and done > warmup:  # for the trend: leak or warm-up?
            mid.update(measure(), ops=done)
        elif done > warmup and done % sample_every == 0 and done < n_ops:
            u = usage()  # pending ops not waited: a sample, not a criterion
            samples.append((done, u["rss_kb"], u["rss_anon_kb"], u["rss_shmem_kb"], u["fds"],
                            u["threads"]))
        if done % 10000 == 0:
            print(f"soak: {done} ops, {time.monotonic() - t0:.0f}s, "
                  f"{fz.n_failures} failures", file=sys.stderr, flush=True)

    fz.run(n_ops, on_op=on_op)
    end = measure()
    if not start:  # fewer ops than the warm-up
        start = dict(end, t=time.monotonic())
    return {
        "ops": n_ops, "seconds": time.monotonic() - t0,
        "seconds_after_warmup": time.monotonic() - start["t"],
        "rss_kb_start": start["rss_kb"], "rss_kb_end": end["rss_kb"],
        "rss_kb_max_sampled": max([s[1] for s in samples] + [start["rss_kb"], end["rss_kb"]]),
        "samples": samples,  # (ops done, rss, anon, shmem kB, fds, threads)
        "start": start, "mid": mid or None, "end": end,
        "fds_start": start["fds"], "fds_end": end["fds"],
        "threads_start": start["threads"], "threads_end": end["threads"],
        "failures": fz.n_failures, "first_failures": fz.failures[:5],
        "counts": fz.counts,
    }
