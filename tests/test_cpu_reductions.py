"""The reducing collectives on CPU tensors against a float64 / int64 reference: all_reduce (every
algorithm, sync and async), all_reduce_coalesced and the coalescing manager, reduce, reduce_scatter.
"""

import pytest
import torch
import torch.distributed as dist

from cpu_collectives_util import (ALL_REDUCE_ALGOS, DIRECT, MIB8, SCATTER_GATHER_ALGOS, SHAPES,
                                  SHAPES_ALL_REDUCE, SIZES, WORLD_SIZES, Cases, check_algo_log,
                                  debug_env, force, gloo_cannot, place, reduce_ops, shape_of, shapes)
from ranks import quiet, run_ranks
from reference import DTYPES, dist_op, filler, gen, name, reduce_ref


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
