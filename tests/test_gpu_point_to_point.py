"""Point-to-point and all_to_all of CUDA tensors on the CUDA engine (issue 23), on 2, 3 and 4 GPUs:
every dtype, sizes 0, 1, odd, 4 MiB + 3 and 256 MiB, odd offsets, non-contiguous tensors, tags,
many outstanding isends to every peer, both directions at once, uneven all_to_all with zero-size
splits; a length mismatch raises on both ranks; a send/recv pair replays in a CUDA graph; a
coalesced batch_isend_irecv runs in one launch where it fits, against ranks that post one by one.

Data movement is exact, so every result is compared byte for byte with a plain torch computation
on inputs that every rank builds from the same seed (random bytes viewed as the dtype: any dtype
moves as bytes)."""
import hashlib
import time

import pytest
import torch
import torch.distributed as dist

from gpu_collectives_util import GPU_MARKS, PG_TIMEOUT, gpus_missing, run_as_script, setup_device
from ranks import run_ranks

pytestmark = [m for m in GPU_MARKS if m.name != "skipif"]

WORLDS = (2, 3, 4)
MOVE_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.uint8, torch.int16,
               torch.int32, torch.int64, torch.bool, torch.float8_e4m3fn, torch.float8_e5m2, torch.uint16,
               torch.uint32, torch.uint64, torch.complex64)
MiB = 1 << 20


def run_on(world, fn, seed, timeout=300):
    """Runs fn on `world` ranks, rank r on GPU r % count (skips where gpus_missing says so); every rank
    returns True."""
    if gpus_missing(world):
        pytest.skip(gpus_missing(world))
    assert run_ranks(world, fn, seed, timeout=timeout, pg_timeout=PG_TIMEOUT) == [True] * world


def needs(world):
    return pytest.mark.skipif(gpus_missing(world) is not None, reason=gpus_missing(world) or "")


def payload(seed, key, rank, numel, dtype, dev):
    """Rank `rank`'s message of case `key`: random bytes viewed as `dtype` (0/1 for bool)."""
    g = torch.Generator(device=dev)
    h = int.from_bytes(hashlib.sha1(repr(key).encode()).digest()[:7], "little")
    g.manual_seed((seed * 1000003 + h * 31 + rank) % (2**62))
    if dtype == torch.bool:
        return torch.randint(0, 2, (numel,), generator=g, device=dev).bool()
    es = torch.empty(0, dtype=dtype).element_size()
    return torch.randint(0, 256, (numel * es,), generator=g, device=dev, dtype=torch.uint8).view(dtype)


def assert_same(got, want, what):
    assert got.shape == want.shape and got.dtype == want.dtype, f"{what}: {got.shape}/{got.dtype} vs {want.shape}"
    a = got.contiguous().reshape(-1).view(torch.uint8)
    b = want.contiguous().reshape(-1).view(torch.uint8)
    if not torch.equal(a, b):
        bad = (a != b).nonzero()[:5].flatten().tolist()
        raise AssertionError(f"{what}: {int((a != b).sum())} bytes differ, first at byte offsets {bad}")


def ring_exchange(send_t, recv_t, rank, world, tag=0):
    """Every rank sends to rank+1 and receives from rank-1, both at once."""
    reqs = [dist.isend(send_t, (rank + 1) % world, tag=tag), dist.irecv(recv_t, (rank - 1) % world, tag=tag)]
    for r in reqs:
        r.wait()


# ---------------------------------------------------------------------------------------------
# send / recv


def _dtypes_and_sizes(rank, world, seed):
    dev = setup_device(rank)
    prv = (rank - 1) % world
    for dtype in MOVE_DTYPES:
        for numel in (0, 1, 1031, MiB + 3):
            key = ("p2p", str(dtype), numel)
            got = torch.zeros(numel, dtype=dtype, device=dev)
            ring_exchange(payload(seed, key, rank, numel, dtype, dev), got, rank, world)
            assert_same(got, payload(seed, key, prv, numel, dtype, dev), str(key))
    # Bytes: odd sizes around the chunk and CTA boundaries, 4 MiB + 3 and 256 MiB.
    for nbytes in (7, 65535, 65537, 4 * MiB + 3, 33 * MiB + 5, 256 * MiB):
        key = ("p2p-bytes", nbytes)
        got = torch.empty(nbytes, dtype=torch.uint8, device=dev)
        ring_exchange(payload(seed, key, rank, nbytes, torch.uint8, dev), got, rank, world)
        assert_same(got, payload(seed, key, prv, nbytes, torch.uint8, dev), str(key))
        del got
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    return True


def _layouts_and_tags(rank, world, seed):
    dev = setup_device(rank)
    nxt, prv = (rank + 1) % world, (rank - 1) % world
    # Odd offsets: a message that starts 1 byte (and 1 element) into its buffer, both ends.
    for dtype, numel in ((torch.uint8, 3 * MiB + 1), (torch.float16, 100003)):
        key = ("offset", str(dtype))
        base = torch.zeros(numel + 1, dtype=dtype, device=dev)
        base[1:].copy_(payload(seed, key, rank, numel, dtype, dev))
        out = torch.zeros(numel + 3, dtype=dtype, device=dev)
        ring_exchange(base[1:], out[3:], rank, world)
        assert_same(out[3:], payload(seed, key, prv, numel, dtype, dev), str(key))
        assert not out[:3].any(), f"{key}: bytes before the receive buffer were written"
    # Non-contiguous on both ends: a transposed matrix, every other column.
    key = ("strided",)
    m = payload(seed, key, rank, 1030 * 2048, torch.float32, dev).view(1030, 2048).t()  # (2048, 1030)
    want = payload(seed, key, prv, 1030 * 2048, torch.float32, dev).view(1030, 2048).t()
    got = torch.zeros(2048, 1030, device=dev)
    ring_exchange(m, got, rank, world)
    assert_same(got, want, "transposed send")
    got_t = torch.zeros(1030, 2048, device=dev).t()
    ring_exchange(m.contiguous(), got_t, rank, world)
    assert_same(got_t, want, "transposed receive")
    got2 = torch.zeros(2048, 1030, device=dev)
    ring_exchange(m[:, ::2], got2[:, ::2], rank, world)
    assert_same(got2[:, ::2], want[:, ::2], "strided send and receive")
    assert not got2[:, 1::2].any(), "strided receive wrote between its elements"
    # Tags (not in numeric order) and sizes that differ from message to message: matched in
    # posting order per peer, as NCCL matches them.
    tags = (7, 2, 11, 0, 5)
    sizes = (1, 300001, 17, 2 * MiB + 1, 0)
    works, outs = [], []
    for tag, n in zip(tags, sizes):
        works.append(dist.isend(payload(seed, ("tag", tag), rank, n, torch.float32, dev), nxt, tag=tag))
    for tag, n in zip(tags, sizes):
        outs.append(torch.empty(n, device=dev))
        works.append(dist.irecv(outs[-1], prv, tag=tag))
    for w in works:
        w.wait()
    for tag, n, o in zip(tags, sizes, outs):
        assert_same(o, payload(seed, ("tag", tag), prv, n, torch.float32, dev), f"tag {tag}")
    # To itself, in one batch with the ring exchange.
    mine = payload(seed, ("self",), rank, 4099, torch.float32, dev)
    back = torch.empty(4099, device=dev)
    got = torch.empty(4099, device=dev)
    ops = [dist.P2POp(dist.irecv, back, rank), dist.P2POp(dist.isend, mine, rank),
           dist.P2POp(dist.isend, mine, nxt), dist.P2POp(dist.irecv, got, prv)]
    for w in dist.batch_isend_irecv(ops):
        w.wait()
    assert_same(back, mine, "to itself")
    assert_same(got, payload(seed, ("self",), prv, 4099, torch.float32, dev), "batch beside self")
    torch.cuda.synchronize()
    return True


def _every_peer_at_once(rank, world, seed):
    """Expert parallelism's pattern: many outstanding isends to every peer and irecvs from every
    peer, all posted before any wait; once one message at a time, once as one batch_isend_irecv."""
    dev = setup_device(rank)
    peers = [p for p in range(world) if p != rank]
    rounds = 6

    def size(src, dst, i):  # differs per pair and message, includes 0 and messages of several MiB
        return ((src * 7 + dst * 3 + i * 5) % 9) * 262147 if (src + dst + i) % 4 else 0

    for batched in (False, True):
        outs = {}
        ops = []
        for i in range(rounds):
            for p in peers:
                x = payload(seed, ("all-peers", rank, p, i), rank, size(rank, p, i), torch.bfloat16, dev)
                outs[(p, i)] = torch.empty(size(p, rank, i), dtype=torch.bfloat16, device=dev)
                ops += [dist.P2POp(dist.isend, x, p), dist.P2POp(dist.irecv, outs[(p, i)], p)]
        if batched:
            works = dist.batch_isend_irecv(ops)
        else:
            works = [op.op(op.tensor, op.peer) for op in ops]
        for w in works:
            w.wait()
        for (p, i), o in outs.items():
            want = payload(seed, ("all-peers", p, rank, i), p, size(p, rank, i), torch.bfloat16, dev)
            assert_same(o, want, f"from {p}, message {i}, batched={batched}")
    torch.cuda.synchronize()
    return True


@pytest.mark.parametrize("world", WORLDS)
def test_send_recv_dtypes_and_sizes(world, seed):
    run_on(world, _dtypes_and_sizes, seed, timeout=600)


@pytest.mark.parametrize("world", WORLDS)
def test_send_recv_layouts_and_tags(world, seed):
    run_on(world, _layouts_and_tags, seed, timeout=300)


@pytest.mark.parametrize("world", WORLDS)
def test_send_recv_every_peer_at_once(world, seed):
    run_on(world, _every_peer_at_once, seed, timeout=300)


def _coalesced_batches(rank, world, seed):
    """batch_isend_irecv runs in one launch where it fits (a send to and a receive from every peer,
    once each, in CTAs the GPU holds at once), op by op otherwise; either way every byte arrives,
    with ranks that do not coalesce (odd ranks: PYCOLL_COALESCE_P2P=0) posting the same messages
    one by one, and with single isends/irecvs before and after each batch."""
    import pycollectives

    dev = setup_device(rank)
    peers = [p for p in range(world) if p != rank]
    coalescing = rank % 2 == 0
    assert dist.group.WORLD._get_backend(dev).supports_coalescing == coalescing
    # Sizes in bytes: tiny, odd, a few MiB with an odd tail, 64 MiB + 3 (one launch on 2 GPUs, op
    # by op on 3 and 4: 2 x (n-1) x 64 CTAs are more than the GPU holds at once).
    for r, nbytes in enumerate((1, 4099 * 4 + 1, 3 * MiB + 5, 64 * MiB + 3)):
        before = pycollectives.stats().get("batch_isend_irecv", {}).get("calls", 0)
        # A single message each way before the batch, and one after (the lanes' order).
        pre_out = {p: torch.empty(777, dtype=torch.uint8, device=dev) for p in peers}
        pre = [dist.isend(payload(seed, ("pre", r, rank, p), rank, 777, torch.uint8, dev), p) for p in peers]
        pre += [dist.irecv(pre_out[p], p) for p in peers]
        ops, outs = [], {}
        for p in peers:
            # Odd offsets on both ends: a send from byte 1 of a buffer, a receive into byte 3.
            src = torch.empty(nbytes + 1, dtype=torch.uint8, device=dev)
            src[1:] = payload(seed, ("batch", r, rank, p), rank, nbytes, torch.uint8, dev)
            dst = torch.zeros(nbytes + 3, dtype=torch.uint8, device=dev)
            outs[p] = dst
            ops += [dist.P2POp(dist.isend, src[1:], p), dist.P2POp(dist.irecv, dst[3:], p)]
        works = dist.batch_isend_irecv(ops)
        post_out = {p: torch.empty(5, 7, device=dev).t() for p in peers}  # non-contiguous receive
        post = [dist.isend(payload(seed, ("post", r, rank, p), rank, 35, torch.float32, dev).view(7, 5), p)
                for p in peers]
        post += [dist.irecv(post_out[p], p) for p in peers]
        for w in pre + works + post:
            w.wait()
        for p in peers:
            assert_same(pre_out[p], payload(seed, ("pre", r, p, rank), p, 777, torch.uint8, dev), f"pre from {p}")
            assert torch.all(outs[p][:3] == 0), "bytes before the receive were written"
            assert_same(outs[p][3:], payload(seed, ("batch", r, p, rank), p, nbytes, torch.uint8, dev),
                        f"batch of {nbytes} B from {p}")
            want = payload(seed, ("post", r, p, rank), p, 35, torch.float32, dev).view(7, 5)
            assert_same(post_out[p], want, f"post from {p}")
        launched = pycollectives.stats().get("batch_isend_irecv", {}).get("calls", 0) - before
        sms = torch.cuda.get_device_properties(dev).multi_processor_count
        fits = pycollectives._C.cuda_p2p_batch_plan([(p, s, nbytes) for p in peers for s in (True, False)],
                                                    world, sms)["fits"]
        assert fits or world > 2  # a send and a receive always fit
        assert launched == (1 if coalescing and fits else 0), (nbytes, launched, fits)
    torch.cuda.synchronize()
    return True


@pytest.mark.parametrize("world", WORLDS)
def test_batch_isend_irecv_coalesced(world, seed):
    if gpus_missing(world):
        pytest.skip(gpus_missing(world))
    rank_env = [{"PYCOLL_COALESCE_P2P": str(1 - r % 2)} for r in range(world)]
    assert run_ranks(world, _coalesced_batches, seed, timeout=300, pg_timeout=PG_TIMEOUT,
                     rank_env=rank_env) == [True] * world


# ---------------------------------------------------------------------------------------------
# all_to_all


def _all_to_all(rank, world, seed):
    dev = setup_device(rank)

    def split(src, dst, scale):  # elements src sends dst: uneven, with zero-size splits
        return 0 if (src * 3 + dst) % 5 == 1 else (src * 131 + dst * 17 + 1) * scale

    for scale in (1, 1031, 262147):
        for dtype in (torch.float32, torch.uint8, torch.bfloat16, torch.float8_e5m2):
            key = ("a2a", scale, str(dtype))
            xs = [payload(seed, key, q, sum(split(q, d, scale) for d in range(world)), dtype, dev)
                  for q in range(world)]
            ins = [split(rank, d, scale) for d in range(world)]
            outs = [split(s, rank, scale) for s in range(world)]
            o = torch.empty(sum(outs), dtype=dtype, device=dev)
            dist.all_to_all_single(o, xs[rank], output_split_sizes=outs, input_split_sizes=ins)
            want = torch.cat([xs[s].split([split(s, d, scale) for d in range(world)])[rank] for s in range(world)])
            assert_same(o, want, str(key))
    # Even splits up to 64 MiB per rank, and the list form with non-contiguous inputs.
    for nbytes in (8 * world, 4 * MiB * world, 64 * MiB // world * world):
        key = ("a2a-even", nbytes)
        xs = [payload(seed, key, q, nbytes, torch.uint8, dev) for q in range(world)]
        o = torch.empty(nbytes, dtype=torch.uint8, device=dev)
        dist.all_to_all_single(o, xs[rank])
        c = nbytes // world
        assert_same(o, torch.cat([xs[q][rank * c:(rank + 1) * c] for q in range(world)]), str(key))
        del xs, o
    key = ("a2a-list",)
    mats = [payload(seed, key, q, world * 64 * 33, torch.float32, dev).view(world, 64, 33) for q in range(world)]
    ins = [mats[rank][d][:, ::2] for d in range(world)]  # non-contiguous
    outs = [torch.empty(64, 17, device=dev) for _ in range(world)]
    dist.all_to_all(outs, ins)
    for s in range(world):
        assert_same(outs[s], mats[s][rank][:, ::2], f"list form from {s}")
    torch.cuda.synchronize()
    return True


@pytest.mark.parametrize("world", WORLDS)
def test_all_to_all_uneven_and_large(world, seed):
    run_on(world, _all_to_all, seed, timeout=300)


# ---------------------------------------------------------------------------------------------
# length mismatch, CUDA graphs


def _length_mismatch(rank, world, seed):
    """Rank 0 sends, rank 1 expects another length: both raise, the receiver naming both lengths,
    well within the group's timeout, at the latest at the group's next call. Each case in a fresh
    group (an engine that saw an error stays unusable): a near miss (40 against 41 CTAs, the sender
    never waits), a send far larger than the receive (the sender's CTAs wait for credits that never
    come and must leave through the group's error state), the reverse, and a send of no bytes (its
    empty chunk carries the length)."""
    dev = setup_device(rank)
    cases = ((5 * MiB, 5 * MiB + 4), (64 * MiB, MiB), (MiB, 64 * MiB), (0, 4 * MiB))
    texts = []
    for sent, expected in cases:
        g = dist.new_group([0, 1], timeout=PG_TIMEOUT)
        if rank > 1:
            continue
        dist.all_reduce(torch.ones(4, device=dev), group=g)  # the group's engine works
        t0 = time.monotonic()
        try:
            if rank == 0:
                dist.send(torch.ones(sent // 4, device=dev), 1, group=g)
            else:
                dist.recv(torch.empty(expected // 4, device=dev), 0, group=g)
            torch.cuda.synchronize()
            for _ in range(3):
                dist.all_reduce(torch.ones(4, device=dev), group=g)
                torch.cuda.synchronize()
        except RuntimeError as e:
            took = time.monotonic() - t0
            assert took < PG_TIMEOUT.total_seconds() / 2, f"rank {rank}, {sent}/{expected}: after {took:.1f} s"
            texts.append(str(e))
            continue
        raise AssertionError(f"rank {rank}: sending {sent} bytes to a receive of {expected} went unnoticed")
    return texts if rank <= 1 else "idle"


@needs(2)
def test_send_recv_length_mismatch_raises(seed):
    texts = run_ranks(2, _length_mismatch, seed, timeout=300, pg_timeout=PG_TIMEOUT)
    for i, (sent, expected) in enumerate(((5 * MiB, 5 * MiB + 4), (64 * MiB, MiB), (MiB, 64 * MiB), (0, 4 * MiB))):
        pair = [texts[0][i], texts[1][i]]
        # The receiver's kernel names both lengths; the sender learns of it through the group's
        # error state (the first error of either rank is what both report).
        assert any(f"{expected} bytes but the peer sent {sent}" in t for t in pair), pair
        assert all("unusable" in t for t in pair), pair


def _replays_move_new_data(rank, source, numel, exchange):
    """Runs `exchange(x, y)` once outside a graph (that creates the engine), captures it in a CUDA
    graph, then replays it three times with new data in x: y must hold rank `source`'s data of that
    replay each time."""
    dev = torch.device("cuda", torch.cuda.current_device())
    x = torch.zeros(numel, device=dev)
    y = torch.zeros_like(x)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        exchange(x, y)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        exchange(x, y)
    for i in range(3):
        x.fill_(float(rank * 10 + i))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.all(y == float(source * 10 + i)), f"replay {i}: got {y[0].item()}"
    return True


def _graph(rank, world, seed):
    """A send/recv pair captured in a CUDA graph moves new data at every replay."""
    setup_device(rank)
    return _replays_move_new_data(rank, (rank - 1) % world, 3 * MiB + 5,
                                  lambda x, y: ring_exchange(x, y, rank, world))


def _batch_graph(rank, world, seed):
    """A coalesced batch_isend_irecv (one launch) captured in a CUDA graph moves new data at every replay."""
    setup_device(rank)
    peer = 1 - rank

    def exchange(x, y):
        for w in dist.batch_isend_irecv([dist.P2POp(dist.isend, x, peer), dist.P2POp(dist.irecv, y, peer)]):
            w.wait()

    return _replays_move_new_data(rank, peer, MiB + 3, exchange)


@needs(2)
def test_coalesced_batch_in_cuda_graph(seed):
    assert run_ranks(2, _batch_graph, seed, timeout=300, pg_timeout=PG_TIMEOUT) == [True, True]


@needs(2)
def test_send_recv_in_cuda_graph(seed):
    assert run_ranks(2, _graph, seed, timeout=300, pg_timeout=PG_TIMEOUT) == [True, True]


if __name__ == "__main__":  # pragma: no cover - lets the device machine run it without pytest plugins
    run_as_script(globals())
