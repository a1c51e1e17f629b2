"""dist.monitored_barrier on pycoll: Gloo's debugging barrier (backend/monitored_barrier.cpp).

Rank 0 names the first rank that did not arrive within the timeout (or, with wait_all_ranks, every
one), in Gloo's words, which torch's own tests and people's log searches match; the ranks that did
arrive learn of the failure from rank 0 instead of waiting out their own timeout. It runs on the
Store, so the group's collectives still work afterwards.
"""
import datetime
import time

import pytest
import torch
import torch.distributed as dist

from ranks import run_ranks

pytestmark = pytest.mark.pycoll_only

TIMEOUT = datetime.timedelta(milliseconds=800)


def _monitored_barrier(timeout, wait_all_ranks=False):
    # The group's own method: torch 2.11's dist.monitored_barrier accepts only a group named "gloo"
    # (torch 2.14's any group with a CPU backend; test_dist_function_on_torch_that_allows_it).
    dist.group.WORLD.monitored_barrier(timeout, wait_all_ranks=wait_all_ranks)


def _outcome(fn):
    t0 = time.monotonic()
    try:
        fn()
        return "passed", time.monotonic() - t0
    except RuntimeError as e:
        return str(e), time.monotonic() - t0


def _all_arrive_rank(rank, ws):
    for _ in range(3):  # repeated: each barrier has its own Store keys
        _monitored_barrier(TIMEOUT)
        _monitored_barrier(TIMEOUT, wait_all_ranks=True)
    return True


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_passes_when_every_rank_arrives(world_size):
    assert run_ranks(world_size, _all_arrive_rank, timeout=60) == [True] * world_size


def _absent_rank(rank, ws, absent, wait_all):
    got = ("absent", 0.0)
    if rank not in absent:
        got = _outcome(lambda: _monitored_barrier(TIMEOUT, wait_all))
    # The barrier ran on the Store: the engine is untouched, every rank still all-reduces.
    t = torch.ones(5)
    dist.all_reduce(t)
    assert torch.equal(t, torch.full((5,), float(ws)))
    return got


@pytest.mark.parametrize("world_size", [3, 4])
def test_rank_0_names_the_first_rank_that_did_not_arrive(world_size):
    absent = [2] if world_size == 3 else [2, 3]
    out = run_ranks(world_size, _absent_rank, absent, False, timeout=60)
    msg, took = out[0]
    assert "Rank 2 failed to pass monitoredBarrier in 800 ms" in msg, msg
    assert took < 0.8 + 2.0, took
    # Rank 1 arrived: it hears of the failure from rank 0 (not after its own timeout).
    msg1, took1 = out[1]
    assert msg1.startswith("Rank 1 successfully reached monitoredBarrier, but received errors while waiting "
                           "for send/recv from rank 0"), msg1
    assert "Rank 2 failed" in msg1, msg1


def test_wait_all_ranks_names_every_rank_that_did_not_arrive():
    out = run_ranks(4, _absent_rank, [1, 3], True, timeout=60)
    assert "Ranks 1, 3 failed to pass monitoredBarrier in 800 ms" in out[0][0], out[0]
    assert "successfully reached monitoredBarrier" in out[2][0], out[2]


def _zero_timeout_rank(rank, ws):
    if rank == 0:
        return _outcome(lambda: _monitored_barrier(datetime.timedelta(0)))[0]
    return None


def test_zero_timeout_on_rank_0():
    msg = run_ranks(2, _zero_timeout_rank, timeout=60)[0]
    assert msg.startswith("Rank 0 timed out in monitoredBarrier after 0 ms; rank 1 had not arrived"), msg


def _dist_function_rank(rank, ws):
    try:
        dist.monitored_barrier(timeout=TIMEOUT, wait_all_ranks=True)
    except ValueError as e:  # torch's own check, before pycoll is called
        return str(e)
    return "passed"


def test_dist_function_on_torch_that_allows_it():
    out = run_ranks(2, _dist_function_rank, timeout=60)
    if out[0] == "monitored_barrier is only implemented for GLOO backend.":
        pytest.skip("this torch's dist.monitored_barrier takes only a group named gloo (torch 2.11)")
    assert out == ["passed", "passed"], out
