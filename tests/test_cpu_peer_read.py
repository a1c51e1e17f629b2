"""Large CPU all_gather, reduce_scatter and broadcast that read each peer's buffer in place with cross-memory
attach (csrc/cpu/peer_read.h, PYCOLL_CPU_PEER_READ=on), and the fall-back to staging when
a rank may not read its peers (the test hook _C._set_test_deny_peer_read).

Results are checked against plain torch, the debug log against the path that ran, across 2-4
ranks, several lanes (PYCOLL_CPU_THREADS), odd sizes, in place, strided outputs and every root.
"""
import datetime
import os
import re
import sys
import threading
import time

import pytest
import torch
import torch.distributed as dist

from cpu_collectives_util import Cases
from cross_memory_attach import DENIED
from ranks import quiet, run_ranks
from reference import dist_op, gen, reduce_ref

pytestmark = pytest.mark.pycoll_only

PLAN_LINE = re.compile(r"\[pycoll \d+/\d+\] (allgather|reduce_scatter|broadcast) .*plan=(read in place|pipelined) lanes=(\d+)")


def _log():
    sys.stderr.flush()
    with open(os.environ["PYCOLL_TEST_LOG"], errors="replace") as f:
        return f.read()


def _check_reduce_scatter(cases, what, out, ins, rank, m, op):
    """out against block `rank` of every input reduced by plain torch (reference.reduce_ref)."""
    ref, bound = reduce_ref([x.narrow(0, rank * m, m) for x in ins], op, out.dtype)
    cases.check(what, out, ref, bound)


def _ops_rank(rank, ws, seed, deny_on, expected_plan):
    quiet()
    from pycollectives import _C

    if rank == deny_on:
        _C._set_test_deny_peer_read(True)
    cases = Cases("peer read", rank, ws, seed)
    for dtype, nbytes in ((torch.float32, (300 << 10) + 12), (torch.bfloat16, (1 << 20) + 6), (torch.int8, 3 << 20)):
        m = nbytes // torch.empty((), dtype=dtype).element_size() // ws
        xs = [gen(dtype, "data", (m,), cases.seed(r)) for r in range(ws)]
        with cases.case(op="all_gather", dtype=dtype, m=m):
            out = torch.empty(ws * m, dtype=dtype)
            dist.all_gather_into_tensor(out, xs[rank])
            cases.check("all_gather", out, torch.cat(xs))
        with cases.case(op="all_gather in place", dtype=dtype, m=m):
            out = torch.zeros(ws * m, dtype=dtype)
            out.narrow(0, rank * m, m).copy_(xs[rank])
            dist.all_gather_into_tensor(out, out.narrow(0, rank * m, m))
            cases.check("all_gather in place", out, torch.cat(xs))
        with cases.case(op="all_gather list", dtype=dtype, m=m):
            outs = [torch.empty(m, dtype=dtype) for _ in range(ws)]
            dist.all_gather(outs, xs[rank])
            for r in range(ws):
                cases.check(f"all_gather list block {r}", outs[r], xs[r])
        for op in ("SUM", "MAX") + (("AVG",) if dtype.is_floating_point else ()):
            with cases.case(op="reduce_scatter", dtype=dtype, reduce=op, m=m):
                ins = [gen(dtype, op, (ws * m,), cases.seed(100 + r)) for r in range(ws)]
                out = torch.empty(m, dtype=dtype)
                dist.reduce_scatter_tensor(out, ins[rank].clone(), op=dist_op(op))
                _check_reduce_scatter(cases, "reduce_scatter", out, ins, rank, m, op)
        with cases.case(op="reduce_scatter in place", dtype=dtype, m=m):
            # out is my block of in: the peers read the other blocks of it while I write this one
            ins = [gen(dtype, "SUM", (ws * m,), cases.seed(200 + r)) for r in range(ws)]
            buf = ins[rank].clone()
            out = buf.narrow(0, rank * m, m)
            dist.reduce_scatter_tensor(out, buf)
            _check_reduce_scatter(cases, "reduce_scatter in place", out, ins, rank, m, "SUM")
        with cases.case(op="reduce_scatter list", dtype=dtype, m=m):
            ins = [gen(dtype, "SUM", (ws * m,), cases.seed(300 + r)) for r in range(ws)]
            out = torch.empty(m, dtype=dtype)
            dist.reduce_scatter(out, list(ins[rank].chunk(ws)))
            _check_reduce_scatter(cases, "reduce_scatter list", out, ins, rank, m, "SUM")
        for root in range(ws):
            with cases.case(op="broadcast", dtype=dtype, root=root):
                x = gen(dtype, "data", (ws * m,), cases.seed(root))
                b = x.clone() if rank == root else torch.zeros(ws * m, dtype=dtype)
                dist.broadcast(b, src=root)
                cases.check("broadcast", b, x)
    with cases.case(op="broadcast strided"):
        x = gen(torch.float32, "data", (2, 300 << 8), cases.seed(0))
        b = (x.clone() if rank == 0 else torch.zeros_like(x)).t()  # not contiguous
        dist.broadcast(b, src=0)
        cases.check("broadcast strided", b, x.t())
    log = _log()
    plans = {m.group(2) for m in PLAN_LINE.finditer(log)}
    cases.expect(plans == {expected_plan}, f"plans logged {plans}, expected {{{expected_plan!r}}}")
    cases.expect(log.count(DENIED) == (1 if deny_on is not None else 0),
                 f"{log.count(DENIED)} lines say cross-memory attach is not allowed")
    return cases.finish()


@pytest.mark.parametrize("ws", [2, 3, 4])
def test_peer_read_all_gather_and_broadcast(ws, seed, needs_cross_memory_attach):
    run_ranks(ws, _ops_rank, seed, None, "read in place", timeout=300,
              env={"PYCOLL_CPU_PEER_READ": "on", "PYCOLL_CPU_THREADS": "3", "PYCOLL_DEBUG": "INFO"})


@pytest.mark.parametrize("ws", [2, 3])
def test_peer_read_denied_on_one_rank_stages_everywhere(ws, seed):
    """One rank may not read its peers: every rank stages, and each says so once in the debug log."""
    run_ranks(ws, _ops_rank, seed, ws - 1, "pipelined", timeout=300,
              env={"PYCOLL_CPU_PEER_READ": "on", "PYCOLL_DEBUG": "INFO"})


@pytest.mark.parametrize("modes,expected", [(("on", "off"), "pipelined"), (("on", "on", "auto"), "pipelined"),
                                            (("off", "on", "on"), "pipelined")])
def test_peer_read_modes_that_differ_between_ranks_use_the_least(modes, expected, seed):
    """PYCOLL_CPU_PEER_READ set differently per rank: every rank takes the least (off < auto < on),
    so none waits for a peer that stages while it reads in place; no size here reaches auto's rule."""
    run_ranks(len(modes), _ops_rank, seed, None, expected, timeout=300, env={"PYCOLL_DEBUG": "INFO"},
              rank_env=[{"PYCOLL_CPU_PEER_READ": m} for m in modes])


def _first_plan(start):
    sys.stderr.flush()
    with open(os.environ["PYCOLL_TEST_LOG"], errors="replace") as f:
        f.seek(start)
        first = PLAN_LINE.search(f.read())
    return first.group(2) if first else None


def _auto_rank(rank, ws, seed, large_all_gather, large_reduce_scatter):
    quiet()
    cases = Cases("peer read auto", rank, ws, seed)
    plans = []
    for mib in (16, 64):  # all_gather output, at least that many bytes
        m = -(-(mib << 20) // (4 * ws))
        xs = [gen(torch.float32, "data", (m,), cases.seed(r)) for r in range(ws)]
        with cases.case(op="all_gather", mib=mib):
            start = os.path.getsize(os.environ["PYCOLL_TEST_LOG"])
            out = torch.empty(ws * m)
            dist.all_gather_into_tensor(out, xs[rank])
            cases.check("all_gather", out, torch.cat(xs))
            plans.append(("all_gather", mib, _first_plan(start)))
    # reduce_scatter input, below and above auto's size (over 3 ranks 8 MiB rounds down to 7.99)
    rs_small, rs_large = (8, 16) if ws == 2 else (4, 8)
    for mib in (rs_small, rs_large):
        m = (mib << 20) // 4 // ws
        ins = [gen(torch.float32, "SUM", (ws * m,), cases.seed(100 + r)) for r in range(ws)]
        with cases.case(op="reduce_scatter", mib=mib):
            start = os.path.getsize(os.environ["PYCOLL_TEST_LOG"])
            out = torch.empty(m)
            dist.reduce_scatter_tensor(out, ins[rank])
            _check_reduce_scatter(cases, "reduce_scatter", out, ins, rank, m, "SUM")
            plans.append(("reduce_scatter", mib, _first_plan(start)))
    expected = [("all_gather", 16, "pipelined"), ("all_gather", 64, large_all_gather),
                ("reduce_scatter", rs_small, "pipelined"), ("reduce_scatter", rs_large, large_reduce_scatter)]
    cases.expect(plans == expected, f"plans {plans}, expected {expected}")
    return cases.finish()


READ, STAGED = "read in place", "pipelined"


@pytest.mark.parametrize("threads,all_gather,reduce_scatter", [
    (("4", "4"), READ, READ),              # 2 ranks: a reduce_scatter from 16 MiB
    (("4", "2"), STAGED, STAGED),          # the fewest threads any rank offers decide
    (("3", "3"), STAGED, STAGED),          # 3 threads are enough over 4+ ranks only
    (("4", "4", "4"), READ, READ),        # 3+ ranks: a reduce_scatter from 6 MiB
    (("4", "4", "4", "4"), READ, READ),
    (("4", "3", "3", "3"), STAGED, READ),  # 4 ranks of 3 threads (the 16-CPU Xeon): reduce_scatter only
])
def test_peer_read_auto_only_for_large_ops_with_threads_to_spare(threads, all_gather, reduce_scatter, seed,
                                                                 needs_cross_memory_attach):
    """auto reads in place, when every rank has 4 threads, an all_gather of 64 MiB or more and a
    reduce_scatter of 16 MiB or more over 2 ranks, 6 MiB or more over 3+; over 4+ ranks a
    reduce_scatter needs only 3 threads."""
    run_ranks(len(threads), _auto_rank, seed, all_gather, reduce_scatter, timeout=300, env={"PYCOLL_DEBUG": "INFO"},
              rank_env=[{"PYCOLL_CPU_THREADS": t} for t in threads])


def _dies_rank(rank, ws, op):
    """The last rank exits while the others are inside (or about to start) ops that read it in place."""
    quiet()
    x = torch.ones((16 << 20) // 4)
    out = torch.empty(ws * x.numel())

    def run():
        if op == "all_gather":
            dist.all_gather_into_tensor(out, x)
        else:
            dist.reduce_scatter_tensor(x, out)

    run()
    if rank == ws - 1:
        # exit from another thread at a moment no op boundary decides, most often mid-op
        threading.Timer(0.05, os._exit, args=(17,)).start()
        while True:
            run()
    t0 = time.monotonic()
    try:
        while time.monotonic() - t0 < 30:
            run()
    except RuntimeError as e:
        took = time.monotonic() - t0
        assert took < 20, f"raised only after {took:.1f}s: {e}"
        assert re.search(r"rank \d exited|timed out|process_vm_readv", str(e)), str(e)
        return took
    raise AssertionError(f"a {op} reading a dead peer did not raise")


@pytest.mark.parametrize("op", ["all_gather", "reduce_scatter"])
@pytest.mark.parametrize("ws", [2, 3])
def test_peer_dying_during_peer_read_raises(ws, op, needs_cross_memory_attach):
    run_ranks(ws, _dies_rank, op, pg_timeout=datetime.timedelta(seconds=5), expect_exit={ws - 1: 17}, timeout=60,
              env={"PYCOLL_CPU_PEER_READ": "on"})
