"""Every collective on CPU tensors against a plain torch computation.

One pytest test per (world size, op family[, algorithm]); each spawns one
world and loops over dtypes x reduce ops x shapes inside the ranks (spawning
costs far more than a small collective).  Every rank generates every rank's
input from a seed (session seed, case number, rank), so each rank can compute
the reference locally and the ranks keep issuing the same collectives even
when a local check fails: failures are collected and reported together, the
first one with all its parameters.
"""

import collections
import contextlib
import functools
import os
import re
import sys
import time
import zlib

import pytest
import torch
import torch.distributed as dist

from ranks import ALGOS, IS_GLOO, run_ranks, set_algo
from reference import BOOL_P, EPS, dist_op, gen, reduce_ref  # noqa: F401

WORLD_SIZES = [1, 2, 3, 4]
P2P_WORLD_SIZES = [2, 3, 4]

DTYPES = [
    torch.float32, torch.float64, torch.float16, torch.bfloat16,
    torch.int8, torch.uint8, torch.int32, torch.int64, torch.bool,
]
FLOAT_OPS = ["SUM", "AVG", "PRODUCT", "MIN", "MAX", "PREMUL_SUM"]
INT_OPS = ["SUM", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR"]  # also bool

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

# Machine epsilon (twice the unit roundoff) per float dtype: see reduce_ref.

# Density of True in bool inputs, so that AND-like and OR-like results are
# not constant over 4 ranks.



# Forcing an algorithm is a pycoll feature: under Gloo only "auto" runs, and it
# forces nothing.
def algo_params(names):
    return [a if a == "auto" else pytest.param(a, marks=pytest.mark.pycoll_only)
            for a in names]


ALL_REDUCE_ALGOS = algo_params(ALGOS)
SCATTER_GATHER_ALGOS = algo_params(["ring", "twoshot", "auto"])


# --------------------------------------------------------------------------
# inputs, references, comparisons (run inside the ranks)


def name(dtype):
    return str(dtype).replace("torch.", "")


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






def filler(dtype, shape):
    """Recognisable junk for outputs (never a valid result of a reduction
    of our inputs for floats, and rarely for ints)."""
    if dtype == torch.bool:
        return torch.zeros(shape, dtype=dtype)
    if dtype.is_floating_point:
        return torch.full(shape, 123.0 if dtype != torch.float16 else 77.0, dtype=dtype)
    return torch.full(shape, 99, dtype=dtype)


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


def quiet():
    import warnings

    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", category=UserWarning)


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


def premul_factor(cases):
    g = torch.Generator().manual_seed(cases.seed())
    return 0.25 + 1.75 * torch.rand((), generator=g, dtype=torch.float64).item()


# --------------------------------------------------------------------------
# all_reduce


# 8 MiB cases: float32 SUM under every algorithm, plus one more combination
# per algorithm (fewer dtypes at that size keep the suite within budget).
LARGE_REDUCE = {"ring": (torch.bfloat16, "AVG"), "tree": (torch.int32, "BXOR"),
                "oneshot": (torch.float16, "SUM"), "twoshot": (torch.bfloat16, "SUM"),
                "auto": (torch.float64, "MAX")}


def check_one_all_reduce(cases, rank, ws, dtype, op, n):
    """all_reduce of n elements against the reference, identical on every rank."""
    xs = [gen(dtype, op, (n,), cases.seed(r)) for r in range(ws)]
    t = xs[rank].clone()
    dist.all_reduce(t, op=dist_op(op))
    ref, bound = reduce_ref(xs, op, dtype)
    cases.check("result", t, ref, bound)
    cases.check_identical(t)


def _all_reduce_rank(rank, ws, seed, algo):
    quiet()
    cases = Cases("all_reduce", rank, ws, seed, algo=algo)
    force(cases, algo)
    work = [(d, op, spec) for d in DTYPES for op in reduce_ops(d)
            for spec in shapes(SHAPES_ALL_REDUCE)]
    work += [(d, op, ("contig", MIB8 // d.itemsize))
             for d, op in [(torch.float32, "SUM"), LARGE_REDUCE[algo]]
             if op in reduce_ops(d)]
    for dtype, op, spec in work:
        with cases.case(dtype=dtype, op=op, shape=spec):
            shape = shape_of(spec)
            xs = [gen(dtype, op, shape, cases.seed(r)) for r in range(ws)]
            factor = premul_factor(cases) if op == "PREMUL_SUM" else None
            t, guard = place(xs[rank], spec)
            ret = dist.all_reduce(t, op=dist_op(op, factor))
            cases.expect(ret is None, "sync all_reduce returns None")
            ref, bound = reduce_ref(xs, op, dtype, factor)
            cases.check("result", t, ref, bound)
            cases.check_guard(guard)
            cases.check_identical(t)

    # Async: several in flight, waited in reverse order, results through the
    # Work and through its Future (what DDP uses).
    with cases.case(mode="async, 4 in flight"):
        specs = [(torch.float32, "SUM", 1031), (torch.bfloat16, "SUM", 7),
                 (torch.int64, "MAX", 65537), (torch.float64, "AVG", 0)]
        ins, works = [], []
        for i, (dtype, op, n) in enumerate(specs):
            xs = [gen(dtype, op, (n,), cases.seed(r) + i) for r in range(ws)]
            t = xs[rank].clone()
            works.append(dist.all_reduce(t, op=dist_op(op), async_op=True))
            ins.append((xs, t, dtype, op))
        futs = [w.get_future() for w in works]
        for w in reversed(works):
            w.wait()
        for (xs, t, dtype, op), w, fut in zip(ins, works, futs):
            ref, bound = reduce_ref(xs, op, dtype)
            cases.check(f"{name(dtype)} {op} result", t, ref, bound)
            cases.expect(w.is_completed(), "work.is_completed() after wait")
            val = fut.wait()
            cases.expect(isinstance(val, list) and len(val) == 1,
                         f"future value is a list of one tensor (got {type(val).__name__})")
            if isinstance(val, list) and val:
                cases.check(f"{name(dtype)} {op} future value", val[0], t)
    check_algo_log(cases, algo, "allreduce", {algo})
    return cases.finish()


@pytest.mark.parametrize("algo", ALL_REDUCE_ALGOS)
@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_all_reduce(world_size, algo, seed):
    run_ranks(world_size, _all_reduce_rank, seed, algo, timeout=300, env=debug_env(algo))


# --------------------------------------------------------------------------
# reduce


def _reduce_rank(rank, ws, seed):
    quiet()
    cases = Cases("reduce", rank, ws, seed)
    work = [(root, d, op, spec) for root in range(ws) for d in DTYPES
            for op in reduce_ops(d) for spec in shapes(SHAPES)]
    work.append((ws - 1, torch.float32, "SUM", ("contig", MIB8 // 4)))
    for root, dtype, op, spec in work:
        with cases.case(root=root, dtype=dtype, op=op, shape=spec):
            shape = shape_of(spec)
            xs = [gen(dtype, op, shape, cases.seed(r)) for r in range(ws)]
            factor = premul_factor(cases) if op == "PREMUL_SUM" else None
            t, guard = place(xs[rank], spec)
            dist.reduce(t, dst=root, op=dist_op(op, factor))
            if rank == root:
                ref, bound = reduce_ref(xs, op, dtype, factor)
                cases.check("result on root", t, ref, bound)
            cases.check_guard(guard)
    return cases.finish()


@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_reduce(world_size, seed):
    run_ranks(world_size, _reduce_rank, seed, timeout=300)


# --------------------------------------------------------------------------
# broadcast


def _broadcast_rank(rank, ws, seed):
    quiet()
    cases = Cases("broadcast", rank, ws, seed)
    work = [(root, d, spec) for root in range(ws) for d in DTYPES for spec in shapes(SHAPES)]
    work.append((0, torch.float32, ("contig", MIB8 // 4)))
    for root, dtype, spec in work:
        with cases.case(root=root, dtype=dtype, shape=spec):
            shape = shape_of(spec)
            want = gen(dtype, "data", shape, cases.seed(root))
            mine = want if rank == root else gen(dtype, "data", shape, cases.seed(rank))
            t, guard = place(mine, spec)
            dist.broadcast(t, src=root)
            cases.check("result", t, want)
            cases.check_guard(guard)
    with cases.case(mode="async", root=ws - 1):
        want = gen(torch.float32, "data", (1031,), cases.seed(ws - 1))
        t = want.clone() if rank == ws - 1 else filler(torch.float32, (1031,))
        w = dist.broadcast(t, src=ws - 1, async_op=True)
        w.wait()
        cases.check("result", t, want)
    return cases.finish()


@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_broadcast(world_size, seed):
    run_ranks(world_size, _broadcast_rank, seed)


# --------------------------------------------------------------------------
# all_gather


def _all_gather_rank(rank, ws, seed, algo):
    quiet()
    cases = Cases("all_gather", rank, ws, seed, algo=algo)
    force(cases, algo)
    work = [(d, spec) for d in DTYPES for spec in shapes(SHAPES)]
    work.append((torch.float32, ("contig", MIB8 // 4)))
    for dtype, spec in work:
        shape = shape_of(spec)
        for form in ("list", "tensor-flat", "tensor-stacked"):
            if form == "tensor-stacked" and gloo_cannot("all_gather_into_tensor stacked"):
                continue
            if form == "list" and shape[0] >= MIB8 // 16:
                continue  # 8 MiB: the tensor forms only
            with cases.case(dtype=dtype, shape=spec, form=form):
                xs = [gen(dtype, "data", shape, cases.seed(r)) for r in range(ws)]
                inp, guard = place(xs[rank], spec)
                if form == "list":
                    outs = [filler(dtype, shape) for _ in range(ws)]
                    dist.all_gather(outs, inp)
                    for r in range(ws):
                        cases.check(f"output[{r}]", outs[r], xs[r])
                else:
                    if form == "tensor-flat":  # concatenated along dim 0
                        out = filler(dtype, (ws * shape[0],) + shape[1:])
                    else:
                        out = filler(dtype, (ws,) + shape)
                    dist.all_gather_into_tensor(out, inp)
                    cases.check("output", out.reshape((ws,) + shape), torch.stack(xs))
                cases.check("input unchanged", inp, xs[rank])
                cases.check_guard(guard)
    check_algo_log(cases, algo, "allgather", DIRECT if algo == "twoshot" else {algo})
    return cases.finish()


@pytest.mark.parametrize("algo", SCATTER_GATHER_ALGOS)
@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_all_gather(world_size, algo, seed):
    run_ranks(world_size, _all_gather_rank, seed, algo, timeout=300, env=debug_env(algo))


def _all_gather_coalesced_rank(rank, ws, seed, algo):
    """all_gather_into_tensor inside dist._coalescing_manager (FSDP2's path)."""
    quiet()
    cases = Cases("coalesced all_gather_into_tensor", rank, ws, seed, algo=algo)
    force(cases, algo)
    groups = [
        [(torch.float32, 7), (torch.float32, 1031), (torch.float32, 0), (torch.float32, 1)],
        [(torch.bfloat16, 1031), (torch.bfloat16, 65537)],
        [(torch.float32, 5), (torch.bfloat16, 13), (torch.int64, 3), (torch.uint8, 1031)],
        [(torch.float32, MIB8 // 4 // ws), (torch.float32, 1)],
    ]
    for gi, items in enumerate(groups):
        for async_ops in (False, True):
            with cases.case(group=gi, async_ops=async_ops, items=[(name(d), n) for d, n in items]):
                xs = [[gen(d, "data", (n,), cases.seed(r) + i) for i, (d, n) in enumerate(items)]
                      for r in range(ws)]
                outs = [filler(d, (ws * n,)) for d, n in items]
                with dist._coalescing_manager(async_ops=async_ops) as cm:
                    for i in range(len(items)):
                        dist.all_gather_into_tensor(outs[i], xs[rank][i])
                if async_ops:
                    cm.wait()
                for i, (d, n) in enumerate(items):
                    cases.check(f"output {i}", outs[i].reshape(ws, n),
                                torch.stack([xs[r][i] for r in range(ws)]))
    return cases.finish()


@pytest.mark.pycoll_only  # Gloo has no coalesced all_gather_into_tensor
@pytest.mark.parametrize("algo", SCATTER_GATHER_ALGOS)
@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_all_gather_coalesced(world_size, algo, seed):
    run_ranks(world_size, _all_gather_coalesced_rank, seed, algo)


# --------------------------------------------------------------------------
# reduce_scatter


def _reduce_scatter_rank(rank, ws, seed, algo):
    quiet()
    cases = Cases("reduce_scatter", rank, ws, seed, algo=algo)
    force(cases, algo)
    work = [(d, op, layout, n) for d in DTYPES for op in reduce_ops(d)
            for layout, n in shapes([("contig", s) for s in SIZES] + [("strided", 1031)])]
    work.append((torch.float32, "SUM", "contig", MIB8 // 4 // ws))
    if algo == "ring":
        work.append((torch.bfloat16, "AVG", "contig", MIB8 // 2 // ws))
    for dtype, op, layout, n in work:
        forms = ["tensor-flat"]
        # The other forms: fewer combinations.
        if (op == "SUM" or dtype == torch.float32) and n < MIB8 // 16:
            forms += ["list", "tensor-stacked"]
        for form in forms:
            if form == "tensor-stacked" and gloo_cannot("reduce_scatter_tensor stacked"):
                continue
            with cases.case(dtype=dtype, op=op, layout=layout, n_per_rank=n, form=form):
                xs = [gen(dtype, op, (ws * n,), cases.seed(r)) for r in range(ws)]
                factor = premul_factor(cases) if op == "PREMUL_SUM" else None
                inp, guard = place(xs[rank], (layout, ws * n))
                out = filler(dtype, (n,))
                if form == "tensor-flat":
                    dist.reduce_scatter_tensor(out, inp, op=dist_op(op, factor))
                elif form == "tensor-stacked":
                    dist.reduce_scatter_tensor(out, inp.view(ws, n), op=dist_op(op, factor))
                else:
                    chunks = [inp[j * n:(j + 1) * n] for j in range(ws)]
                    dist.reduce_scatter(out, chunks, op=dist_op(op, factor))
                ref, bound = reduce_ref(xs, op, dtype, factor)
                mine = slice(rank * n, (rank + 1) * n)
                if isinstance(bound, torch.Tensor):
                    bound = bound[mine]
                cases.check("output", out, ref[mine], bound)
                cases.check_guard(guard)
    check_algo_log(cases, algo, "reduce_scatter", DIRECT if algo == "twoshot" else {algo})
    return cases.finish()


@pytest.mark.parametrize("algo", SCATTER_GATHER_ALGOS)
@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_reduce_scatter(world_size, algo, seed):
    run_ranks(world_size, _reduce_scatter_rank, seed, algo, timeout=300, env=debug_env(algo))


# --------------------------------------------------------------------------
# all_reduce coalesced


def _all_reduce_coalesced_rank(rank, ws, seed, use_manager, algo):
    quiet()
    what = "all_reduce in _coalescing_manager" if use_manager else "all_reduce_coalesced"
    cases = Cases(what, rank, ws, seed, algo=algo)
    force(cases, algo)
    sizes = [7, 0, 1031, 1, 65537]
    for dtype in DTYPES:
        for op in reduce_ops(dtype):
            if use_manager and op != "SUM" and dtype not in (torch.float32, torch.int32):
                continue  # every algorithm: fewer combinations than all_reduce_coalesced
            for async_ops in (False, True):
                with cases.case(dtype=dtype, op=op, sizes=sizes, async_ops=async_ops):
                    xs = [[gen(dtype, op, (n,), cases.seed(r) + i) for i, n in enumerate(sizes)]
                          for r in range(ws)]
                    factor = premul_factor(cases) if op == "PREMUL_SUM" else None
                    ts = [x.clone() for x in xs[rank]]
                    if use_manager:
                        with dist._coalescing_manager(async_ops=async_ops) as cm:
                            for t in ts:
                                dist.all_reduce(t, op=dist_op(op, factor))
                        if async_ops:
                            cm.wait()
                    else:
                        w = dist.all_reduce_coalesced(ts, op=dist_op(op, factor),
                                                      async_op=async_ops)
                        if async_ops:
                            w.wait()
                    for i in range(len(sizes)):
                        ref, bound = reduce_ref([xs[r][i] for r in range(ws)], op, dtype, factor)
                        cases.check(f"tensor {i}", ts[i], ref, bound)
    if use_manager:
        check_algo_log(cases, algo, "allreduce", {algo})
    return cases.finish()


@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_all_reduce_coalesced(world_size, seed):
    run_ranks(world_size, _all_reduce_coalesced_rank, seed, False, "auto")


@pytest.mark.pycoll_only  # Gloo has no coalescing manager support
@pytest.mark.parametrize("algo", ALL_REDUCE_ALGOS)
@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_all_reduce_coalescing_manager(world_size, algo, seed):
    run_ranks(world_size, _all_reduce_coalesced_rank, seed, True, algo, env=debug_env(algo))


# --------------------------------------------------------------------------
# all_to_all


def _split_matrix(cases, ws, n):
    """S[i][j]: elements rank i sends to rank j (zeros included)."""
    g = torch.Generator().manual_seed(cases.seed())
    return torch.randint(0, n + 3, (ws, ws), generator=g).tolist()


def _all_to_all_rank(rank, ws, seed):
    quiet()
    cases = Cases("all_to_all", rank, ws, seed)

    def single_even(dtype, n):
        xs = [gen(dtype, "data", (ws * n,), cases.seed(r)) for r in range(ws)]
        out = filler(dtype, (ws * n,))
        dist.all_to_all_single(out, xs[rank].clone())
        want = torch.cat([xs[j][rank * n:(rank + 1) * n] for j in range(ws)])
        cases.check("output", out, want)

    def single_even_2d_strided(dtype, n):
        xs = [gen(dtype, "data", (ws * n, 3), cases.seed(r)) for r in range(ws)]
        base = filler(dtype, (ws * n, 5))
        inp = base[:, 1:4]  # rows of 3 out of 5: not contiguous
        inp.copy_(xs[rank])
        out = filler(dtype, (ws * n, 3))
        dist.all_to_all_single(out, inp)
        want = torch.cat([xs[j][rank * n:(rank + 1) * n] for j in range(ws)])
        cases.check("output", out, want)
        cases.check("columns around the input view", base[:, [0, 4]], filler(dtype, (ws * n, 2)))

    def single_uneven(dtype, n):
        s = _split_matrix(cases, ws, n)
        xs = [gen(dtype, "data", (sum(s[r]),), cases.seed(r)) for r in range(ws)]
        out = filler(dtype, (sum(s[j][rank] for j in range(ws)),))
        dist.all_to_all_single(out, xs[rank].clone(),
                               output_split_sizes=[s[j][rank] for j in range(ws)],
                               input_split_sizes=s[rank])
        want = torch.cat([xs[j][sum(s[j][:rank]):sum(s[j][:rank + 1])] for j in range(ws)])
        cases.check(f"output (splits {s})", out, want)

    def list_even(dtype, n):
        xs = [gen(dtype, "data", (ws * n,), cases.seed(r)) for r in range(ws)]
        outs = [filler(dtype, (n,)) for _ in range(ws)]
        dist.all_to_all(outs, [xs[rank][j * n:(j + 1) * n].clone() for j in range(ws)])
        for j in range(ws):
            cases.check(f"output[{j}]", outs[j], xs[j][rank * n:(rank + 1) * n])

    def list_uneven(dtype, n):
        s = _split_matrix(cases, ws, n)
        xs = [gen(dtype, "data", (sum(s[r]),), cases.seed(r)) for r in range(ws)]
        ins = list(xs[rank].clone().split(s[rank]))
        outs = [filler(dtype, (s[j][rank],)) for j in range(ws)]
        dist.all_to_all(outs, ins)
        for j in range(ws):
            lo = sum(s[j][:rank])
            cases.check(f"output[{j}] (splits {s})", outs[j], xs[j][lo:lo + s[j][rank]])

    forms = [("single even", single_even), ("single uneven", single_uneven),
             ("list even", list_even)]
    if not gloo_cannot("strided"):
        forms.append(("single even 2-D rows, strided input", single_even_2d_strided))
    if not gloo_cannot("all_to_all list uneven"):
        forms.append(("list uneven", list_uneven))
    work = [(d, n, form) for d in DTYPES for n in SIZES for form in forms]
    work.append((torch.float32, MIB8 // 4 // ws, forms[0]))
    work.append((torch.float32, MIB8 // 4 // ws, forms[1]))
    for dtype, n, (form, fn) in work:
        with cases.case(dtype=dtype, n=n, form=form):
            fn(dtype, n)
    return cases.finish()


@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_all_to_all(world_size, seed):
    run_ranks(world_size, _all_to_all_rank, seed, timeout=300)


# --------------------------------------------------------------------------
# gather / scatter


def _gather_scatter_rank(rank, ws, seed):
    quiet()
    cases = Cases("gather/scatter", rank, ws, seed)
    for root in range(ws):
        for dtype in DTYPES:
            for spec in shapes(SHAPES):
                shape = shape_of(spec)
                with cases.case(op="gather", root=root, dtype=dtype, shape=spec):
                    xs = [gen(dtype, "data", shape, cases.seed(r)) for r in range(ws)]
                    inp, guard = place(xs[rank], spec)
                    outs = [filler(dtype, shape) for _ in range(ws)] if rank == root else None
                    dist.gather(inp, outs, dst=root)
                    if rank == root:
                        for r in range(ws):
                            cases.check(f"gathered[{r}]", outs[r], xs[r])
                    cases.check("input unchanged", inp, xs[rank])
                    cases.check_guard(guard)
                with cases.case(op="scatter", root=root, dtype=dtype, shape=spec):
                    xs = [gen(dtype, "data", shape, cases.seed(r)) for r in range(ws)]
                    out, guard = place(filler(dtype, shape), spec)
                    ins = [x.clone() for x in xs] if rank == root else None
                    dist.scatter(out, ins, src=root)
                    cases.check("output", out, xs[rank])
                    cases.check_guard(guard)
    return cases.finish()


@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_gather_scatter(world_size, seed):
    run_ranks(world_size, _gather_scatter_rank, seed, timeout=300)


# --------------------------------------------------------------------------
# point to point


def _pairs(ws):
    return [(a, b) for a in range(ws) for b in range(a + 1, ws)]


def _send_recv_rank(rank, ws, seed):
    quiet()
    cases = Cases("send/recv", rank, ws, seed)
    nxt, prv = (rank + 1) % ws, (rank - 1) % ws

    # Everyone sends (isend) before receiving, round a ring; every dtype and
    # layout on both sides; then 8 MiB, which no eager buffer holds.
    work = [(d, spec) for d in DTYPES for spec in shapes(SHAPES)]
    work.append((torch.float32, ("contig", MIB8 // 4)))
    for dtype, spec in work:
        with cases.case(kind="ring, isend then recv", dtype=dtype, shape=spec):
            shape = shape_of(spec)
            mine = gen(dtype, "data", shape, cases.seed(rank))
            theirs = gen(dtype, "data", shape, cases.seed(prv))
            src, sguard = place(mine, spec)
            dst, rguard = place(filler(dtype, shape), spec)
            w = dist.isend(src, dst=nxt, tag=3)
            dist.recv(dst, src=prv, tag=3)
            w.wait()
            cases.check("received", dst, theirs)
            cases.check("sent tensor unchanged", src, mine)
            cases.check_guard(sguard)
            cases.check_guard(rguard)

    # Ranks outside a pair skip its cases, so the seeds here depend on the
    # pair, not on the case number.
    for a, b in _pairs(ws):
        if rank not in (a, b):
            continue
        peer = b if rank == a else a
        # Blocking send/recv, one direction after the other.
        with cases.case(kind="blocking send, then reply", pair=(a, b)):
            m1 = gen(torch.int64, "data", (1031,), cases.keyed_seed(a, b, a))
            m2 = gen(torch.float16, "data", (7,), cases.keyed_seed(a, b, b))
            if rank == a:
                dist.send(m1.clone(), dst=b)
                got = filler(torch.float16, (7,))
                dist.recv(got, src=b)
                cases.check("reply", got, m2)
            else:
                got = filler(torch.int64, (1031,))
                dist.recv(got, src=a)
                cases.check("message", got, m1)
                dist.send(m2.clone(), dst=a)

        # Two tagged messages received in the opposite order (same shape,
        # so only the tag tells them apart), with blocking recv.
        with cases.case(kind="tags, recv in reverse order", pair=(a, b)):
            x1 = gen(torch.float32, "data", (1031,), cases.keyed_seed(a, b, 0))
            x2 = gen(torch.float32, "data", (1031,), cases.keyed_seed(a, b, 1))
            if rank == a:
                w1 = dist.isend(x1.clone(), dst=b, tag=11)
                w2 = dist.isend(x2.clone(), dst=b, tag=12)
                w1.wait()
                w2.wait()
            else:
                g2 = filler(torch.float32, (1031,))
                g1 = filler(torch.float32, (1031,))
                dist.recv(g2, src=a, tag=12)
                dist.recv(g1, src=a, tag=11)
                cases.check("tag 12", g2, x2)
                cases.check("tag 11", g1, x1)

        # The same with irecv, different dtypes and sizes per tag, and the
        # sender the other way round.
        with cases.case(kind="tags, irecv in reverse order", pair=(a, b)):
            y1 = gen(torch.bfloat16, "data", (7,), cases.keyed_seed(a, b, 0))
            y2 = gen(torch.int32, "data", (65537,), cases.keyed_seed(a, b, 1))
            if rank == b:
                w1 = dist.isend(y1.clone(), dst=a, tag=21)
                w2 = dist.isend(y2.clone(), dst=a, tag=22)
                w2.wait()
                w1.wait()
            else:
                g2 = filler(torch.int32, (65537,))
                g1 = filler(torch.bfloat16, (7,))
                r2 = dist.irecv(g2, src=b, tag=22)
                r1 = dist.irecv(g1, src=b, tag=21)
                r1.wait()
                r2.wait()
                cases.check("tag 21", g1, y1)
                cases.check("tag 22", g2, y2)

        # Both send first (non-blocking), then both receive.
        with cases.case(kind="both send before receiving", pair=(a, b)):
            mine = gen(torch.float64, "data", (1031,), cases.keyed_seed(a, b, rank))
            theirs = gen(torch.float64, "data", (1031,), cases.keyed_seed(a, b, peer))
            big_mine = gen(torch.float32, "data", (MIB8 // 4,), cases.keyed_seed(a, b, rank) + 1)
            big_theirs = gen(torch.float32, "data", (MIB8 // 4,), cases.keyed_seed(a, b, peer) + 1)
            w1 = dist.isend(mine.clone(), dst=peer, tag=31)
            w2 = dist.isend(big_mine.clone(), dst=peer, tag=32)
            g1 = filler(torch.float64, (1031,))
            g2 = filler(torch.float32, (MIB8 // 4,))
            dist.recv(g1, src=peer, tag=31)
            dist.recv(g2, src=peer, tag=32)
            w1.wait()
            w2.wait()
            cases.check("small", g1, theirs)
            cases.check("8 MiB", g2, big_theirs)

        # Same tag: messages arrive in the order they were sent.
        with cases.case(kind="same tag keeps order", pair=(a, b)):
            msgs = [gen(torch.int64, "data", (n,), cases.keyed_seed(a, b, i))
                    for i, n in enumerate([3, 0, 1031, 1, 7])]
            if rank == a:
                ws_ = [dist.isend(m.clone(), dst=b, tag=41) for m in msgs]
                for w in ws_:
                    w.wait()
            else:
                for i, m in enumerate(msgs):
                    g = filler(torch.int64, m.shape)
                    dist.recv(g, src=a, tag=41)
                    cases.check(f"message {i}", g, m)
    dist.barrier()
    return cases.finish()


@pytest.mark.parametrize("world_size", P2P_WORLD_SIZES)
def test_send_recv(world_size, seed):
    run_ranks(world_size, _send_recv_rank, seed, timeout=300)


def _batch_isend_irecv_rank(rank, ws, seed):
    quiet()
    cases = Cases("batch_isend_irecv", rank, ws, seed)
    nxt, prv = (rank + 1) % ws, (rank - 1) % ws
    work = [(d, n) for d in DTYPES for n in SIZES] + [(torch.float32, MIB8 // 4)]
    for dtype, n in work:
        with cases.case(kind="ring", dtype=dtype, n=n):
            mine = gen(dtype, "data", (n,), cases.seed(rank))
            got = filler(dtype, (n,))
            ops = [dist.P2POp(dist.isend, mine.clone(), nxt),
                   dist.P2POp(dist.irecv, got, prv)]
            for req in dist.batch_isend_irecv(ops):
                req.wait()
            cases.check("received", got, gen(dtype, "data", (n,), cases.seed(prv)))
    for dtype in (torch.float32, torch.bfloat16, torch.int8):
        with cases.case(kind="every pair in one batch, two messages each", dtype=dtype):
            def msg(src, dst, k):
                return gen(dtype, "data", (1031 if k else 7,), cases.seed(src) + 97 * dst + k)
            ops, gots = [], {}
            for peer in range(ws):
                if peer == rank:
                    continue
                for k in range(2):
                    ops.append(dist.P2POp(dist.isend, msg(rank, peer, k), peer, tag=k))
                    gots[(peer, k)] = filler(dtype, (1031 if k else 7,))
                    ops.append(dist.P2POp(dist.irecv, gots[(peer, k)], peer, tag=k))
            for req in dist.batch_isend_irecv(ops):
                req.wait()
            for (peer, k), g in gots.items():
                cases.check(f"from rank {peer} message {k}", g, msg(peer, rank, k))
    return cases.finish()


@pytest.mark.parametrize("world_size", P2P_WORLD_SIZES)
def test_batch_isend_irecv(world_size, seed):
    run_ranks(world_size, _batch_isend_irecv_rank, seed)


def _self_p2p_rank(rank, ws, seed):
    quiet()
    cases = Cases("send/recv to self", rank, ws, seed)
    with cases.case(kind="batch: receive posted first, two tags out of order, plus a ring exchange"):
        a = gen(torch.float32, "data", (1031,), cases.seed(rank))
        b = gen(torch.int64, "data", (7,), cases.seed(rank) + 1)
        got_a, got_b = filler(torch.float32, (1031,)), filler(torch.int64, (7,))
        ops = [dist.P2POp(dist.irecv, got_b, rank, tag=2), dist.P2POp(dist.irecv, got_a, rank, tag=1),
               dist.P2POp(dist.isend, a, rank, tag=1), dist.P2POp(dist.isend, b, rank, tag=2)]
        if ws > 1:
            ring = filler(torch.float32, (1031,))
            ops += [dist.P2POp(dist.isend, a, (rank + 1) % ws), dist.P2POp(dist.irecv, ring, (rank - 1) % ws)]
        for req in dist.batch_isend_irecv(ops):
            req.wait()
        cases.check("tag 1", got_a, a)
        cases.check("tag 2", got_b, b)
        if ws > 1:
            cases.check("ring", ring, gen(torch.float32, "data", (1031,), cases.seed((rank - 1) % ws)))
    with cases.case(kind="sizes that do not match"):
        w = dist.isend(torch.ones(5), rank, tag=9)
        try:
            dist.recv(torch.empty(6), rank, tag=9)
            raise AssertionError("a receive of 6 elements matched a send of 5 without an error")
        except (RuntimeError, ValueError) as e:
            assert "send to self of 5 elements" in str(e), str(e)
        try:
            w.wait()
            raise AssertionError("the send's wait() did not report the mismatch")
        except (RuntimeError, ValueError):
            pass
    return cases.finish()


@pytest.mark.pycoll_only
@pytest.mark.parametrize("world_size", [1, 2])
def test_send_recv_to_self(world_size, seed):
    run_ranks(world_size, _self_p2p_rank, seed)


def _eight_ranks_rank(rank, ws, seed):
    """Every algorithm at 8 ranks (deeper trees, longer rings) on a few shapes, in one launch."""
    quiet()
    cases = Cases("8 ranks", rank, ws, seed)
    algos = ["auto"] if IS_GLOO else ["oneshot", "twoshot", "ring", "tree", "auto"]
    for algo in algos:
        force(cases, algo)
        for dtype, op, n in [(torch.float32, "SUM", 1031), (torch.bfloat16, "AVG", 7),
                             (torch.int64, "BXOR", 65537), (torch.float32, "MAX", 0),
                             (torch.float32, "SUM", (1 << 20) + 3)]:
            with cases.case(op="all_reduce", algo=algo, dtype=dtype, reduce=op, n=n):
                check_one_all_reduce(cases, rank, ws, dtype, op, n)
        if algo in ("ring", "twoshot", "auto"):
            for n in (1, 4099):
                with cases.case(op="all_gather / reduce_scatter", algo=algo, n=n):
                    xs = [gen(torch.float32, "SUM", (n,), cases.seed(r) + 1) for r in range(ws)]
                    out = torch.empty(ws * n)
                    dist.all_gather_into_tensor(out, xs[rank])
                    cases.check("all_gather", out, torch.cat(xs))
                    big = [gen(torch.float32, "SUM", (ws * n,), cases.seed(r) + 2) for r in range(ws)]
                    got = torch.empty(n)
                    dist.reduce_scatter_tensor(got, big[rank])
                    ref, bound = reduce_ref([b[rank * n:(rank + 1) * n] for b in big], "SUM", torch.float32)
                    cases.check("reduce_scatter", got, ref, bound)
    if not IS_GLOO:
        set_algo("auto")
    with cases.case(op="broadcast from rank 5, send/recv round the ring"):
        x = gen(torch.float64, "SUM", (513,), cases.seed(5))
        b = x.clone() if rank == 5 else torch.zeros(513, dtype=torch.float64)
        dist.broadcast(b, src=5)
        cases.check("broadcast", b, x)
        mine = gen(torch.int32, "SUM", (1031,), cases.seed(rank) + 3)
        got = torch.zeros(1031, dtype=torch.int32)
        ops = [dist.P2POp(dist.isend, mine, (rank + 1) % ws), dist.P2POp(dist.irecv, got, (rank - 1) % ws)]
        for req in dist.batch_isend_irecv(ops):
            req.wait()
        cases.check("received", got, gen(torch.int32, "SUM", (1031,), cases.seed((rank - 1) % ws) + 3))
        dist.barrier()
    return cases.finish()


def test_eight_ranks(seed):
    run_ranks(8, _eight_ranks_rank, seed, timeout=400)


# --------------------------------------------------------------------------
# barrier, object collectives


def _barrier_rank(rank, ws, seed, tmpdir):
    cases = Cases("barrier", rank, ws, seed)
    for rnd in range(3):
        late = rnd % ws
        for async_op in (False, True):
            with cases.case(round=rnd, late_rank=late, async_op=async_op):
                if rank == late:
                    time.sleep(0.4)
                open(os.path.join(tmpdir, f"{rnd}-{async_op}-{rank}"), "w").close()
                w = dist.barrier(async_op=async_op)
                if async_op:
                    w.wait()
                missing = [r for r in range(ws)
                           if not os.path.exists(os.path.join(tmpdir, f"{rnd}-{async_op}-{r}"))]
                if missing:
                    cases.fail("barrier", f"returned before ranks {missing} arrived")
    return cases.finish()


@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_barrier(world_size, seed, tmp_path):
    run_ranks(world_size, _barrier_rank, seed, str(tmp_path))


def _obj(r, salt):
    return {"rank": r, "salt": salt, "list": list(range(r * 3)), "text": "x" * (r * 1000 + 1),
            "nested": {"t": (r, None, 2.5)}, "tensor": torch.arange(r + 1, dtype=torch.int16)}


def _same_obj(a, b):
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same_obj(a[k], b[k]) for k in a)
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)
                and a.dtype == b.dtype and torch.equal(a, b))
    return a == b


def _objects_rank(rank, ws, seed):
    quiet()
    cases = Cases("object collectives", rank, ws, seed)
    with cases.case(op="all_gather_object"):
        out = [None] * ws
        dist.all_gather_object(out, _obj(rank, seed))
        for r in range(ws):
            cases.expect(_same_obj(out[r], _obj(r, seed)), f"object from rank {r}")
    for root in range(ws):
        with cases.case(op="broadcast_object_list", root=root):
            want = [_obj(root, seed), f"root {root}", 12345, None]
            lst = list(want) if rank == root else [None, "junk", 0, 1]
            dist.broadcast_object_list(lst, src=root)
            cases.expect(len(lst) == 4 and all(_same_obj(x, y) for x, y in zip(lst, want)),
                         "broadcast list")
        with cases.case(op="gather_object", root=root):
            out = [None] * ws if rank == root else None
            dist.gather_object(_obj(rank, seed + root), out, dst=root)
            if rank == root:
                for r in range(ws):
                    cases.expect(_same_obj(out[r], _obj(r, seed + root)), f"object from rank {r}")
    return cases.finish()


@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_object_collectives(world_size, seed):
    run_ranks(world_size, _objects_rank, seed)


# --------------------------------------------------------------------------
# PYCOLL_ALGO environment variable


def _algo_env_rank(rank, ws, seed, algo):
    import pycollectives

    quiet()
    cases = Cases("PYCOLL_ALGO", rank, ws, seed, env_algo=algo)
    got = pycollectives.get_algo()
    ok = got in (None, "auto") if algo == "auto" else got == algo
    if not ok:
        cases.fail("get_algo", f"returned {got!r} with PYCOLL_ALGO={algo}")
    for dtype, op, n in [(torch.float32, "SUM", 1031), (torch.bfloat16, "SUM", 65537),
                         (torch.int64, "PRODUCT", 7), (torch.float32, "MAX", MIB8 // 4)]:
        with cases.case(dtype=dtype, op=op, n=n):
            check_one_all_reduce(cases, rank, ws, dtype, op, n)
    # set_algo overrides the environment, and "auto" goes back to the cost model.
    other = "ring" if algo != "ring" else "tree"
    pycollectives.set_algo(other)
    cases.expect(pycollectives.get_algo() == other, f"get_algo() == {other!r} after set_algo")
    pycollectives.set_algo("auto")
    cases.expect(pycollectives.get_algo() in (None, "auto"),
                 "get_algo() is auto after set_algo('auto')")
    pycollectives.set_algo(other)
    pycollectives.set_algo(None)
    cases.expect(pycollectives.get_algo() in (None, "auto"),
                 "get_algo() is auto after set_algo(None)")
    return cases.finish()


@pytest.mark.pycoll_only
@pytest.mark.parametrize("algo", ALGOS)
def test_algo_from_environment(algo, seed):
    run_ranks(3, _algo_env_rank, seed, algo, env={"PYCOLL_ALGO": algo})
