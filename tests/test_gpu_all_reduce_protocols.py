"""The CUDA engine's all_reduce protocols, each forced on through its settings: LL (one-shot),
LL128 (two-shot, small and full grid), the split one-shot, and two-shot waves; each interleaved
with other protocols and replayed in CUDA graphs.
"""
import os

import pytest
import torch
import torch.distributed as dist

from gpu_collectives_util import (DTYPES, FLOATS, GPU_MARKS, PG_TIMEOUT, WORLD, R, assert_same_digests,
                                  check_close, digest, large_sum, make_input, op_name, ops_for, reference,
                                  run_as_script, setup_device)
from ranks import run_ranks, set_algo

pytestmark = GPU_MARKS


def _reduce_at_offset(seed, key, rank, world, numel, offset, dtype, op, dev):
    """all_reduce of a view at element `offset` inside a zeroed allocation with guard elements on
    both sides: checks the result and that nothing outside the view was written; returns the
    (key, digest) row the parent compares across ranks."""
    xs = [make_input(seed, key, q, numel, dtype, dev, op) for q in range(world)]
    base = torch.zeros(numel + offset + 3, dtype=dtype, device=dev)
    t = base[offset:offset + numel]
    t.copy_(xs[rank])
    dist.all_reduce(t, op=op)
    check_close(t, reference(xs, op, dtype), dtype, str(key))
    assert not base[:offset].any() and not base[offset + numel:].any(), key
    return (str(key), digest(t))


def _check_broadcast_and_all_gather(rank, world, dev, i, bcast_numel, gather_numel):
    """A broadcast from rank i % world and an all_gather, checked: other collectives on the same
    channels between the calls a test interleaves them with."""
    b = torch.full((bcast_numel,), float(rank), device=dev)
    dist.broadcast(b, src=i % world)
    assert torch.all(b == float(i % world)), i
    g = torch.empty(world * gather_numel, device=dev)
    dist.all_gather_into_tensor(g, torch.full((gather_numel,), float(rank), device=dev))
    assert torch.equal(g, torch.arange(world, device=dev).float().repeat_interleave(gather_numel)), i


def _check_graph_replays(rank, world, xs):
    """One all_reduce per tensor of `xs` captured in a CUDA graph (after a warm-up on a side
    stream), replayed four times with fresh inputs: every element must be the sum over ranks."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for x in xs:
            dist.all_reduce(x)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for x in xs:
            dist.all_reduce(x)
    for i in range(4):
        for x in xs:
            x.fill_(float(rank * 10 + i))
        graph.replay()
        torch.cuda.synchronize()
        want = sum(q * 10 + i for q in range(world))
        for x in xs:
            assert torch.all(x == want), f"replay {i}: {x.numel()} elements gave {x[0].item()}, want {want}"


def _all_reduce_ll(rank, world, seed):
    """The LL protocol (one-shot up to PYCOLL_CUDA_LL_MAX_KIB, here its 1 MiB maximum): messages
    that end inside a 16 KiB CTA region or a line, odd offsets, every dtype; LL calls interleaved
    with channel-protocol collectives (per-CTA epochs, the stale-message check must not fire);
    CUDA graph replays (the epochs live on the device)."""
    dev = setup_device(rank)
    out = []
    set_algo("oneshot")
    region = 16 << 10
    byte_sizes = (8, 24, region - 8, region, region + 2, 3 * region + 9, 100003, (1 << 20) - 6, 1 << 20)
    for dtype in DTYPES:
        es = torch.tensor([], dtype=dtype).element_size()
        for op in ops_for(dtype)[:4]:
            for nbytes in byte_sizes:
                numel = max(1, nbytes // es)
                for offset in (0, 1):
                    key = ("ar-ll", str(dtype), op_name(op), numel, offset)
                    out.append(_reduce_at_offset(seed, key, rank, world, numel, offset, dtype, op, dev))
    # Interleaved with the channel protocol: large one-shot, two-shot, broadcast, all_gather.
    for i in range(4):
        for numel in (5, 4099, 70001):
            x = torch.full((numel,), float(rank + i), device=dev)
            dist.all_reduce(x)
            assert torch.all(x == sum(q + i for q in range(world))), (i, numel)
        big = torch.full(((4 << 20) // 4 + 1,), float(rank), device=dev)
        set_algo("twoshot" if i % 2 else "oneshot")
        dist.all_reduce(big)
        set_algo("oneshot")
        assert torch.all(big == sum(range(world))), i
        _check_broadcast_and_all_gather(rank, world, dev, i, 1000 + i, 3)
    # Graph replays: several LL sizes and a channel-protocol call in one graph.
    xs = [torch.zeros(n, device=dev) for n in (3, 4099, 200000)]
    big = torch.zeros((4 << 20) // 4, device=dev)
    _check_graph_replays(rank, world, xs + [big])
    set_algo("auto")
    torch.cuda.synchronize()
    return out


def test_all_reduce_ll_protocol(seed):
    assert_same_digests(run_ranks(WORLD, _all_reduce_ll, seed, timeout=600, pg_timeout=PG_TIMEOUT,
                                   env={"PYCOLL_CUDA_LL_MAX_KIB": "1024"}))


def _all_reduce_ll128(rank, world, seed):
    """The LL128 two-shot (kernels/ll128_two_shot.cuh; PYCOLL_CUDA_LL128_MAX_KIB, here 64 MiB on
    every world size, and PYCOLL_CUDA_LL128_BLOCKS=5 so that CTA ranges end at odd lines): every
    dtype and op in place at odd offsets, sizes from 1 element (the last ranks own no line and send
    an ack) through lines and CTA rows that end mid-word; the largest message the region holds and
    one just above it (the channel two-shot then); calls interleaved with channel-protocol and LL
    collectives; CUDA graph replays (the epochs live on the device)."""
    dev = setup_device(rank)
    out = []
    set_algo("twoshot")
    line = 120
    byte_sizes = (8, 24, line - 8, line, world * line + 16, 64 * line * world * 5 + 40, 100003, (1 << 20) + 6,
                  (5 << 20) + 24)
    for dtype in DTYPES:
        es = torch.tensor([], dtype=dtype).element_size()
        for op in ops_for(dtype)[:4] + ((R.AVG,) if dtype in FLOATS else ()):
            for nbytes in byte_sizes:
                numel = max(1, nbytes // es)
                offset = (numel + len(str(op))) % 3
                key = ("ar-ll128", str(dtype), op_name(op), numel, offset)
                out.append(_reduce_at_offset(seed, key, rank, world, numel, offset, dtype, op, dev))
    # The region's largest message and one element more (channel two-shot); bf16 rounds once.
    for dtype in (torch.float32, torch.bfloat16):
        numel = (64 << 20) // torch.tensor([], dtype=dtype).element_size()
        for n in (numel, numel + 1):
            out.append(large_sum(seed, ("ar-ll128-large", str(dtype), n), rank, world, n, dtype, dev))
    # Interleaved with the channel protocol (ring, one-shot) and LL: per-CTA epochs and the
    # stale-message check must not fire.
    for i in range(6):
        for algo, numel in (("twoshot", 70001), ("ring", 4099), ("twoshot", (3 << 20) + 1), ("oneshot", 5),
                            ("oneshot", (2 << 20) + 3)):
            set_algo(algo)
            x = torch.full((numel,), float(rank + i), device=dev)
            dist.all_reduce(x)
            assert torch.all(x == sum(q + i for q in range(world))), (i, algo, numel)
        set_algo("twoshot")
        _check_broadcast_and_all_gather(rank, world, dev, i, 1000 + i, 3)
    _check_ll128_grid_changes(rank, world, dev)
    set_algo("twoshot")
    _check_graph_replays(rank, world, [torch.zeros(n, device=dev) for n in (3, 4099, 300007, (4 << 20) + 1)])
    set_algo("auto")
    torch.cuda.synchronize()
    return out


def _check_ll128_grid_changes(rank, world, dev):
    """Two-shot calls whose CTA count grows and shrinks with the size (a row of 64 lines per CTA:
    about 7600 / 7700 / 11600 / 20000 float32 elements on two ranks give 1 / 2 / 3 / 5 CTAs), each
    with values no earlier call had: which CTA owns a line changes, and a line an earlier call left
    must never pass for this call's (the review's stale-flag case: wrong sums, no error)."""
    set_algo("twoshot")
    sizes = [n * world // 2 for n in (7600, 7700, 11600, 20000, 7600, 20000, 7700, 11600, 7600, 7700)]
    for i, numel in enumerate(sizes):
        x = torch.arange(numel, device=dev, dtype=torch.float32) + float(1000 * i + rank)
        dist.all_reduce(x)
        want = torch.arange(numel, device=dev, dtype=torch.float32) * world + sum(1000 * i + q for q in range(world))
        assert torch.equal(x, want), (i, numel, (x != want).nonzero()[:4].flatten().tolist())


def test_all_reduce_ll128_protocol(seed):
    env = {"PYCOLL_CUDA_LL128_MAX_KIB": str(64 << 10), "PYCOLL_CUDA_LL128_BLOCKS": "5"}
    assert_same_digests(run_ranks(WORLD, _all_reduce_ll128, seed, timeout=600, pg_timeout=PG_TIMEOUT, env=env))


def _all_reduce_ll128_grid(rank, world, seed):
    """The LL128 two-shot with its default CTA count (up to 128) at the sizes it serves by default,
    in place at an odd offset."""
    dev = setup_device(rank)
    set_algo("twoshot")
    out = []
    for dtype in (torch.float32, torch.float16, torch.int32):
        for nbytes in ((4 << 20) + 8, (16 << 20) - 24, 40 << 20):
            numel = nbytes // torch.tensor([], dtype=dtype).element_size()
            out.append(_reduce_at_offset(seed, ("ar-ll128-grid", str(dtype), numel), rank, world, numel, 1, dtype,
                                         R.SUM, dev))
    _check_ll128_grid_changes(rank, world, dev)
    set_algo("auto")
    return out


def test_all_reduce_ll128_full_grid(seed):
    env = {"PYCOLL_CUDA_LL128_MAX_KIB": str(64 << 10)}
    assert_same_digests(run_ranks(WORLD, _all_reduce_ll128_grid, seed, timeout=600, pg_timeout=PG_TIMEOUT, env=env))


def _all_reduce_split(rank, world, seed):
    """The split one-shot (pushing and reducing CTAs apart, kernels/one_shot.cuh; two ranks only),
    forced for every one-shot call of the channel protocol (PYCOLL_CUDA_SPLIT_MIN_KIB=0, LL off)
    with 16 KiB chunks,
    so that a channel carries many chunks: every dtype, in place (the reducer must not overwrite
    input its own pusher has not sent yet), odd offsets, sizes from 1 element to
    64 MiB; interleaved with two-shot, broadcast and all_gather on the same channels (the split
    kernel uses each channel's two directions from two CTAs); CUDA graph replays. With two ranks,
    the kernel's timeline (PYCOLL_CUDA_TRACE) shows that the split kernel ran: 2C CTAs, pushers
    and reducers with the same chunk counts, stamps in order."""
    dev = setup_device(rank)
    out = []
    set_algo("oneshot")
    if world == 2:
        import pycollectives
        E = pycollectives._C.trace_events()
        x = torch.full(((3 << 20) // 4 + 5,), float(rank), device=dev)
        dist.all_reduce(x)
        assert torch.all(x == 1.0)
        rows = dist.group.WORLD._get_backend(dev).cuda_trace()
        ctas = [rows[c * E:(c + 1) * E] for c in range(len(rows) // E)]
        live = [r for r in ctas if r[0] != 0]
        C = len(live) // 2
        assert C >= 1 and len(live) == 2 * C and all(r[0] != 0 for r in ctas[:2 * C]), len(live)
        claimed = os.environ.get("PYCOLL_CUDA_SPLIT_CLAIMED", "1") == "1"
        for b in range(C):
            push, red = ctas[b], ctas[C + b]
            if not claimed:  # a channel's two CTAs handle its fixed range
                assert push[E - 1] == red[E - 1] >= 1, (b, push[E - 1], red[E - 1])
            for r in (push, red):
                k = min(r[E - 1], (E - 4) // 2)  # stamps beyond the row are not kept
                stamps = [r[0]] + [r[2 + i] for i in range(2 * k)] + [r[1]]
                assert stamps == sorted(stamps) and stamps[-1] - stamps[0] < 10**9, (b, stamps)
        if claimed:  # every chunk pushed once and reduced once (16 KiB chunks)
            nchunks = -(-x.numel() * 4 // (16 << 10))
            assert sum(ctas[b][E - 1] for b in range(C)) == nchunks, [ctas[b][E - 1] for b in range(C)]
            assert sum(ctas[C + b][E - 1] for b in range(C)) == nchunks, [ctas[C + b][E - 1] for b in range(C)]
    for dtype in DTYPES:
        for op in ops_for(dtype)[:4]:
            for numel in (1, 7, 1031, 300007, (1 << 20) + 3):  # in place, as dist.all_reduce always is
                for offset in (0, 1):
                    key = ("ar-split", str(dtype), op_name(op), numel, offset)
                    out.append(_reduce_at_offset(seed, key, rank, world, numel, offset, dtype, op, dev))
    for dtype in (torch.float32, torch.bfloat16):
        numel = (64 << 20) // torch.tensor([], dtype=dtype).element_size() + 5
        out.append(large_sum(seed, ("ar-split-large", str(dtype), numel), rank, world, numel, dtype, dev))
    for i in range(4):
        big = torch.full(((4 << 20) // 4 + 1,), float(rank + i), device=dev)
        set_algo("twoshot" if i % 2 else "oneshot")
        dist.all_reduce(big)
        assert torch.all(big == sum(q + i for q in range(world))), i
        set_algo("oneshot")
        x = torch.full((70001,), float(rank), device=dev)
        dist.all_reduce(x)
        assert torch.all(x == sum(range(world))), i
        _check_broadcast_and_all_gather(rank, world, dev, i, 100000 + i, 5000)
    xs = [torch.zeros(n, device=dev) for n in (3, 200000, (8 << 20) // 4)]
    _check_graph_replays(rank, world, xs)
    set_algo("auto")
    torch.cuda.synchronize()
    return out


@pytest.mark.parametrize("claimed", ["1", "0"])
def test_all_reduce_split_one_shot(seed, claimed):
    env = {"PYCOLL_CUDA_SPLIT_MIN_KIB": "0", "PYCOLL_CUDA_SPLIT_CHUNK_KIB": "16", "PYCOLL_CUDA_LL_MAX_KIB": "0",
           "PYCOLL_CUDA_TRACE": "1", "PYCOLL_CUDA_SPLIT_CLAIMED": claimed}
    assert_same_digests(run_ranks(WORLD, _all_reduce_split, seed, timeout=600, pg_timeout=PG_TIMEOUT, env=env))


def _two_shot_waves(rank, world, seed):
    """Two-shot all_reduce with waves forced on (PYCOLL_CUDA_TWO_SHOT_WAVES=1, every world size)
    and an odd CTA cap (7: three leader/follower pairs and one CTA without a partner), in place,
    every float dtype and op, sizes from 1 element (most CTAs idle) to 5 MiB + 3 elements;
    interleaved with static split one-shot calls (two ranks) that share the wave counters; graph
    replays."""
    dev = setup_device(rank)
    out = []
    if os.environ.get("PYCOLL_CUDA_TRACE") == "1":
        # The waves happen: in every call, each leader CTA b stamps when it posted its wave
        # (event E-2, after issuing its first scatter), and its follower H + b stamps when it saw
        # that post, then takes its first step; neither stamp exists without waves.
        import pycollectives
        E = pycollectives._C.trace_events()
        set_algo("twoshot")
        for i in range(4):
            x = torch.full(((16 << 20) // 4 + 3,), float(rank + i), device=dev)
            dist.all_reduce(x)
            assert torch.all(x == sum(q + i for q in range(world))), i
            rows = dist.group.WORLD._get_backend(dev).cuda_trace()
            ctas = [rows[c * E:(c + 1) * E] for c in range(len(rows) // E)]
            live = sum(1 for r in ctas if r[0] != 0)
            H = live // 2
            assert H >= 1 and all(r[0] != 0 for r in ctas[:live]), live
            for b in range(H):
                lead, follow = ctas[b], ctas[H + b]
                posted, seen = lead[E - 2], follow[E - 2]
                assert lead[2] != 0 and posted >= lead[2], (i, b, lead[2], posted)
                assert seen >= posted > 0 and follow[2] >= seen, (i, b, posted, seen, follow[2])
            assert all(r[E - 2] == 0 for r in ctas[2 * H:]), "a CTA without a partner took part in a wave"
    for i, dtype in enumerate(FLOATS + (torch.int32,)):
        for op in ops_for(dtype)[:3]:
            for numel in (1, 1031, 300007, (5 << 20) // 4 + 3):
                set_algo("twoshot")
                key = ("ar-waves", str(dtype), op_name(op), numel)
                out.append(_reduce_at_offset(seed, key, rank, world, numel, i % 2, dtype, op, dev))
                set_algo("oneshot")  # split on two ranks (PYCOLL_CUDA_SPLIT_MIN_KIB=0)
                x = torch.full((70001,), float(rank + 1), device=dev)
                dist.all_reduce(x)
                assert torch.all(x == sum(q + 1 for q in range(world))), (dtype, numel)
    set_algo("twoshot")
    _check_graph_replays(rank, world, [torch.zeros(n, device=dev) for n in (5, 300007)])
    set_algo("auto")
    torch.cuda.synchronize()
    return out


def test_two_shot_waves(seed):
    env = {"PYCOLL_CUDA_TWO_SHOT_WAVES": "1", "PYCOLL_CUDA_MAX_BLOCKS": "7", "PYCOLL_CUDA_SPLIT_MIN_KIB": "0",
           "PYCOLL_CUDA_SPLIT_CLAIMED": "0", "PYCOLL_CUDA_LL_MAX_KIB": "0", "PYCOLL_CUDA_TRACE": "1",
           "PYCOLL_CUDA_LL128_MAX_KIB": "0"}
    assert_same_digests(run_ranks(WORLD, _two_shot_waves, seed, timeout=600, pg_timeout=PG_TIMEOUT, env=env))


if __name__ == "__main__":  # pragma: no cover - lets the device machine run it without pytest plugins
    run_as_script(globals())
