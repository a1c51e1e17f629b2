"""Choosing the algorithm on CPU: every algorithm at 8 ranks (deeper trees, longer rings), and
PYCOLL_ALGO from the environment against set_algo.
"""

import pytest
import torch
import torch.distributed as dist

from cpu_collectives_util import MIB8, Cases, check_one_all_reduce, force
from ranks import ALGOS, IS_GLOO, quiet, run_ranks, set_algo
from reference import gen, reduce_ref


# --------------------------------------------------------------------------
# every algorithm at 8 ranks


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
