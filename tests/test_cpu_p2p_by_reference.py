"""Point-to-point by reference: a CPU send larger than the channel whose tensor lives in a shared
file (share_memory_(), or the shared CPU allocator) reaches the receiver as the file's name, and the
receiver copies it straight out of the sender's file (csrc/cpu/p2p.h).

Every case checks the received bytes against the sent ones, that the sent tensor is unchanged, and
how many messages came by reference (a count the receiver keeps, `_C._test_p2p_by_reference`): all
the large shared ones, none of the private, small or refused ones. The channel is set to 64 KiB
so that messages of a few hundred KiB are "larger than the channel".
"""
import datetime
import os

import pytest
import torch
import torch.distributed as dist

from cpu_collectives_util import Cases, elems, no_cpu_to_spare, rank_log
from ranks import quiet, run_ranks
from reference import DTYPES, filler, gen

pytestmark = pytest.mark.pycoll_only

CHANNEL = 64 << 10
ENV = {"PYCOLL_P2P_CHANNEL_BYTES": str(CHANNEL), "PYCOLL_DEBUG": "INFO"}
SENDER_REFUSED = "cannot map this rank's shared-memory tensors"
RECEIVER_REFUSED = "point-to-point messages from it go through the channel"


def _by_reference():
    from pycollectives import _C

    return _C._test_p2p_by_reference()


def _ring_rank(rank, ws, seed):
    """Every rank sends to the next round a ring and receives from the previous: every dtype, the
    receiver's tensor private, shared or strided; sizes just above the channel and odd ones."""
    quiet()
    no_cpu_to_spare(ws)
    cases = Cases("p2p by reference, ring", rank, ws, seed)
    nxt, prv = (rank + 1) % ws, (rank - 1) % ws
    for dtype in DTYPES:
        for nbytes in (CHANNEL + 8, 5 * CHANNEL + 24):
            n = elems(dtype, nbytes) + 3
            for into in ("private", "shared", "strided"):
                with cases.case(dtype=dtype, n=n, into=into):
                    mine = gen(dtype, "data", (n,), cases.keyed_seed(rank))
                    theirs = gen(dtype, "data", (n,), cases.keyed_seed(prv))
                    src = mine.clone().share_memory_()
                    if into == "strided":
                        base = filler(dtype, (2 * n,))
                        dst = base[::2]
                    else:
                        dst = filler(dtype, (n,))
                        if into == "shared":
                            dst.share_memory_()
                    before = _by_reference()
                    w = dist.isend(src, dst=nxt, tag=5)
                    dist.recv(dst, src=prv, tag=5)
                    w.wait()
                    cases.check("received", dst, theirs)
                    cases.check("sent tensor unchanged", src, mine)
                    if into == "strided":
                        cases.check("between the strided elements", base[1::2], filler(dtype, (2 * n,))[1::2])
                    got = _by_reference() - before
                    cases.expect(got == 1, f"{got} messages by reference, expected 1")
    # The send completes only once the receiver has copied: writing the tensor after wait() does
    # not reach the receiver.
    with cases.case(kind="sender writes after wait"):
        n = elems(torch.float32, 3 * CHANNEL)
        mine = gen(torch.float32, "data", (n,), cases.keyed_seed(rank))
        theirs = gen(torch.float32, "data", (n,), cases.keyed_seed(prv))
        src = mine.clone().share_memory_()
        got = filler(torch.float32, (n,))
        r = dist.irecv(got, src=prv, tag=6)
        dist.send(src, dst=nxt, tag=6)
        src.fill_(-1.0)
        r.wait()
        dist.barrier()
        cases.check("received the bytes as they were at the send", got, theirs)
    # A view inside a larger shared tensor: the message starts at its offset in the file.
    with cases.case(kind="view at an offset"):
        n = elems(torch.float32, 2 * CHANNEL) + 1
        base = gen(torch.float32, "data", (3 * n,), cases.keyed_seed(rank)).share_memory_()
        theirs = gen(torch.float32, "data", (3 * n,), cases.keyed_seed(prv))[n + 5:2 * n + 5]
        got = filler(torch.float32, (n,))
        before = _by_reference()
        w = dist.isend(base[n + 5:2 * n + 5], dst=nxt, tag=8)
        dist.recv(got, src=prv, tag=8)
        w.wait()
        cases.check("received", got, theirs)
        cases.expect(_by_reference() - before == 1, "the view did not come by reference")
    # A receive of the wrong size fails; the next message by reference still arrives (the two
    # ranks' counts of such messages stay in step).
    with cases.case(kind="size mismatch, then a good message"):
        n = elems(torch.float32, 2 * CHANNEL)
        first = gen(torch.float32, "data", (n,), cases.keyed_seed(rank, 1)).share_memory_()
        second = gen(torch.float32, "data", (n,), cases.keyed_seed(rank, 2)).share_memory_()
        works = [dist.isend(first, dst=nxt, tag=9), dist.isend(second, dst=nxt, tag=10)]
        try:
            dist.recv(filler(torch.float32, (n - 1,)), src=prv, tag=9)
            cases.fail("a receive of the wrong size", "did not raise")
        except RuntimeError as e:
            cases.expect("expects" in str(e), f"the error does not name the sizes: {e}")
        got = filler(torch.float32, (n,))
        dist.recv(got, src=prv, tag=10)
        for w in works:
            w.wait()
        cases.check("received after the mismatch", got, gen(torch.float32, "data", (n,), cases.keyed_seed(prv, 2)))
    # Private, small (fits the channel) and empty shared messages stream as before.
    for kind, n, share in (("private", elems(torch.float32, 3 * CHANNEL), False),
                           ("small", elems(torch.float32, CHANNEL // 2), True), ("empty", 0, True)):
        with cases.case(kind=kind):
            mine = gen(torch.float32, "data", (n,), cases.keyed_seed(rank))
            src = mine.clone().share_memory_() if share else mine.clone()
            got = filler(torch.float32, (n,))
            before = _by_reference()
            w = dist.isend(src, dst=nxt, tag=7)
            dist.recv(got, src=prv, tag=7)
            w.wait()
            cases.check("received", got, gen(torch.float32, "data", (n,), cases.keyed_seed(prv)))
            cases.expect(_by_reference() == before, f"a {kind} message came by reference")
    dist.barrier()
    return cases.finish()


@pytest.mark.parametrize("ws", [2, 3, 4])
def test_ring_by_reference(ws, seed):
    run_ranks(ws, _ring_rank, seed, timeout=300, env=ENV)


def _order_rank(rank, ws, seed):
    """Rank 0 sends three large shared messages with tags 1, 2, 3 to rank 1, which receives them as
    3, 1, 2: the ones it does not want yet are copied out of the file into a buffer (the sender is
    waiting on them); then the same from any source."""
    quiet()
    no_cpu_to_spare(ws)
    cases = Cases("p2p by reference, tag order", rank, ws, seed)
    n = elems(torch.float32, 4 * CHANNEL) + 1
    msgs = {tag: gen(torch.float32, "data", (n,), cases.keyed_seed(tag)) for tag in (1, 2, 3)}
    for any_source in (False, True):
        with cases.case(any_source=any_source):
            if rank == 0:
                srcs = {tag: m.clone().share_memory_() for tag, m in msgs.items()}
                works = [dist.isend(srcs[tag], dst=1, tag=tag) for tag in (1, 2, 3)]
                for w in works:
                    w.wait()
                for tag, m in msgs.items():
                    cases.check(f"sent tensor {tag} unchanged", srcs[tag], m)
            elif rank == 1:
                before = _by_reference()
                for tag in (3, 1, 2):
                    got = filler(torch.float32, (n,))
                    w = dist.irecv(got, src=None if any_source else 0, tag=tag)
                    w.wait()
                    cases.check(f"message {tag}", got, msgs[tag])
                    if any_source:
                        cases.expect(w._source_rank() == 0, f"source {w._source_rank()}, expected 0")
                got = _by_reference() - before
                cases.expect(got == 3, f"{got} messages by reference, expected 3")
            dist.barrier()
    return cases.finish()


def test_out_of_order_tags_by_reference(seed):
    run_ranks(2, _order_rank, seed, timeout=300, env=ENV)


def _any_source_rank(rank, ws, seed):
    """Ranks 1..n-1 each send rank 0 a large shared message with the same tag; rank 0 receives
    them from any source: one lane claims each receive, the others buffer what they read."""
    quiet()
    no_cpu_to_spare(ws)
    cases = Cases("p2p by reference, any source", rank, ws, seed)
    n = elems(torch.float32, 3 * CHANNEL) + 7
    msgs = {r: gen(torch.float32, "data", (n,), cases.keyed_seed(r)) for r in range(1, ws)}
    with cases.case():
        if rank == 0:
            before = _by_reference()
            seen = {}
            for _ in range(ws - 1):
                got = filler(torch.float32, (n,))
                w = dist.irecv(got, tag=11)
                w.wait()
                seen[w._source_rank()] = got
            cases.expect(sorted(seen) == list(range(1, ws)), f"sources {sorted(seen)}")
            for r, got in seen.items():
                cases.check(f"from rank {r}", got, msgs[r])
            got_refs = _by_reference() - before
            cases.expect(got_refs == ws - 1, f"{got_refs} messages by reference, expected {ws - 1}")
        else:
            src = msgs[rank].clone().share_memory_()
            dist.send(src, dst=0, tag=11)
            cases.check("sent tensor unchanged", src, msgs[rank])
    dist.barrier()
    return cases.finish()


@pytest.mark.parametrize("ws", [3, 4])
def test_any_source_by_reference(ws, seed):
    run_ranks(ws, _any_source_rank, seed, timeout=300, env=ENV)


def _refused_rank(rank, ws, seed, how):
    """Rank 1 cannot map rank 0's files (how: "denied", its opens fail as where the OS forbids them;
    "off", its PYCOLL_CPU_SHARED_TENSORS is off): the first message falls back to the channel, and
    every later one streams; both ranks say so once in the debug log (the sender only when refused)."""
    quiet()
    no_cpu_to_spare(ws)
    from pycollectives import _C

    if rank == 1 and how == "denied":
        _C._set_test_deny_shared_open(True)
    cases = Cases("p2p by reference, refused", rank, ws, seed)
    n = elems(torch.float32, 3 * CHANNEL) + 5
    for i in range(3):
        with cases.case(message=i):
            m = gen(torch.float32, "data", (n,), cases.keyed_seed(i))
            if rank == 0:
                src = m.clone().share_memory_()
                dist.send(src, dst=1)
                cases.check("sent tensor unchanged", src, m)
            else:
                got = filler(torch.float32, (n,))
                before = _by_reference()
                dist.recv(got, src=0)
                cases.check("received", got, m)
                cases.expect(_by_reference() == before, "a refused message came by reference")
    dist.barrier()
    log = rank_log()
    if rank == 0:
        cases.expect(log.count(SENDER_REFUSED) == 1, f"{log.count(SENDER_REFUSED)} lines say rank 1 cannot map, expected 1")
    elif how == "denied":
        cases.expect(log.count(RECEIVER_REFUSED) == 1, f"{log.count(RECEIVER_REFUSED)} lines say so, expected 1")
    return cases.finish()


@pytest.mark.parametrize("how", ["denied", "off"])
def test_refused_falls_back_to_the_channel(how, seed):
    rank_env = [{}, {"PYCOLL_CPU_SHARED_TENSORS": "off"}] if how == "off" else None
    run_ranks(2, _refused_rank, seed, how, timeout=300, env=ENV, rank_env=rank_env)


def _allocator_rank(rank, ws, seed):
    """With the shared CPU allocator every large tensor is shared: a send of a fresh tensor goes by
    reference with no share_memory_()."""
    quiet()
    no_cpu_to_spare(ws)
    import pycollectives

    pycollectives.use_shared_cpu_memory()
    cases = Cases("p2p by reference, shared allocator", rank, ws, seed)
    n = elems(torch.float32, 1 << 20) + 3
    with cases.case():
        mine = gen(torch.float32, "data", (n,), cases.keyed_seed(rank)) * 1.0  # allocated after the switch
        got = torch.empty(n)
        before = _by_reference()
        w = dist.isend(mine, dst=(rank + 1) % ws)
        dist.recv(got, src=(rank - 1) % ws)
        w.wait()
        cases.check("received", got, gen(torch.float32, "data", (n,), cases.keyed_seed((rank - 1) % ws)))
        got_refs = _by_reference() - before
        cases.expect(got_refs == 1, f"{got_refs} messages by reference, expected 1")
    dist.barrier()
    return cases.finish()


def test_shared_allocator_sends_by_reference(seed):
    run_ranks(2, _allocator_rank, seed, timeout=300, env=ENV)


def _dead_receiver_rank(rank, ws):
    import time

    quiet()
    no_cpu_to_spare(ws)
    n = elems(torch.float32, 3 * CHANNEL)
    if rank == 1:
        dist.barrier()
        os._exit(3)  # never receives
    src = torch.ones(n).share_memory_()
    dist.barrier()
    t0 = time.monotonic()
    try:
        dist.send(src, dst=1)
    except RuntimeError as e:
        took = time.monotonic() - t0
        assert took < 15, f"raised only after {took:.1f}s: {e}"
        return str(e)
    raise AssertionError("a send to a receiver that died returned")


def test_send_to_dead_receiver_raises():
    results = run_ranks(2, _dead_receiver_rank, timeout=120, env=ENV, expect_exit={1: 3},
                        pg_timeout=datetime.timedelta(seconds=20), destroy=False)
    # The send waited for the receiver's copy out of this rank's file, and noticed it had gone.
    assert "rank 1 exited" in results[0] and "shared memory" in results[0], results[0]


def _withdrawn_rank(rank, ws):
    """Rank 0's send by reference times out before rank 1 posts its receive: the send raises, and
    the receive posted afterwards fails instead of delivering the bytes rank 0 then overwrites."""
    import time

    quiet()
    no_cpu_to_spare(ws)
    n = elems(torch.float32, 3 * CHANNEL)
    dist.barrier()
    if rank == 0:
        src = torch.ones(n).share_memory_()
        try:
            dist.send(src, dst=1)
        except RuntimeError as e:
            src.fill_(-1.0)  # the caller owns its buffer again once the send has failed
            return str(e)
        raise AssertionError("a send that no receive matched in time returned")
    time.sleep(PG_TIMEOUT_S + 2)  # past rank 0's deadline
    got = torch.zeros(n)
    try:
        dist.recv(got, src=0)
    except RuntimeError as e:
        return str(e)
    raise AssertionError(f"the receive of a withdrawn message returned; got {got[:3].tolist()}")


PG_TIMEOUT_S = 4


def test_withdrawn_send_fails_its_receive():
    results = run_ranks(2, _withdrawn_rank, timeout=120, env=ENV, destroy=False,
                        pg_timeout=datetime.timedelta(seconds=PG_TIMEOUT_S))
    assert "timed out" in results[0] and "shared memory" in results[0], results[0]
    assert "gave up on the message" in results[1], results[1]


def _spare_cpus_rank(rank, ws, seed):
    """With two CPUs or more per rank, a large shared send streams through the channel, whose two
    copies then run on two cores at once (faster there than one copy by reference)."""
    quiet()
    cases = Cases("p2p by reference, spare CPUs", rank, ws, seed)
    n = elems(torch.float32, 3 * CHANNEL) + 1
    with cases.case():
        mine = gen(torch.float32, "data", (n,), cases.keyed_seed(rank))
        got = filler(torch.float32, (n,))
        before = _by_reference()
        w = dist.isend(mine.clone().share_memory_(), dst=1 - rank)
        dist.recv(got, src=1 - rank)
        w.wait()
        cases.check("received", got, gen(torch.float32, "data", (n,), cases.keyed_seed(1 - rank)))
        cases.expect(_by_reference() == before, "a send came by reference where the ranks have CPUs to spare")
    return cases.finish()


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 4, reason="needs 4 CPUs (2 per rank)")
def test_spare_cpus_stream_through_the_channel(seed):
    run_ranks(2, _spare_cpus_rank, seed, timeout=120, env=ENV)
