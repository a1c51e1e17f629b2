"""The CUDA engine's built-in all_reduce protocols, each forced on through its settings: LL
(one-shot), the split one-shot, and two-shot waves; each interleaved with other protocols and
replayed in CUDA graphs. (The registered LL128 two-shot: tests/test_ll128_two_shot.py.)
"""
import os

import pytest
import torch
import torch.distributed as dist

from gpu_collectives_util import (DTYPES, FLOATS, GPU_MARKS, PG_TIMEOUT, WORLD, assert_same_digests,
                                  check_broadcast_and_all_gather, check_graph_replays, large_sum, op_name,
                                  ops_for, reduce_at_offset, run_as_script, setup_device)
from ranks import run_ranks, set_algo

pytestmark = GPU_MARKS


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
                    out.append(reduce_at_offset(seed, key, rank, world, numel, offset, dtype, op, dev))
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
        check_broadcast_and_all_gather(rank, world, dev, i, 1000 + i, 3)
    # Graph replays: several LL sizes and a channel-protocol call in one graph.
    xs = [torch.zeros(n, device=dev) for n in (3, 4099, 200000)]
    big = torch.zeros((4 << 20) // 4, device=dev)
    check_graph_replays(rank, world, xs + [big])
    set_algo("auto")
    torch.cuda.synchronize()
    return out


def test_all_reduce_ll_protocol(seed):
    assert_same_digests(run_ranks(WORLD, _all_reduce_ll, seed, timeout=600, pg_timeout=PG_TIMEOUT,
                                   env={"PYCOLL_CUDA_LL_MAX_KIB": "1024"}))


def _all_reduce_split(rank, world, seed):
    """The split one-shot (pushing and reducing CTAs apart, cuda/kernels/one_shot.cuh; two ranks only),
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
                    out.append(reduce_at_offset(seed, key, rank, world, numel, offset, dtype, op, dev))
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
        check_broadcast_and_all_gather(rank, world, dev, i, 100000 + i, 5000)
    xs = [torch.zeros(n, device=dev) for n in (3, 200000, (8 << 20) // 4)]
    check_graph_replays(rank, world, xs)
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
                out.append(reduce_at_offset(seed, key, rank, world, numel, i % 2, dtype, op, dev))
                set_algo("oneshot")  # split on two ranks (PYCOLL_CUDA_SPLIT_MIN_KIB=0)
                x = torch.full((70001,), float(rank + 1), device=dev)
                dist.all_reduce(x)
                assert torch.all(x == sum(q + 1 for q in range(world))), (dtype, numel)
    set_algo("twoshot")
    check_graph_replays(rank, world, [torch.zeros(n, device=dev) for n in (5, 300007)])
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
