"""Teardown from any thread, and Futures completed by the time wait() returns.

A backend object can be destroyed on one of its own threads: the thread drops the last reference to
something that keeps the group alive. Here that something is a tensor whose storage is a Python
bytearray carrying the group as an attribute (torch.frombuffer keeps the buffer alive), so the
group dies exactly when the backend thread lets go of the tensor. Before the fix, the destructor
joined the thread it ran on: std::system_error "Resource deadlock avoided", SIGABRT (seen in CI as
test_ddp[hook_powersgd-cpu], rank 0 killed while reporting its result).

The group is built directly (not through init_process_group), so that no registry keeps it alive.
"""

import datetime
import gc
import time
import weakref

import pytest
import torch
import torch.distributed as dist

from ranks import run_ranks

pytestmark = pytest.mark.pycoll_only


class _GroupCarrier(bytearray):
    """Memory for a tensor that also keeps a process group alive."""


def _private_group(rank, ws, name):
    import pycollectives  # noqa: F401  (the extension)
    from pycollectives import _C

    store = dist.PrefixStore(f"teardown/{name}/", dist.distributed_c10d._get_default_store())
    return _C.ProcessGroupPycoll(store, rank, ws, datetime.timedelta(seconds=60), name)


def _tensor_owning(pg, n):
    """A float32 tensor of n elements whose storage is the only owner of `pg` (besides the caller)."""
    carrier = _GroupCarrier(4 * n)
    carrier.group = pg
    t = torch.frombuffer(carrier, dtype=torch.float32)
    return t, weakref.ref(carrier)


def _await_release(ref, what, limit=20.0):
    t0 = time.monotonic()
    while ref() is not None:
        gc.collect()
        assert time.monotonic() - t0 < limit, f"{what}: the group was never released"
        time.sleep(0.02)


def _teardown_on_backend_thread_rank(rank, ws, path):
    from pycollectives import _C

    # The backend thread keeps each finished task this long: time for this thread to drop
    # everything else, so that the backend thread drops the last reference to the group.
    _C._set_test_thread_linger_ms(300)
    try:
        pg = _private_group(rank, ws, path)
        t, carrier = _tensor_owning(pg, 1031)
        t.fill_(rank + 1)
        if path == "executor":
            opts = dist.AllreduceOptions()
            opts.asyncOp = True  # runs on the engine thread, not inline on this one
            work = pg.allreduce([t], opts)
        elif rank == 0:
            work = pg.send([t], 1, 7)  # a point-to-point lane thread
        else:
            work = pg.recv([t], 0, 7)
        work.wait()
        expected = ws * (ws + 1) / 2 if path == "executor" else 1.0
        assert torch.all(t == expected), t[:4]
        del t, work, pg
        _await_release(carrier, path)
        # The engine thread tore the group down and ended: the process lives on, and groups work.
        time.sleep(0.4)
        x = torch.full((5,), float(rank))
        dist.all_reduce(x)
        assert torch.all(x == ws * (ws - 1) / 2)
    finally:
        _C._set_test_thread_linger_ms(0)
    return True


@pytest.mark.parametrize("path", ["executor", "p2p"])
def test_group_destroyed_on_its_own_thread(path):
    assert run_ranks(2, _teardown_on_backend_thread_rank, path, timeout=90) == [True, True]


def _last_reference_in_callback_rank(rank, ws):
    pg = _private_group(rank, ws, "callback")
    holder = [pg]
    del pg
    t = torch.ones(64)
    opts = dist.AllreduceOptions()
    opts.asyncOp = True
    work = holder[0].allreduce([t], opts)
    ref_box = []

    def drop_group(fut):
        holder.clear()  # the last reference to the group goes inside the callback
        return fut.value()

    chained = work.get_future().then(drop_group)
    work.wait()
    got = chained.wait()
    assert not holder
    assert torch.all(got[0] == ws), got
    del work, chained, got, ref_box
    x = torch.ones(3)
    dist.all_reduce(x)
    assert torch.all(x == ws)
    return True


def test_last_reference_dropped_in_future_callback():
    assert run_ranks(2, _last_reference_in_callback_rank, timeout=90) == [True, True]


def _future_done_after_wait_rank(rank, ws, rounds):
    late = []
    for i in range(rounds):
        t = torch.full((257,), float(rank))
        work = dist.all_reduce(t, async_op=True)
        work.wait()
        if not work.get_future().done():
            late.append(("all_reduce", i))
        peer = (rank + 1) % ws
        src = (rank - 1) % ws
        got = torch.empty(17)
        works = [dist.isend(torch.full((17,), float(i)), peer), dist.irecv(got, src)]
        for w in works:
            w.wait()
            if not w.get_future().done():
                late.append(("p2p", i))
        assert torch.all(got == i)
    assert torch.all(t == ws * (ws - 1) / 2)
    return late


@pytest.mark.parametrize("world_size", [2, 3])
def test_future_done_when_wait_returns(world_size):
    """Gloo and NCCL complete the Future before wait() returns; code calling fut.value() next relies on it."""
    results = run_ranks(world_size, _future_done_after_wait_rank, 300, timeout=120)
    assert results == [[]] * world_size, results


def _thread_count():
    import os
    return len(os.listdir("/proc/self/task"))


def _pool_grows_then_shrinks_rank(rank, ws, n_blocked):
    import threading

    if rank != 0:
        time.sleep(0.3)  # rank 0 asks for its Future before the op can complete
    # A Future asked for before its op completes is completed on the pool: that starts the base threads.
    dist.all_reduce(torch.ones(4), async_op=True).get_future().wait()
    time.sleep(0.5)
    base = _thread_count()
    if rank != 0:
        # Joins late, so that rank 0's callbacks are attached before its ops can complete (a
        # callback attached to a done Future runs inline, on the caller's thread).
        time.sleep(0.5)
        for _ in range(n_blocked):
            dist.all_reduce(torch.ones(4))
        return None
    release = threading.Event()
    entered = []

    def blocking_callback(fut):
        entered.append(threading.current_thread() is not threading.main_thread())
        release.wait(30)  # a callback that waits, as PowerSGD's waits on its next collective
        return fut.value()

    futs = [dist.all_reduce(torch.ones(4), async_op=True).get_future().then(blocking_callback)
            for _ in range(n_blocked)]
    deadline = time.monotonic() + 30
    while len(entered) < n_blocked and time.monotonic() < deadline:
        time.sleep(0.01)
    during = _thread_count()  # every callback blocked at once: the pool had to grow
    release.set()
    for f in futs:
        f.wait()
    time.sleep(1.0)  # the extra threads end after 200 ms idle
    return entered, base, during, _thread_count()


def test_completion_pool_threads_started_for_a_burst_end_when_idle():
    """Callbacks that block make the completion pool start threads (never every thread busy while work
    waits); once idle, the threads beyond the pool's base end, so that a burst does not leave a
    long-running job with more threads for good (the soak's thread criterion)."""
    n = 8
    entered, base, during, after = run_ranks(2, _pool_grows_then_shrinks_rank, n, timeout=90)[0]
    assert entered == [True] * n  # all 8 blocked at once, each on a pool thread
    assert during >= base + n - 4, (base, during, after)
    assert after <= base, (base, during, after)
