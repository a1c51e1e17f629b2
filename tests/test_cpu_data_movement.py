"""The collectives that move data without reducing it, on CPU tensors, compared exactly: broadcast,
all_gather (list, flat, stacked, coalesced), all_to_all (even, uneven, strided), gather, scatter.
"""

import pytest
import torch
import torch.distributed as dist

from cpu_collectives_util import (DIRECT, MIB8, SCATTER_GATHER_ALGOS, SHAPES, SIZES, WORLD_SIZES, Cases,
                                  check_algo_log, debug_env, force, gloo_cannot, place, shape_of, shapes)
from ranks import quiet, run_ranks
from reference import DTYPES, filler, gen, name


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
