"""Errors: bad arguments, ranks that disagree, peers that die, timeouts,
shared-memory hygiene, and zero-element tensors through every op.

Messages are checked on stable substrings only: the op name and the offending
argument.  Checks of pycoll's own wording are skipped (not the whole test)
under PYCOLL_TEST_BACKEND=gloo, where only the exception type is asserted.
"""

import datetime
import os
import re
import signal
import threading
import time

import pytest
import torch
import torch.distributed as dist

from ranks import IS_GLOO, run_ranks, shm_leftovers, shm_listing, shm_mapped

PG_TIMEOUT = datetime.timedelta(seconds=5)

# Names a dtype may go by in a message (torch's and c10's spellings).
DTYPE_ALIASES = {
    torch.float32: ("float32", "float"),
    torch.float64: ("float64", "double"),
    torch.float16: ("float16", "half"),
    torch.bfloat16: ("bfloat16",),
    torch.int32: ("int32", "int"),
    torch.int64: ("int64", "long"),
    torch.int8: ("int8", "char"),
    torch.uint8: ("uint8", "byte"),
    torch.bool: ("bool",),
}


def quiet():
    import warnings

    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", category=UserWarning)


def raises(fn, exc=(RuntimeError, ValueError), within=None):
    """Call fn, which must raise `exc` (within `within` seconds when given).
    Returns the exception's message."""
    t0 = time.monotonic()
    try:
        fn()
    except exc as e:
        took = time.monotonic() - t0
        if within is not None and took > within:
            raise AssertionError(f"raised only after {took:.1f}s (limit {within}s): {e}") from e
        return str(e)
    raise AssertionError(f"did not raise {exc} (returned after {time.monotonic() - t0:.1f}s)")


def mentions(msg, *patterns):
    """Every regex in `patterns` occurs in msg (case-insensitive)."""
    missing = [p for p in patterns if not re.search(p, msg, re.I)]
    assert not missing, f"error message lacks {missing}: {msg!r}"


def mentions_dtype(msg, dtype):
    aliases = DTYPE_ALIASES[dtype]
    assert any(re.search(rf"\b{a}\b", msg, re.I) for a in aliases), (
        f"error message does not name dtype {dtype} ({aliases}): {msg!r}")


def check_sum_works(ws, n=1031, dtype=torch.float32):
    """A correct all_reduce after an error: every rank still in step."""
    t = torch.full((n,), 1.0, dtype=dtype) * (dist.get_rank() + 1)
    dist.all_reduce(t)
    want = ws * (ws + 1) / 2
    assert torch.equal(t, torch.full((n,), want, dtype=dtype)), f"sum after error: {t[:4]}"


# --------------------------------------------------------------------------
# ranks that disagree


def _mismatch_rank(rank, ws, kind):
    quiet()
    check_sum_works(ws)
    check_sum_works(ws, n=7)
    if kind == "numel":
        t = torch.ones(1000 + rank)  # every rank a different count
    elif kind == "numel-one-rank":
        t = torch.ones(1000 + (rank == ws - 1))
    elif kind == "dtype-width":
        t = torch.ones(1000, dtype=torch.float32 if rank == 0 else torch.float64)
    elif kind == "dtype-same-width":  # same byte count: only the dtype check catches it
        t = torch.ones(1000, dtype=torch.float32 if rank == 0 else torch.int32)
    else:
        raise ValueError(kind)
    msg = raises(lambda: dist.all_reduce(t), RuntimeError, within=20)
    mentions(msg, r"all_?reduce")
    check_sum_works(ws)
    check_sum_works(ws, n=65537)


@pytest.mark.pycoll_only  # Gloo does not check; it corrupts or hangs
@pytest.mark.parametrize("kind", ["numel", "numel-one-rank", "dtype-width", "dtype-same-width"])
@pytest.mark.parametrize("world_size", [2, 3])
def test_mismatch_raises_on_every_rank(world_size, kind):
    run_ranks(world_size, _mismatch_rank, kind, timeout=90)


def _all_to_all_splits_rank(rank, ws):
    """Ranks whose all_to_all split tables disagree (rank 0 sends 2 floats to the last rank, which
    expects 3) raise on every rank, naming both sides; all_to_alls with good tables before and
    after (the tables alternate between two places by op parity) move the right data."""
    quiet()

    def good(k):
        inp = torch.arange(2 * ws, dtype=torch.float32) + 100 * rank + k
        out = torch.empty(2 * ws)
        dist.all_to_all_single(out, inp, [2] * ws, [2] * ws)
        want = torch.cat([torch.arange(2 * rank, 2 * rank + 2, dtype=torch.float32) + 100 * s + k for s in range(ws)])
        assert torch.equal(out, want), (k, out, want)

    good(0)
    out_splits = [3 if (rank == ws - 1 and s == 0) else 2 for s in range(ws)]
    out = torch.empty(sum(out_splits))
    msg = raises(lambda: dist.all_to_all_single(out, torch.ones(2 * ws), out_splits, [2] * ws), RuntimeError,
                 within=20)
    mentions(msg, "split size mismatch", rf"rank 0 sends 8 bytes to rank {ws - 1}", "expects 12 bytes from rank 0")
    good(1)
    good(2)
    check_sum_works(ws)


@pytest.mark.pycoll_only  # Gloo does not check split tables against each other
@pytest.mark.parametrize("world_size", [2, 3])
def test_all_to_all_split_tables_that_disagree_raise_on_every_rank(world_size):
    run_ranks(world_size, _all_to_all_splits_rank, timeout=90)


def _future_after_completion_rank(rank, ws):
    """An async op whose Future nobody asked for settles on the engine thread (one wake-up for
    wait()); a Future asked for afterwards must still carry the op's result or its error."""
    import threading

    quiet()
    t = torch.full((1031,), float(rank + 1))
    w = dist.all_reduce(t, async_op=True)
    w.wait()
    fut = w.get_future()
    assert fut.done()
    assert torch.equal(fut.value()[0], torch.full((1031,), float(ws * (ws + 1) // 2)))
    ran_on = []
    fut.then(lambda f: ran_on.append(threading.current_thread() is threading.main_thread())).wait()
    assert ran_on == [True]  # attached to a done Future: runs on the caller's thread
    bad = dist.all_reduce(torch.ones(1000 + rank), async_op=True)  # counts differ across ranks
    first = raises(bad.wait, RuntimeError, within=20)
    later = raises(lambda: bad.get_future().wait(), RuntimeError, within=5)
    mentions(first, r"all_?reduce")
    mentions(later, r"all_?reduce")
    check_sum_works(ws)


@pytest.mark.pycoll_only  # Gloo does not check mismatched counts
@pytest.mark.parametrize("world_size", [2, 3])
def test_future_asked_for_after_completion(world_size):
    run_ranks(world_size, _future_after_completion_rank, timeout=90)


def _mismatched_collective_rank(rank, ws):
    quiet()
    check_sum_works(ws)
    if rank == 0:
        msg = raises(lambda: dist.all_reduce(torch.ones(64)), RuntimeError, within=20)
    else:
        out, inp = torch.empty(64 * ws), torch.ones(64)  # same input bytes as rank 0
        msg = raises(lambda: dist.all_gather_into_tensor(out, inp), RuntimeError, within=20)
    # Both sides are named, whichever side reads the message.
    mentions(msg, r"all_?reduce", r"all_?gather")
    check_sum_works(ws)


@pytest.mark.pycoll_only
@pytest.mark.parametrize("world_size", [2, 3])
def test_different_collectives_raise(world_size):
    run_ranks(world_size, _mismatched_collective_rank, timeout=90)


# --------------------------------------------------------------------------
# bad arguments, rejected before any communication: only one rank makes the
# bad call, and the others must not notice (the next collective matches).


def _bad_op_rank(rank, ws):
    quiet()
    cases = []
    for i, (dtype, op) in enumerate(
        [(d, o) for d in (torch.float32, torch.float64, torch.float16, torch.bfloat16)
         for o in ("BAND", "BOR", "BXOR")]
    ):
        cases.append((i % ws, "all_reduce", dtype, op))
    cases.append((ws - 1, "reduce", torch.float32, "BAND"))
    cases.append((0, "reduce_scatter_tensor", torch.float32, "BXOR"))
    cases.append((0, "all_reduce_coalesced", torch.float32, "BOR"))
    for culprit, fn_name, dtype, op in cases:
        # Gloo checks the op only after taking a tag, so a lone bad call
        # would put that rank out of step: there every rank makes it.
        if rank == culprit or IS_GLOO:
            t = torch.ones(4 * ws, dtype=dtype)
            rop = getattr(dist.ReduceOp, op)
            call = {
                "all_reduce": lambda: dist.all_reduce(t, op=rop),
                "reduce": lambda: dist.reduce(t, dst=0, op=rop),
                "reduce_scatter_tensor": lambda: dist.reduce_scatter_tensor(
                    torch.empty(4, dtype=dtype), t, op=rop),
                "all_reduce_coalesced": lambda: dist.all_reduce_coalesced([t, t.clone()], op=rop),
            }[fn_name]
            msg = raises(call, (RuntimeError, ValueError), within=10)
            try:
                mentions(msg, op)
                if not IS_GLOO:
                    mentions_dtype(msg, dtype)
            except AssertionError as e:
                raise AssertionError(f"{fn_name}({dtype}, {op}): {e}") from None
        check_sum_works(ws, n=7)


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_bitwise_op_on_float_raises_before_communication(world_size):
    run_ranks(world_size, _bad_op_rank, timeout=90)


def _avg_int_rank(rank, ws, op):
    quiet()
    for i, dtype in enumerate([torch.int32, torch.int64, torch.int8, torch.uint8, torch.bool]):
        culprit = i % ws
        t = torch.ones(16, dtype=dtype)
        rop = dist._make_nccl_premul_sum(0.5) if op == "PREMUL_SUM" else dist.ReduceOp.AVG
        if IS_GLOO:
            # Gloo fails only after communicating (its result cast), so every
            # rank makes the call; its message is its own.
            raises(lambda: dist.all_reduce(t, op=rop), RuntimeError, within=20)
        elif rank == culprit:
            msg = raises(lambda: dist.all_reduce(t, op=rop), (RuntimeError, ValueError), within=10)
            mentions(msg, "premul" if op == "PREMUL_SUM" else "avg")
            mentions_dtype(msg, dtype)
        check_sum_works(ws, n=7)


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_avg_on_integers_raises(world_size):
    run_ranks(world_size, _avg_int_rank, "AVG", timeout=90)


@pytest.mark.pycoll_only  # Gloo rejects PREMUL_SUM for every dtype
@pytest.mark.parametrize("world_size", [1, 2])
def test_premul_sum_on_integers_raises(world_size):
    run_ranks(world_size, _avg_int_rank, "PREMUL_SUM", timeout=90)


def _out_of_range_rank(rank, ws):
    quiet()
    backend = dist.distributed_c10d._get_default_group()._get_backend(torch.device("cpu"))
    t = torch.ones(8)
    calls = [
        ("send", lambda bad: dist.send(t, dst=bad)),
        ("send", lambda bad: dist.isend(t, dst=bad).wait()),
        ("recv", lambda bad: dist.recv(t, src=bad)),
        ("recv", lambda bad: dist.irecv(t, src=bad).wait()),
        ("broadcast", lambda bad: dist.broadcast(t, src=bad)),
        ("reduce", lambda bad: dist.reduce(t, dst=bad)),
        # Straight into the backend, below torch's Python checks.
        ("send", lambda bad: backend.send([t], bad, 0).wait()),
        ("recv", lambda bad: backend.recv([t], bad, 0).wait()),
        ("broadcast", lambda bad: backend.broadcast([t], _bcast_opts(bad)).wait()),
    ]
    for i, (op, call) in enumerate(calls):
        for bad in (ws, ws + 5, -1):
            if bad == -1 and i < 6:
                continue  # torch's Python layer gives -1 its own meaning
            if rank == i % ws:
                msg = raises(lambda: call(bad), (RuntimeError, ValueError), within=10)
                try:
                    mentions(msg, op)
                except AssertionError as e:
                    raise AssertionError(f"call {i} ({op}) with rank {bad}: {e}") from None
            check_sum_works(ws, n=7)


def _bcast_opts(root):
    o = dist.BroadcastOptions()
    o.rootRank = root
    o.rootTensor = 0
    return o


@pytest.mark.pycoll_only  # Gloo does not check ranks: it waits for the timeout
@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_rank_out_of_range_raises(world_size):
    run_ranks(world_size, _out_of_range_rank, timeout=120)


def _set_algo_rank(rank, ws):
    import pycollectives

    pycollectives.set_algo("ring")
    raises(lambda: pycollectives.set_algo("bogus"), (ValueError, RuntimeError))
    assert pycollectives.get_algo() == "ring", pycollectives.get_algo()
    check_sum_works(ws)


@pytest.mark.pycoll_only
def test_set_algo_rejects_unknown_name():
    run_ranks(2, _set_algo_rank)


# --------------------------------------------------------------------------
# peers that go away


def _peer_exit_rank(rank, ws, when):
    quiet()
    leaver = ws - 1
    if when == "after_first_op":
        check_sum_works(ws)
        check_sum_works(ws, n=1 << 20)
    if rank == leaver:
        os._exit(17)
    t0 = time.monotonic()
    try:
        for _ in range(3):  # the first may already fail; must not hang
            dist.all_reduce(torch.ones(1031))
    except RuntimeError as e:
        took = time.monotonic() - t0
        assert took < 20, f"raised only after {took:.1f}s: {e}"
        return took
    raise AssertionError("all_reduce with a dead peer did not raise")


@pytest.mark.parametrize("when", ["after_init", "after_first_op"])
@pytest.mark.parametrize("world_size", [2, 3])
def test_peer_exit_makes_others_raise(world_size, when):
    t0 = time.monotonic()
    run_ranks(world_size, _peer_exit_rank, when, pg_timeout=PG_TIMEOUT,
              expect_exit={world_size - 1: 17}, timeout=60)
    assert time.monotonic() - t0 < 45


def _wait_for_file(path, timeout_s=60):
    """Until rank 0 creates `path` (its signal that it is done)."""
    deadline = time.monotonic() + timeout_s
    while not os.path.exists(path):
        assert time.monotonic() < deadline, "rank 0 never finished"
        time.sleep(0.01)


def _wait_timeout_rank(rank, ws, what, done_path):
    quiet()
    check_sum_works(ws)
    if rank == 0:
        if what == "all_reduce":
            work = dist.all_reduce(torch.ones(1031), async_op=True)
        else:
            work = dist.irecv(torch.empty(1031), src=1, tag=5)
        t0 = time.monotonic()
        raises(lambda: work.wait(timeout=datetime.timedelta(milliseconds=500)), RuntimeError)
        took = time.monotonic() - t0
        open(done_path, "w").close()
        assert 0.45 <= took < 10, f"wait(timeout=500ms) raised after {took:.2f}s"
    else:
        # Stay alive (so that only the timeout can end rank 0's wait) without joining rank 0's
        # operation; not through the group's Store, as in _abort_pending_rank.
        _wait_for_file(done_path)


@pytest.mark.parametrize("what", ["all_reduce", "irecv"])
def test_work_wait_timeout(what, tmp_path):
    # Not destroyed: rank 0 still has an operation in flight.
    run_ranks(2, _wait_timeout_rank, what, str(tmp_path / "done"), pg_timeout=datetime.timedelta(seconds=60),
              destroy=False, timeout=60)


# --------------------------------------------------------------------------
# /dev/shm hygiene (pycoll names its segments /dev/shm/pycoll-<token>-...)


def _busy(ws, rounds=2):
    for _ in range(rounds):
        for n in (7, 1031, 65537, 1 << 21):
            check_sum_works(ws, n=n)
        out = torch.empty(ws * 4099)
        dist.all_gather_into_tensor(out, torch.ones(4099))
        dist.broadcast(torch.ones(1 << 20), src=ws - 1)
        if ws > 1:
            dist.all_to_all_single(torch.empty(ws * 1000), torch.ones(ws * 1000))
    dist.barrier()


def _shm_normal_rank(rank, ws, exit_kind):
    quiet()
    _busy(ws)
    # Segments are unlinked as soon as every peer has mapped them, so none
    # this rank maps is still linked while the job runs.
    mapped = shm_mapped()
    dist.barrier()
    linked = sorted(p for p, still_linked in mapped.items() if still_linked)
    assert not linked, f"segments still linked in /dev/shm while the job runs: {linked}"
    if ws > 1:
        assert mapped, "no /dev/shm/pycoll segment mapped: is the shm transport in use?"
    if exit_kind == "no-destroy":
        os._exit(0)


def _p2p_then_destroy_rank(rank, ws):
    """Point-to-point whose tensors Python drops at once, then destroy_process_group (by
    run_ranks) while the p2p lane threads still hold on to their last requests
    (the test hook _C._set_test_thread_linger_ms). Teardown joins those threads: if one of them then released the
    last reference to a tensor Python had seen (that takes the GIL) while the joining thread held
    the GIL, the rank would hang here (seen once in CI, test_batch_isend_irecv[4])."""
    quiet()
    from pycollectives import _C

    _C._set_test_thread_linger_ms(300)  # stays set for the teardown by run_ranks
    peer = 1 - rank
    for i in range(3):
        if rank == 0:
            dist.send(torch.full((1000,), float(i)), peer)  # the temporary's only Python reference ends here
            got = torch.empty(1000)
            dist.recv(got, peer)
        else:
            got = torch.empty(1000)
            dist.recv(got, peer)
            dist.send(got.clone() + 1, peer)
        assert torch.all(got == i + (1 - rank)), (i, got[:3])
        del got
    return True


@pytest.mark.pycoll_only
def test_destroy_while_p2p_threads_finish():
    t0 = time.monotonic()
    assert run_ranks(2, _p2p_then_destroy_rank, timeout=60) == [True] * 2
    assert time.monotonic() - t0 < 50


@pytest.mark.pycoll_only
@pytest.mark.parametrize("exit_kind", ["destroy", "no-destroy"])
@pytest.mark.parametrize("world_size", [2, 4])
def test_no_shm_left_after_normal_exit(world_size, exit_kind):
    before = shm_listing()
    run_ranks(world_size, _shm_normal_rank, exit_kind,
              expect_exit={r: 0 for r in range(world_size)} if exit_kind == "no-destroy" else None)
    left = shm_leftovers(before)
    assert not left, f"/dev/shm entries left behind: {left}"


def _shm_kill_rank(rank, ws, when):
    quiet()
    victim = ws - 1
    _busy(ws, rounds=1)
    if rank == victim:
        if when == "between_ops":
            os.kill(os.getpid(), signal.SIGKILL)
        threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGKILL)).start()
    big = torch.ones(1 << 21)
    t0 = time.monotonic()
    try:
        for _ in range(100000):
            dist.all_reduce(big)
            if rank != victim and time.monotonic() - t0 > 30:
                break
    except RuntimeError as e:
        if rank == victim:
            raise
        took = time.monotonic() - t0
        assert took < 25, f"raised only after {took:.1f}s: {e}"
        return took
    raise AssertionError("all_reduce kept working with a SIGKILLed peer")


@pytest.mark.pycoll_only
@pytest.mark.parametrize("when", ["between_ops", "during_op"])
@pytest.mark.parametrize("world_size", [2, 3])
def test_no_shm_left_after_sigkill(world_size, when):
    before = shm_listing()
    run_ranks(world_size, _shm_kill_rank, when, pg_timeout=PG_TIMEOUT,
              expect_exit={world_size - 1: -signal.SIGKILL}, timeout=90)
    left = shm_leftovers(before)
    assert not left, f"/dev/shm entries left behind after SIGKILL: {left}"


# --------------------------------------------------------------------------
# zero elements through every op


def _zero_rank(rank, ws):
    quiet()
    z = torch.empty(0)
    zs = [torch.empty(0) for _ in range(ws)]
    ops = [
        ("all_reduce SUM", lambda: dist.all_reduce(z)),
        ("all_reduce MAX", lambda: dist.all_reduce(torch.empty(0, dtype=torch.int8),
                                                   op=dist.ReduceOp.MAX)),
        ("all_reduce async", lambda: dist.all_reduce(z, async_op=True).wait()),
        ("reduce", lambda: dist.reduce(z, dst=ws - 1)),
        ("broadcast", lambda: dist.broadcast(z, src=ws - 1)),
        ("all_gather", lambda: dist.all_gather(zs, z)),
        ("all_gather_into_tensor", lambda: dist.all_gather_into_tensor(torch.empty(0), z)),
        ("reduce_scatter", lambda: dist.reduce_scatter(z, [torch.empty(0) for _ in range(ws)])),
        ("reduce_scatter_tensor", lambda: dist.reduce_scatter_tensor(z, torch.empty(0))),
        ("all_to_all", lambda: dist.all_to_all([torch.empty(0) for _ in range(ws)],
                                               [torch.empty(0) for _ in range(ws)])),
        ("all_to_all_single", lambda: dist.all_to_all_single(torch.empty(0), torch.empty(0))),
        ("all_to_all_single zero splits", lambda: dist.all_to_all_single(
            torch.empty(0), torch.empty(0), [0] * ws, [0] * ws)),
        ("gather", lambda: dist.gather(z, zs if rank == 0 else None, dst=0)),
        ("scatter", lambda: dist.scatter(z, zs if rank == 0 else None, src=0)),
        ("all_reduce_coalesced", lambda: dist.all_reduce_coalesced([z, torch.empty(0)])),
        ("barrier", lambda: dist.barrier()),
    ]
    if ws > 1:
        nxt, prv = (rank + 1) % ws, (rank - 1) % ws

        def p2p():
            w = dist.isend(torch.empty(0), dst=nxt)
            dist.recv(torch.empty(0), src=prv)
            w.wait()
            r = dist.irecv(torch.empty(0), src=prv, tag=3)
            dist.send(torch.empty(0), dst=nxt, tag=3)
            r.wait()

        def batch():
            for req in dist.batch_isend_irecv([dist.P2POp(dist.isend, torch.empty(0), nxt),
                                               dist.P2POp(dist.irecv, torch.empty(0), prv)]):
                req.wait()

        ops += [("send/recv/isend/irecv", p2p), ("batch_isend_irecv", batch)]
    if not IS_GLOO:  # Gloo has no coalesced all_gather / reduce_scatter
        def coalesced():
            with dist._coalescing_manager():
                dist.all_gather_into_tensor(torch.empty(0), torch.empty(0))
                dist.all_gather_into_tensor(torch.empty(0), torch.empty(0))
            with dist._coalescing_manager():
                dist.all_reduce(torch.empty(0))
                dist.all_reduce(torch.empty(0))

        ops.append(("coalescing manager", coalesced))
    for what, call in ops:
        try:
            call()
            check_sum_works(ws, n=5)  # still in step, and results still right
        except Exception as e:
            raise AssertionError(f"zero-element {what}: {type(e).__name__}: {e}") from e
    assert z.shape == (0,)


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_zero_elements_every_op(world_size):
    run_ranks(world_size, _zero_rank)


# --------------------------------------------------------------------------
# ProcessGroup.abort() from another thread


def _abort_pending_rank(rank, ws, done_path):
    quiet()
    if rank == 0:
        work = dist.all_reduce(torch.ones(1 << 16), async_op=True)  # rank 1 never joins
        timer = threading.Timer(0.5, dist.group.WORLD.abort)
        t0 = time.monotonic()
        timer.start()
        try:
            work.wait()
        except RuntimeError:
            took = time.monotonic() - t0
        else:
            raise AssertionError("wait() returned on an all_reduce the peer never joined")
        timer.join()
        assert 0.4 <= took < 5, f"wait() raised {took:.2f}s after the op; abort() came at 0.5s"
        open(done_path, "w").close()
        return took
    # Rank 1 stays (a peer that exits is noticed as dead, not aborted) until rank 0 is done. Not
    # through the group's Store: after the abort, both ranks' dump threads use it too, and a
    # FileStore shared by threads and processes once did not show rank 1 this key within 60 s in CI.
    _wait_for_file(done_path)
    return None


@pytest.mark.pycoll_only
def test_abort_unblocks_pending_collective(tmp_path):
    run_ranks(2, _abort_pending_rank, str(tmp_path / "done"), pg_timeout=datetime.timedelta(seconds=60),
              destroy=False, timeout=60)
