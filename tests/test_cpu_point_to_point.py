"""Point-to-point on CPU tensors: send/recv (rings, pairs, tags, ordering, 8 MiB), batch_isend_irecv,
a rank sending to itself, and results written into tensors that require grad.
"""

import pytest
import torch
import torch.distributed as dist

from cpu_collectives_util import MIB8, P2P_WORLD_SIZES, SHAPES, SIZES, Cases, place, shape_of, shapes
from ranks import quiet, run_ranks
from reference import DTYPES, filler, gen


# --------------------------------------------------------------------------
# point to point


def _pairs(ws):
    return [(a, b) for a in range(ws) for b in range(a + 1, ws)]


def _send_recv_rank(rank, ws, seed):
    quiet()
    cases = Cases("send/recv", rank, ws, seed)
    nxt, prv = (rank + 1) % ws, (rank - 1) % ws

    # Everyone sends (isend) before receiving, round a ring; every dtype and
    # layout on both sides; then 8 MiB, which no eager buffer holds.
    work = [(d, spec) for d in DTYPES for spec in shapes(SHAPES)]
    work.append((torch.float32, ("contig", MIB8 // 4)))
    for dtype, spec in work:
        with cases.case(kind="ring, isend then recv", dtype=dtype, shape=spec):
            shape = shape_of(spec)
            mine = gen(dtype, "data", shape, cases.seed(rank))
            theirs = gen(dtype, "data", shape, cases.seed(prv))
            src, sguard = place(mine, spec)
            dst, rguard = place(filler(dtype, shape), spec)
            w = dist.isend(src, dst=nxt, tag=3)
            dist.recv(dst, src=prv, tag=3)
            w.wait()
            cases.check("received", dst, theirs)
            cases.check("sent tensor unchanged", src, mine)
            cases.check_guard(sguard)
            cases.check_guard(rguard)

    # Ranks outside a pair skip its cases, so the seeds here depend on the
    # pair, not on the case number.
    for a, b in _pairs(ws):
        if rank not in (a, b):
            continue
        peer = b if rank == a else a
        # Blocking send/recv, one direction after the other.
        with cases.case(kind="blocking send, then reply", pair=(a, b)):
            m1 = gen(torch.int64, "data", (1031,), cases.keyed_seed(a, b, a))
            m2 = gen(torch.float16, "data", (7,), cases.keyed_seed(a, b, b))
            if rank == a:
                dist.send(m1.clone(), dst=b)
                got = filler(torch.float16, (7,))
                dist.recv(got, src=b)
                cases.check("reply", got, m2)
            else:
                got = filler(torch.int64, (1031,))
                dist.recv(got, src=a)
                cases.check("message", got, m1)
                dist.send(m2.clone(), dst=a)

        # Two tagged messages received in the opposite order (same shape,
        # so only the tag tells them apart), with blocking recv.
        with cases.case(kind="tags, recv in reverse order", pair=(a, b)):
            x1 = gen(torch.float32, "data", (1031,), cases.keyed_seed(a, b, 0))
            x2 = gen(torch.float32, "data", (1031,), cases.keyed_seed(a, b, 1))
            if rank == a:
                w1 = dist.isend(x1.clone(), dst=b, tag=11)
                w2 = dist.isend(x2.clone(), dst=b, tag=12)
                w1.wait()
                w2.wait()
            else:
                g2 = filler(torch.float32, (1031,))
                g1 = filler(torch.float32, (1031,))
                dist.recv(g2, src=a, tag=12)
                dist.recv(g1, src=a, tag=11)
                cases.check("tag 12", g2, x2)
                cases.check("tag 11", g1, x1)

        # The same with irecv, different dtypes and sizes per tag, and the
        # sender the other way round.
        with cases.case(kind="tags, irecv in reverse order", pair=(a, b)):
            y1 = gen(torch.bfloat16, "data", (7,), cases.keyed_seed(a, b, 0))
            y2 = gen(torch.int32, "data", (65537,), cases.keyed_seed(a, b, 1))
            if rank == b:
                w1 = dist.isend(y1.clone(), dst=a, tag=21)
                w2 = dist.isend(y2.clone(), dst=a, tag=22)
                w2.wait()
                w1.wait()
            else:
                g2 = filler(torch.int32, (65537,))
                g1 = filler(torch.bfloat16, (7,))
                r2 = dist.irecv(g2, src=b, tag=22)
                r1 = dist.irecv(g1, src=b, tag=21)
                r1.wait()
                r2.wait()
                cases.check("tag 21", g1, y1)
                cases.check("tag 22", g2, y2)

        # Both send first (non-blocking), then both receive.
        with cases.case(kind="both send before receiving", pair=(a, b)):
            mine = gen(torch.float64, "data", (1031,), cases.keyed_seed(a, b, rank))
            theirs = gen(torch.float64, "data", (1031,), cases.keyed_seed(a, b, peer))
            big_mine = gen(torch.float32, "data", (MIB8 // 4,), cases.keyed_seed(a, b, rank) + 1)
            big_theirs = gen(torch.float32, "data", (MIB8 // 4,), cases.keyed_seed(a, b, peer) + 1)
            w1 = dist.isend(mine.clone(), dst=peer, tag=31)
            w2 = dist.isend(big_mine.clone(), dst=peer, tag=32)
            g1 = filler(torch.float64, (1031,))
            g2 = filler(torch.float32, (MIB8 // 4,))
            dist.recv(g1, src=peer, tag=31)
            dist.recv(g2, src=peer, tag=32)
            w1.wait()
            w2.wait()
            cases.check("small", g1, theirs)
            cases.check("8 MiB", g2, big_theirs)

        # Same tag: messages arrive in the order they were sent.
        with cases.case(kind="same tag keeps order", pair=(a, b)):
            msgs = [gen(torch.int64, "data", (n,), cases.keyed_seed(a, b, i))
                    for i, n in enumerate([3, 0, 1031, 1, 7])]
            if rank == a:
                ws_ = [dist.isend(m.clone(), dst=b, tag=41) for m in msgs]
                for w in ws_:
                    w.wait()
            else:
                for i, m in enumerate(msgs):
                    g = filler(torch.int64, m.shape)
                    dist.recv(g, src=a, tag=41)
                    cases.check(f"message {i}", g, m)
    dist.barrier()
    return cases.finish()


@pytest.mark.parametrize("world_size", P2P_WORLD_SIZES)
def test_send_recv(world_size, seed):
    run_ranks(world_size, _send_recv_rank, seed, timeout=300)


def _batch_isend_irecv_rank(rank, ws, seed):
    quiet()
    cases = Cases("batch_isend_irecv", rank, ws, seed)
    nxt, prv = (rank + 1) % ws, (rank - 1) % ws
    work = [(d, n) for d in DTYPES for n in SIZES] + [(torch.float32, MIB8 // 4)]
    for dtype, n in work:
        with cases.case(kind="ring", dtype=dtype, n=n):
            mine = gen(dtype, "data", (n,), cases.seed(rank))
            got = filler(dtype, (n,))
            ops = [dist.P2POp(dist.isend, mine.clone(), nxt),
                   dist.P2POp(dist.irecv, got, prv)]
            for req in dist.batch_isend_irecv(ops):
                req.wait()
            cases.check("received", got, gen(dtype, "data", (n,), cases.seed(prv)))
    for dtype in (torch.float32, torch.bfloat16, torch.int8):
        with cases.case(kind="every pair in one batch, two messages each", dtype=dtype):
            def msg(src, dst, k):
                return gen(dtype, "data", (1031 if k else 7,), cases.seed(src) + 97 * dst + k)
            ops, gots = [], {}
            for peer in range(ws):
                if peer == rank:
                    continue
                for k in range(2):
                    ops.append(dist.P2POp(dist.isend, msg(rank, peer, k), peer, tag=k))
                    gots[(peer, k)] = filler(dtype, (1031 if k else 7,))
                    ops.append(dist.P2POp(dist.irecv, gots[(peer, k)], peer, tag=k))
            for req in dist.batch_isend_irecv(ops):
                req.wait()
            for (peer, k), g in gots.items():
                cases.check(f"from rank {peer} message {k}", g, msg(peer, rank, k))
    return cases.finish()


@pytest.mark.parametrize("world_size", P2P_WORLD_SIZES)
def test_batch_isend_irecv(world_size, seed):
    run_ranks(world_size, _batch_isend_irecv_rank, seed)


def _self_p2p_rank(rank, ws, seed):
    quiet()
    cases = Cases("send/recv to self", rank, ws, seed)
    with cases.case(kind="batch: receive posted first, two tags out of order, plus a ring exchange"):
        a = gen(torch.float32, "data", (1031,), cases.seed(rank))
        b = gen(torch.int64, "data", (7,), cases.seed(rank) + 1)
        got_a, got_b = filler(torch.float32, (1031,)), filler(torch.int64, (7,))
        ops = [dist.P2POp(dist.irecv, got_b, rank, tag=2), dist.P2POp(dist.irecv, got_a, rank, tag=1),
               dist.P2POp(dist.isend, a, rank, tag=1), dist.P2POp(dist.isend, b, rank, tag=2)]
        if ws > 1:
            ring = filler(torch.float32, (1031,))
            ops += [dist.P2POp(dist.isend, a, (rank + 1) % ws), dist.P2POp(dist.irecv, ring, (rank - 1) % ws)]
        for req in dist.batch_isend_irecv(ops):
            req.wait()
        cases.check("tag 1", got_a, a)
        cases.check("tag 2", got_b, b)
        if ws > 1:
            cases.check("ring", ring, gen(torch.float32, "data", (1031,), cases.seed((rank - 1) % ws)))
    with cases.case(kind="sizes that do not match"):
        w = dist.isend(torch.ones(5), rank, tag=9)
        try:
            dist.recv(torch.empty(6), rank, tag=9)
            raise AssertionError("a receive of 6 elements matched a send of 5 without an error")
        except (RuntimeError, ValueError) as e:
            assert "send to self of 5 elements" in str(e), str(e)
        try:
            w.wait()
            raise AssertionError("the send's wait() did not report the mismatch")
        except (RuntimeError, ValueError):
            pass
    return cases.finish()


@pytest.mark.pycoll_only
@pytest.mark.parametrize("world_size", [1, 2])
def test_send_recv_to_self(world_size, seed):
    run_ranks(world_size, _self_p2p_rank, seed)


def _into_leaves_that_require_grad(rank, ws, seed):
    quiet()
    cases = Cases("results into tensors that require grad", rank, ws, seed)
    # A pipeline stage receives into leaves that require grad (torch.distributed.pipelining does): an
    # op writes them as a kernel does, outside autograd. Non-contiguous ones go through a copy.
    nxt, prv = (rank + 1) % ws, (rank - 1) % ws
    with cases.case(kind="recv into a non-contiguous leaf"):
        got = torch.empty_strided((4, 3), (1, 4), requires_grad=True)
        w = dist.isend(torch.full((4, 3), float(rank)), dst=nxt)
        dist.recv(got, src=prv)
        w.wait()
        assert got.is_leaf and got.requires_grad
        cases.check("received", got.detach(), torch.full((4, 3), float(prv)))
    with cases.case(kind="all_reduce of a non-contiguous leaf"):
        t = torch.empty_strided((4, 3), (1, 4), requires_grad=True)
        with torch.no_grad():
            t.fill_(rank + 1.0)
        dist.all_reduce(t)
        cases.check("sum", t.detach(), torch.full((4, 3), ws * (ws + 1) / 2))
    return cases.finish()


@pytest.mark.pycoll_only
@pytest.mark.parametrize("world_size", [2, 3])
def test_results_into_leaves_that_require_grad(world_size, seed):
    run_ranks(world_size, _into_leaves_that_require_grad, seed)
