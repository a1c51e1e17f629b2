"""Point-to-point by reference: a CPU send larger than the channel whose tensor lives in a shared
file (share_memory_(), or the shared CPU allocator) reaches the receiver as the file's name, and the
receiver copies it straight out of the sender's file (csrc/cpu/p2p.h).

Every case checks the received bytes against the sent ones, that the sent tensor is unchanged, and
how many messages came by reference (a count the receiver keeps, `_C._test_p2p_by_reference`): all
the large shared ones, none of the private, small or refused ones. The channel is set to 64 KiB
(cpu_collectives_util.P2P_ENV) so that messages of a few hundred KiB are "larger than the channel".
"""
import datetime
import os

import pytest
import torch
import torch.distributed as dist

from cpu_collectives_util import (P2P_CHANNEL as CHANNEL, P2P_ENV as ENV, P2P_PG_TIMEOUT_S, Cases, elems,
                                  no_cpu_to_spare, p2p_dead_receiver_rank, p2p_direct_count, p2p_out_of_order_tags,
                                  p2p_refused_messages,
                                  p2p_sender_writes_after_wait, p2p_size_mismatch_then_good, p2p_spare_cpus_rank,
                                  p2p_through_the_channel, p2p_withdrawn_rank, rank_log)
from ranks import quiet, run_ranks
from reference import DTYPES, filler, gen

pytestmark = pytest.mark.pycoll_only

SENDER_REFUSED = "cannot map this rank's shared-memory tensors"
RECEIVER_REFUSED = "point-to-point messages from it go through the channel"


def _by_reference():
    return p2p_direct_count("send")


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
    p2p_sender_writes_after_wait(cases, rank, nxt, prv, shared="send")
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
        p2p_size_mismatch_then_good(cases, rank, nxt, prv, "send")
    # Private, small (fits the channel) and empty shared messages stream as before.
    p2p_through_the_channel(cases, rank, nxt, prv, "send", (("private", elems(torch.float32, 3 * CHANNEL), False),
                                                            ("small", elems(torch.float32, CHANNEL // 2), True),
                                                            ("empty", 0, True)))
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
    p2p_out_of_order_tags(cases, rank, "send", want={False: 3, True: 3})
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
    p2p_refused_messages(cases, rank, "send")
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


def test_send_to_dead_receiver_raises():
    results = run_ranks(2, p2p_dead_receiver_rank, "send", timeout=120, env=ENV, expect_exit={1: 3},
                        pg_timeout=datetime.timedelta(seconds=20), destroy=False)
    # The send waited for the receiver's copy out of this rank's file, and noticed it had gone.
    assert "rank 1 exited" in results[0] and "shared memory" in results[0], results[0]


def test_withdrawn_send_fails_its_receive():
    results = run_ranks(2, p2p_withdrawn_rank, "send", timeout=120, env=ENV, destroy=False,
                        pg_timeout=datetime.timedelta(seconds=P2P_PG_TIMEOUT_S))
    assert "timed out" in results[0] and "shared memory" in results[0], results[0]
    message, received = results[1]
    assert "gave up on the message" in message, message
    assert received == 0, f"{received}: the withdrawn message reached the receiver's tensor"


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 4, reason="needs 4 CPUs (2 per rank)")
def test_spare_cpus_stream_through_the_channel(seed):
    run_ranks(2, p2p_spare_cpus_rank, seed, "send", timeout=120, env=ENV)
