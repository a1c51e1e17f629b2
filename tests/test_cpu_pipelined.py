"""The pipelined CPU algorithms (csrc/cpu/pipelined.h): all_reduce, reduce_scatter,
all_gather and broadcast of large messages through rings of small slots, one lane per thread.

Sizes are above the size from which the direct ops run pipelined (256 KiB) and odd, so that
slices, lanes and steps all end unevenly; a small data region (PYCOLL_SHM_BYTES=64K) makes
tiny slots and so hundreds of steps, which exercises slot reuse; several lanes run with
PYCOLL_CPU_THREADS, ranks offering different counts. Pipelined ops are mixed with direct, ring
and tree ops, which share the data region, and every result is checked against a plain torch
computation and for bitwise identity across ranks.
"""
import datetime
import os
import random
import re
import sys
import time

import pytest
import torch
import torch.distributed as dist

from cpu_collectives_util import Cases, reduce_ops
from ranks import IS_GLOO, quiet, run_ranks, set_algo
from reference import DTYPES, dist_op, gen, reduce_ref

PIPELINE_BYTES = 300 << 10  # above the pipelined threshold


def _elems(dtype, nbytes):
    return nbytes // torch.empty((), dtype=dtype).element_size()


def _premul_factor(cases):
    g = torch.Generator().manual_seed(cases.seed())
    return 0.25 + 1.75 * torch.rand((), generator=g, dtype=torch.float64).item()


def _check_all_reduce(cases, rank, ws, dtype, op, n):
    xs = [gen(dtype, op, (n,), cases.seed(r)) for r in range(ws)]
    factor = _premul_factor(cases) if op == "PREMUL_SUM" else None
    t = xs[rank].clone()
    dist.all_reduce(t, op=dist_op(op, factor))
    ref, bound = reduce_ref(xs, op, dtype, factor)
    cases.check("all_reduce", t, ref, bound)
    cases.check_identical(t)


def _check_reduce_scatter(cases, rank, ws, dtype, op, m, in_place):
    big = [gen(dtype, op, (ws * m,), cases.seed(r)) for r in range(ws)]
    mine = big[rank].clone()
    got = mine.narrow(0, rank * m, m) if in_place else torch.empty(m, dtype=dtype)
    dist.reduce_scatter_tensor(got, mine, op=dist_op(op))
    ref, bound = reduce_ref([b[rank * m:(rank + 1) * m] for b in big], op, dtype)
    cases.check("reduce_scatter", got, ref, bound)


def _check_all_gather(cases, rank, ws, dtype, m, in_place):
    xs = [gen(dtype, "data", (m,), cases.seed(r)) for r in range(ws)]
    out = torch.empty(ws * m, dtype=dtype)
    if in_place:
        out.narrow(0, rank * m, m).copy_(xs[rank])
        dist.all_gather_into_tensor(out, out.narrow(0, rank * m, m))
    else:
        dist.all_gather_into_tensor(out, xs[rank])
    cases.check("all_gather", out, torch.cat(xs))


def _check_broadcast(cases, rank, ws, dtype, n, root):
    x = gen(dtype, "data", (n,), cases.seed(root))
    b = x.clone() if rank == root else torch.zeros(n, dtype=dtype)
    dist.broadcast(b, src=root)
    cases.check("broadcast", b, x)


def _collectives_rank(rank, ws, seed):
    quiet()
    cases = Cases("pipelined", rank, ws, seed)
    for dtype in DTYPES:
        n = _elems(dtype, PIPELINE_BYTES) + 3
        for op in reduce_ops(dtype):
            with cases.case(op="all_reduce", dtype=dtype, reduce=op, n=n):
                _check_all_reduce(cases, rank, ws, dtype, op, n)
        m = _elems(dtype, PIPELINE_BYTES) // ws + 5
        for op in ("SUM", "MAX"):
            for in_place in (False, True):
                with cases.case(op="reduce_scatter", dtype=dtype, reduce=op, m=m, in_place=in_place):
                    _check_reduce_scatter(cases, rank, ws, dtype, op, m, in_place)
        for in_place in (False, True):
            with cases.case(op="all_gather", dtype=dtype, m=m, in_place=in_place):
                _check_all_gather(cases, rank, ws, dtype, m, in_place)
        with cases.case(op="broadcast", dtype=dtype, n=n, root=ws - 1):
            _check_broadcast(cases, rank, ws, dtype, n, ws - 1)
    # Several MiB: many steps per lane, slices of unequal length.
    big = 3_000_017
    for dtype, op in ((torch.float32, "SUM"), (torch.bfloat16, "AVG")):
        with cases.case(op="all_reduce", dtype=dtype, reduce=op, n=big):
            _check_all_reduce(cases, rank, ws, dtype, op, big)
    with cases.case(op="all_reduce strided", n=big):
        base = gen(torch.float32, "SUM", (2 * big,), cases.seed(rank))
        view = base[::2]
        saved = base[1::2].clone()
        dist.all_reduce(view)
        ref, bound = reduce_ref([gen(torch.float32, "SUM", (2 * big,), cases.seed(r))[::2] for r in range(ws)],
                                "SUM", torch.float32)
        cases.check("strided result", view, ref, bound)
        cases.check("memory between the strided elements", base[1::2], saved)
    with cases.case(op="reduce_scatter", n=big):
        _check_reduce_scatter(cases, rank, ws, torch.float32, "SUM", big // ws + 1, False)
    with cases.case(op="all_gather", n=big):
        _check_all_gather(cases, rank, ws, torch.float64, big // ws + 1, False)
    with cases.case(op="broadcast", n=big, root=0):
        _check_broadcast(cases, rank, ws, torch.int32, big, 0)
    return cases.finish()


# Staged on every host: with threads to spare auto would read a large reduce_scatter in place
# (test_cpu_peer_read.py covers that path).
STAGED = {"PYCOLL_CPU_PEER_READ": "off"}


@pytest.mark.parametrize("ws", [2, 3, 4])
def test_pipelined_collectives(ws, seed):
    run_ranks(ws, _collectives_rank, seed, timeout=300, env=STAGED)


@pytest.mark.parametrize("ws", [2, 4])
def test_pipelined_tiny_slots(ws, seed):
    """A 64 KiB data region: slots of a few KiB, hundreds of steps per op, every slot reused."""
    run_ranks(ws, _collectives_rank, seed, timeout=300, env={**STAGED, "PYCOLL_SHM_BYTES": "64K"})


# A random mix of op kinds and sizes, the same on every rank: pipelined ops follow direct,
# ring and tree ops that use the same shared memory differently.
MIX_SIZES = [0, 7, 1031, 70_001, 300_007]


def _mixed_rank(rank, ws, seed):
    quiet()
    cases = Cases("mixed", rank, ws, seed)
    rng = random.Random(seed)
    algos = ["auto"] if IS_GLOO else ["auto", "auto", "ring", "tree", "oneshot"]
    for i in range(40):
        kind = rng.choice(["all_reduce", "reduce_scatter", "all_gather", "broadcast"])
        n = rng.choice(MIX_SIZES)
        algo = rng.choice(algos)
        if not IS_GLOO:
            set_algo(algo)
        with cases.case(i=i, op=kind, n=n, algo=algo):
            if kind == "all_reduce":
                _check_all_reduce(cases, rank, ws, torch.float32, "SUM", n)
            elif kind == "reduce_scatter":
                _check_reduce_scatter(cases, rank, ws, torch.float32, "SUM", n // ws + 1, False)
            elif kind == "all_gather":
                _check_all_gather(cases, rank, ws, torch.float32, n // ws + 1, False)
            else:
                _check_broadcast(cases, rank, ws, torch.float32, n, i % ws)
    if not IS_GLOO:
        set_algo("auto")
    return cases.finish()


@pytest.mark.parametrize("ws", [3, 4])
def test_pipelined_mixed_with_other_algorithms(ws, seed):
    run_ranks(ws, _mixed_rank, seed, timeout=300)


LANES_LINE = re.compile(r"\[pycoll \d+/\d+\] (\w+) .*plan=pipelined lanes=(\d+)")


def _lanes_rank(rank, ws, seed, expected_lanes):
    quiet()
    cases = Cases("lanes", rank, ws, seed)
    n = (6 << 20) // 4 + 11  # 6 MiB: up to 12 lanes of 512 KiB
    for dtype, op in ((torch.float32, "SUM"), (torch.float16, "MAX"), (torch.int64, "BXOR")):
        with cases.case(op="all_reduce", dtype=dtype, reduce=op):
            _check_all_reduce(cases, rank, ws, dtype, op, n)
    with cases.case(op="reduce_scatter"):
        _check_reduce_scatter(cases, rank, ws, torch.float32, "SUM", n // ws, True)
    with cases.case(op="all_gather"):
        _check_all_gather(cases, rank, ws, torch.float32, n // ws, False)
    with cases.case(op="broadcast"):
        _check_broadcast(cases, rank, ws, torch.float32, n, 1)
    if not IS_GLOO:
        sys.stderr.flush()
        with open(os.environ["PYCOLL_TEST_LOG"], errors="replace") as f:
            lanes = {int(m.group(2)) for m in LANES_LINE.finditer(f.read())}
        cases.expect(lanes == {expected_lanes}, f"lanes logged {lanes}, expected {{{expected_lanes}}}")
    return cases.finish()


@pytest.mark.pycoll_only
def test_pipelined_lanes_use_the_fewest_threads_offered(seed):
    """Rank 0 offers 3 threads, rank 1 offers 4: every op runs 3 lanes, on worker threads."""
    run_ranks(2, _lanes_rank, seed, 3, timeout=300, env={"PYCOLL_DEBUG": "INFO"},
              rank_env=[{"PYCOLL_CPU_THREADS": "3"}, {"PYCOLL_CPU_THREADS": "4"}])


def _expect_lanes_of(cases, log, check, expected_lanes, **case):
    """Runs `check` as one case; the first pipelined op it logs must have run `expected_lanes`
    lanes (the op's own line comes first; the bitwise-identity check may log an all_gather after it)."""
    sys.stderr.flush()
    start = os.path.getsize(log)
    with cases.case(**case):
        check()
    sys.stderr.flush()
    with open(log, errors="replace") as f:
        f.seek(start)
        first = LANES_LINE.search(f.read())
    lanes = int(first.group(2)) if first else None
    cases.expect(lanes == expected_lanes, f"{case}: lanes logged {lanes}, expected {expected_lanes}")


def _lanes_by_ranks_rank(rank, ws, seed, kib, expected_lanes):
    quiet()
    cases = Cases("lanes by ranks", rank, ws, seed)
    log = os.environ["PYCOLL_TEST_LOG"]
    n = (kib << 10) // 4 + 11  # just over `kib` KiB of float32
    checks = {
        "all_reduce": lambda: _check_all_reduce(cases, rank, ws, torch.float32, "SUM", n),
        "all_gather": lambda: _check_all_gather(cases, rank, ws, torch.float32, n // ws, False),
        "broadcast": lambda: _check_broadcast(cases, rank, ws, torch.float32, n, 0),
    }
    for name, check in checks.items():
        _expect_lanes_of(cases, log, check, expected_lanes, op=name)
    return cases.finish()


@pytest.mark.pycoll_only
@pytest.mark.parametrize("ws,kib,expected_lanes", [(2, 1024, 8), (3, 1024, 2), (2, 768, 6), (3, 768, 1)])
def test_pipelined_lane_size_depends_on_ranks(ws, kib, expected_lanes, seed):
    """With 8 threads offered, 1 MiB runs 8 lanes of 128 KiB over 2 ranks but 2 lanes of 512 KiB
    over 3 (with more ranks every rank's lanes spin at once; pipelined.cpp); 768 KiB runs 6 lanes
    over 2 ranks (several from 256 KiB), one over 3."""
    run_ranks(ws, _lanes_by_ranks_rank, seed, kib, expected_lanes, timeout=300,
              env={"PYCOLL_DEBUG": "INFO", "PYCOLL_CPU_THREADS": "8"})


def _lane_counts_vary_rank(rank, ws, seed, plan):
    quiet()
    cases = Cases("lane counts vary", rank, ws, seed)
    log = os.environ["PYCOLL_TEST_LOG"]
    for step, (kib, expected_lanes) in enumerate(plan):
        n = (kib << 10) // 4 + 11
        _expect_lanes_of(cases, log, lambda: _check_all_reduce(cases, rank, ws, torch.float32, "SUM", n),
                         expected_lanes, step=step, kib=kib)
    return cases.finish()


@pytest.mark.pycoll_only
def test_pipelined_lane_counts_rise_and_fall(seed):
    """3 ranks, 8 threads: back-to-back all_reduces whose lane counts go 8, 2, 4, 8, 1, 2, 8, so
    workers sit out some ops and rejoin later ones (an op wakes only the workers it has lanes
    for, and a worker spins only after an op it ran: lane_pool.cpp). Every result is checked.
    Between them the identity check's all_gathers run lanes of their own (6 after the 2 MiB
    step, for example), so the pool sees more counts than these. A pool that failed to wake a
    worker with a lane would hang here and fail at the timeout; one that woke too many would
    still pass (that costs only time: docs/decisions/0026-cpu-pipeline-lanes-slots-and-steps.md)."""
    plan = [(4096, 8), (1024, 2), (2048, 4), (4096, 8), (512, 1), (1024, 2), (4096, 8)]
    run_ranks(3, _lane_counts_vary_rank, seed, plan, timeout=300,
              env={"PYCOLL_DEBUG": "INFO", "PYCOLL_CPU_THREADS": "8"})


def _dies_in_pipeline_rank(rank, ws):
    quiet()
    x = torch.ones((8 << 20) // 4)
    dist.all_reduce(x)
    if rank == ws - 1:
        os._exit(17)
    t0 = time.monotonic()
    try:
        for _ in range(3):  # the first may already fail; must not hang
            dist.all_reduce(x)
    except RuntimeError as e:
        took = time.monotonic() - t0
        assert took < 20, f"raised only after {took:.1f}s: {e}"
        assert re.search(r"rank \d exited|timed out", str(e)), str(e)
        return took
    raise AssertionError("a pipelined all_reduce with a dead peer did not raise")


@pytest.mark.pycoll_only
@pytest.mark.parametrize("ws", [2, 3])
def test_peer_dying_during_pipelined_ops_raises(ws):
    run_ranks(ws, _dies_in_pipeline_rank, pg_timeout=datetime.timedelta(seconds=5),
              expect_exit={ws - 1: 17}, timeout=60)


@pytest.mark.pycoll_only
@pytest.mark.parametrize("cpus,ranks,expected", [(16, 2, 7), (16, 4, 3), (32, 2, 15), (2, 2, 1), (1, 1, 1), (8, 1, 7)])
def test_auto_threads_leave_one_cpu_free(cpus, ranks, expected):
    """Without PYCOLL_CPU_THREADS a rank takes (CPUs - 1) / ranks threads, at least 1 (lane_pool.cpp:
    a descheduled lane stalls every rank's lanes)."""
    from pycollectives import _C

    assert _C.cpu_auto_threads_per_rank(cpus, ranks) == expected


@pytest.mark.pycoll_only
@pytest.mark.parametrize("configured", [None, "3", "16"])
def test_memory_floor_uses_the_engines_threads(configured, monkeypatch):
    """The benchmark's memory floor runs with the threads the engine gives a rank: the setting, else
    the automatic count of this machine's CPUs (at most 16)."""
    from pycollectives import _C
    from pycollectives.bench import floor

    if configured is None:
        monkeypatch.delenv("PYCOLL_CPU_THREADS", raising=False)
    else:
        monkeypatch.setenv("PYCOLL_CPU_THREADS", configured)
    for ranks in (1, 2, 4):
        if configured is None:
            expected = min(16, _C.cpu_auto_threads_per_rank(len(os.sched_getaffinity(0)), ranks))
        else:
            expected = min(16, int(configured))
        assert floor.threads_per_rank(ranks) == expected
