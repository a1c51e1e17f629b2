"""Point-to-point into the receiver's shared tensor: a CPU send larger than the channel from a
private tensor, whose receive's tensor lives in a shared file, is written by the sender straight
into that file (csrc/cpu/p2p.h: the sender offers, the receiver answers with its file).

Every case checks the received bytes against the sent ones, that the sent tensor is unchanged, and
how many messages the sender wrote into their receiver (`_C._test_p2p_into_receiver`, counted by
the sender): all the large ones into shared receives, none into private, strided, small, any-source
or refused ones. The channel is set to 64 KiB so that messages of a few hundred KiB are "larger
than the channel"; each rank runs on at most as many CPUs as there are ranks, as on the 2-core CI
machine (with CPUs to spare the channel's two copies run at once and are faster, decision 0020).
"""
import datetime
import os
import time

import pytest
import torch
import torch.distributed as dist

from cpu_collectives_util import Cases, elems, no_cpu_to_spare, rank_log
from ranks import quiet, run_ranks
from reference import DTYPES, filler, gen

pytestmark = pytest.mark.pycoll_only

CHANNEL = 64 << 10
ENV = {"PYCOLL_P2P_CHANNEL_BYTES": str(CHANNEL), "PYCOLL_DEBUG": "INFO"}
UNMAPPABLE = "shared-memory receive buffer cannot be mapped here"


def _written():
    from pycollectives import _C

    return _C._test_p2p_into_receiver()


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
    # The send completes only once its bytes are in the receiver's tensor.
    with cases.case(kind="sender writes after wait"):
        n = elems(torch.float32, 3 * CHANNEL)
        mine = gen(torch.float32, "data", (n,), cases.keyed_seed(rank))
        src = mine.clone()
        got = filler(torch.float32, (n,)).share_memory_()
        r = dist.irecv(got, src=prv, tag=6)
        dist.send(src, dst=nxt, tag=6)
        src.fill_(-1.0)
        r.wait()
        dist.barrier()
        cases.check("received the bytes as they were at the send", got, gen(torch.float32, "data", (n,),
                                                                             cases.keyed_seed(prv)))
    # A receive of the wrong size fails; the next offer is still taken (both sides' counts of
    # offers stay in step).
    with cases.case(kind="size mismatch, then a good message"):
        n = elems(torch.float32, 2 * CHANNEL)
        first = gen(torch.float32, "data", (n,), cases.keyed_seed(rank, 1))
        second = gen(torch.float32, "data", (n,), cases.keyed_seed(rank, 2))
        before = _written()  # counts this rank's sends: the first arrives through the channel
        works = [dist.isend(first, dst=nxt, tag=9), dist.isend(second, dst=nxt, tag=10)]
        try:
            dist.recv(filler(torch.float32, (n - 1,)).share_memory_(), src=prv, tag=9)
            cases.fail("a receive of the wrong size", "did not raise")
        except RuntimeError as e:
            cases.expect("expects" in str(e), f"the error does not name the sizes: {e}")
        got = filler(torch.float32, (n,)).share_memory_()
        dist.recv(got, src=prv, tag=10)
        for w in works:
            w.wait()
        cases.check("received after the mismatch", got, gen(torch.float32, "data", (n,), cases.keyed_seed(prv, 2)))
        dist.barrier()
        cases.expect(_written() - before == 1, f"{_written() - before} messages written into the receiver, expected 1")
    # Small (fits the channel) and empty messages into shared tensors stream as before.
    for kind, n in (("small", elems(torch.float32, CHANNEL // 2)), ("empty", 0)):
        with cases.case(kind=kind):
            got = filler(torch.float32, (n,)).share_memory_()
            before = _written()
            w = dist.isend(gen(torch.float32, "data", (n,), cases.keyed_seed(rank)), dst=nxt, tag=7)
            dist.recv(got, src=prv, tag=7)
            w.wait()
            cases.check("received", got, gen(torch.float32, "data", (n,), cases.keyed_seed(prv)))
            cases.expect(_written() == before, f"a {kind} message was written into the receiver")
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
    n = elems(torch.float32, 4 * CHANNEL) + 1
    msgs = {tag: gen(torch.float32, "data", (n,), cases.keyed_seed(tag)) for tag in (1, 2, 3)}
    for any_source in (False, True):
        with cases.case(any_source=any_source):
            if rank == 0:
                before = _written()
                works = [dist.isend(msgs[tag].clone(), dst=1, tag=tag) for tag in (1, 2, 3)]
                for w in works:
                    w.wait()
                got = _written() - before
                want = 0 if any_source else 1
                cases.expect(got == want, f"{got} messages written into the receiver, expected {want}")
            elif rank == 1:
                for tag in (3, 1, 2):
                    got = filler(torch.float32, (n,)).share_memory_()
                    w = dist.irecv(got, src=None if any_source else 0, tag=tag)
                    w.wait()
                    cases.check(f"message {tag}", got, msgs[tag])
            dist.barrier()
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
    n = elems(torch.float32, 3 * CHANNEL) + 5
    for i in range(3):
        with cases.case(message=i):
            m = gen(torch.float32, "data", (n,), cases.keyed_seed(i))
            if rank == 0:
                before = _written()
                dist.send(m.clone(), dst=1)
                cases.expect(_written() == before, "a refused message was written into the receiver")
            else:
                got = filler(torch.float32, (n,)).share_memory_()
                dist.recv(got, src=0)
                cases.check("received", got, m)
    dist.barrier()
    if rank == 0:
        want = 1 if how == "denied" else 0
        cases.expect(rank_log().count(UNMAPPABLE) == want, f"{rank_log().count(UNMAPPABLE)} lines say so, expected {want}")
    return cases.finish()


@pytest.mark.parametrize("how", ["denied", "off"])
def test_refused_falls_back_to_the_channel(how, seed):
    rank_env = [{}, {"PYCOLL_CPU_SHARED_TENSORS": "off"}] if how == "off" else None
    run_ranks(2, _refused_rank, seed, how, timeout=300, env=ENV, rank_env=rank_env)


PG_TIMEOUT_S = 4


def _withdrawn_rank(rank, ws):
    """Rank 0's send times out before rank 1 posts its receive into a shared tensor: the send raises,
    and the receive posted afterwards fails instead of waiting for bytes that never come."""
    quiet()
    no_cpu_to_spare(ws)
    n = elems(torch.float32, 3 * CHANNEL)
    dist.barrier()
    if rank == 0:
        try:
            dist.send(torch.ones(n), dst=1)
        except RuntimeError as e:
            return str(e)
        raise AssertionError("a send that no receive matched in time returned")
    time.sleep(PG_TIMEOUT_S + 2)  # past rank 0's deadline
    got = torch.zeros(n).share_memory_()
    try:
        dist.recv(got, src=0)
    except RuntimeError as e:
        return str(e), got.abs().sum().item()
    raise AssertionError(f"the receive of a withdrawn message returned; got {got[:3].tolist()}")


def test_withdrawn_send_fails_its_receive():
    results = run_ranks(2, _withdrawn_rank, timeout=120, env=ENV, destroy=False,
                        pg_timeout=datetime.timedelta(seconds=PG_TIMEOUT_S))
    assert "timed out" in results[0] and "receiver taking the message" in results[0], results[0]
    message, written = results[1]
    assert "gave up on the message" in message, message
    assert written == 0, f"{written}: the withdrawn message reached the receiver's tensor"


def _dead_receiver_rank(rank, ws):
    quiet()
    no_cpu_to_spare(ws)
    if rank == 1:
        dist.barrier()
        os._exit(3)  # never receives
    dist.barrier()
    t0 = time.monotonic()
    try:
        dist.send(torch.ones(elems(torch.float32, 3 * CHANNEL)), dst=1)
    except RuntimeError as e:
        took = time.monotonic() - t0
        assert took < 15, f"raised only after {took:.1f}s: {e}"
        return str(e)
    raise AssertionError("a send to a receiver that died returned")


def test_send_to_dead_receiver_raises():
    results = run_ranks(2, _dead_receiver_rank, timeout=120, env=ENV, expect_exit={1: 3},
                        pg_timeout=datetime.timedelta(seconds=20), destroy=False)
    # The send offered, and noticed the receiver had gone while it waited for the answer.
    assert "rank 1 exited" in results[0] and "receiver taking the message" in results[0], results[0]


def _spare_cpus_rank(rank, ws, seed):
    """With two CPUs or more per rank, a large send into a shared tensor streams through the channel."""
    quiet()
    cases = Cases("p2p into the receiver, spare CPUs", rank, ws, seed)
    n = elems(torch.float32, 3 * CHANNEL) + 1
    with cases.case():
        got = filler(torch.float32, (n,)).share_memory_()
        before = _written()
        w = dist.isend(gen(torch.float32, "data", (n,), cases.keyed_seed(rank)), dst=1 - rank)
        dist.recv(got, src=1 - rank)
        w.wait()
        cases.check("received", got, gen(torch.float32, "data", (n,), cases.keyed_seed(1 - rank)))
        cases.expect(_written() == before, "a send was written into the receiver where the ranks have CPUs to spare")
    return cases.finish()


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 4, reason="needs 4 CPUs (2 per rank)")
def test_spare_cpus_stream_through_the_channel(seed):
    run_ranks(2, _spare_cpus_rank, seed, timeout=120, env=ENV)
