"""Point-to-point into the receiver's shared tensor: a CPU send larger than the channel from a
private tensor, whose receive's tensor lives in a shared file, is written by the sender straight
into that file (csrc/cpu/p2p.h: the sender offers, the receiver answers with its file).

Every case checks the received bytes against the sent ones, that the sent tensor is unchanged, and
how many messages the sender wrote into their receiver (`_C._test_p2p_into_receiver`, counted by
the sender): all the large ones into shared receives, none into private, strided, small, any-source
or refused ones. The channel is set to 64 KiB (cpu_collectives_util.P2P_ENV) so that messages of a
few hundred KiB are "larger than the channel"; each rank runs on at most as many CPUs as there are ranks, as on the 2-core CI
machine (with CPUs to spare the channel's two copies run at once and are faster, decision 0020).
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

UNMAPPABLE = "shared-memory receive buffer cannot be mapped here"


def _written():
    return p2p_direct_count("recv")


def _ring_rank(rank, ws, seed):
    """Every rank sends its private tensor to the next round a ring and receives from the previous
    into a tensor that is shared, a view at an offset in a shared tensor, private, or strided."""
    quiet()
    no_cpu_to_spare(ws)
    cases = Cases("p2p into the receiver", rank, ws, seed)
    nxt, prv = (rank + 1) % ws, (rank - 1) % ws
    for dtype in DTYPES:
        for nbytes in (CHANNEL + 8, 5 * CHANNEL + 24):
            n = elems(dtype, nbytes) + 3
            for into in ("shared", "shared view", "private", "strided"):
                with cases.case(dtype=dtype, n=n, into=into):
                    mine = gen(dtype, "data", (n,), cases.keyed_seed(rank))
                    theirs = gen(dtype, "data", (n,), cases.keyed_seed(prv))
                    src = mine.clone()
                    if into == "strided":
                        base = filler(dtype, (2 * n,)).share_memory_()
                        dst = base[::2]
                    elif into == "shared view":
                        base = filler(dtype, (n + 13,)).share_memory_()
                        dst = base[5:5 + n]
                    else:
                        base = filler(dtype, (n,))
                        dst = base.share_memory_() if into == "shared" else base
                    before = _written()
                    w = dist.isend(src, dst=nxt, tag=5)
                    dist.recv(dst, src=prv, tag=5)
                    w.wait()
                    cases.check("received", dst, theirs)
                    cases.check("sent tensor unchanged", src, mine)
                    if into == "shared view":
                        around = torch.cat([base[:5], base[5 + n:]])
                        cases.check("around the view", around, torch.cat([filler(dtype, (n + 13,))[:5],
                                                                          filler(dtype, (n + 13,))[5 + n:]]))
                    if into == "strided":
                        cases.check("between the strided elements", base[1::2], filler(dtype, (2 * n,))[1::2])
                    got = _written() - before
                    want = 1 if into in ("shared", "shared view") else 0
                    cases.expect(got == want, f"{got} messages written into the receiver, expected {want}")
    p2p_sender_writes_after_wait(cases, rank, nxt, prv, shared="recv")
    # A receive of the wrong size fails; the next offer is still taken (both sides' counts of
    # offers stay in step).
    with cases.case(kind="size mismatch, then a good message"):
        before = _written()  # counts this rank's sends: the first arrives through the channel
        p2p_size_mismatch_then_good(cases, rank, nxt, prv, "recv")
        dist.barrier()
        cases.expect(_written() - before == 1, f"{_written() - before} messages written into the receiver, expected 1")
    # Small (fits the channel) and empty messages into shared tensors stream as before.
    p2p_through_the_channel(cases, rank, nxt, prv, "recv", (("small", elems(torch.float32, CHANNEL // 2), True),
                                                            ("empty", 0, True)))
    dist.barrier()
    return cases.finish()


@pytest.mark.parametrize("ws", [2, 3, 4])
def test_ring_into_the_receiver(ws, seed):
    run_ranks(ws, _ring_rank, seed, timeout=300, env=ENV)


def _order_rank(rank, ws, seed):
    """Rank 0 sends three large private messages with tags 1, 2, 3; rank 1 receives them into shared
    tensors as 3, 1, 2: the two it reads before it wants them come through the channel into a buffer,
    the third is written into its tensor; then all three from any source, through the channel."""
    quiet()
    no_cpu_to_spare(ws)
    cases = Cases("p2p into the receiver, tag order", rank, ws, seed)
    p2p_out_of_order_tags(cases, rank, "recv", want={False: 1, True: 0})
    return cases.finish()


def test_out_of_order_tags_into_the_receiver(seed):
    run_ranks(2, _order_rank, seed, timeout=300, env=ENV)


def _refused_rank(rank, ws, seed, how):
    """The receiver's tensors cannot be written by the sender (how: "denied", rank 0's opens of
    peers' files fail as where the OS forbids them; "off", rank 1's PYCOLL_CPU_SHARED_TENSORS is
    off): every message arrives through the channel; the sender says so once where it was denied."""
    quiet()
    no_cpu_to_spare(ws)
    from pycollectives import _C

    if rank == 0 and how == "denied":
        _C._set_test_deny_shared_open(True)
    cases = Cases("p2p into the receiver, refused", rank, ws, seed)
    p2p_refused_messages(cases, rank, "recv")
    dist.barrier()
    if rank == 0:
        want = 1 if how == "denied" else 0
        cases.expect(rank_log().count(UNMAPPABLE) == want, f"{rank_log().count(UNMAPPABLE)} lines say so, expected {want}")
    return cases.finish()


@pytest.mark.parametrize("how", ["denied", "off"])
def test_refused_falls_back_to_the_channel(how, seed):
    rank_env = [{}, {"PYCOLL_CPU_SHARED_TENSORS": "off"}] if how == "off" else None
    run_ranks(2, _refused_rank, seed, how, timeout=300, env=ENV, rank_env=rank_env)


def test_withdrawn_send_fails_its_receive():
    results = run_ranks(2, p2p_withdrawn_rank, "recv", timeout=120, env=ENV, destroy=False,
                        pg_timeout=datetime.timedelta(seconds=P2P_PG_TIMEOUT_S))
    assert "timed out" in results[0] and "receiver taking the message" in results[0], results[0]
    message, written = results[1]
    assert "gave up on the message" in message, message
    assert written == 0, f"{written}: the withdrawn message reached the receiver's tensor"


def test_send_to_dead_receiver_raises():
    results = run_ranks(2, p2p_dead_receiver_rank, "recv", timeout=120, env=ENV, expect_exit={1: 3},
                        pg_timeout=datetime.timedelta(seconds=20), destroy=False)
    # The send offered, and noticed the receiver had gone while it waited for the answer.
    assert "rank 1 exited" in results[0] and "receiver taking the message" in results[0], results[0]


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 4, reason="needs 4 CPUs (2 per rank)")
def test_spare_cpus_stream_through_the_channel(seed):
    run_ranks(2, p2p_spare_cpus_rank, seed, "recv", timeout=120, env=ENV)
