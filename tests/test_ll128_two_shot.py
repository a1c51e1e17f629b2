"""The LL128 two-shot all_reduce, a protocol registered with the CUDA engine (cuda/kernels/ll128_two_shot.cuh,
cuda/launch_ll128.cu, cuda/ll128_two_shot.cpp): without a GPU its registration, its plans and the
sizes `auto` gives it (docs/decisions/0010, 0012), and its workspace region; on GPUs every dtype and
op at odd offsets and sizes, interleaved with the other protocols, with changing grids and in CUDA
graphs, forced on through its settings.
"""
import pytest
import torch
import torch.distributed as dist

import pycollectives
from gpu_collectives_util import (DTYPES, FLOATS, PG_TIMEOUT, WORLD, R, assert_same_digests,
                                  check_broadcast_and_all_gather, check_graph_replays, large_sum, op_name,
                                  ops_for, reduce_at_offset, run_as_script, setup_device)
from ranks import run_ranks, set_algo

C = pycollectives._C
KiB, MiB = 1 << 10, 1 << 20
H100_SMS = 132
LINE_PAYLOAD = 120


def plan(nbytes, world, algo="auto", es=4):
    return C.cuda_all_reduce_plan(nbytes // es, es, world, algo, H100_SMS)


def lines_for(nbytes, world):
    # cuda/kernels/ll128_layout.h: a segment is ceil(count / n) elements rounded up to 16 bytes.
    return -(-(-(-nbytes // world) + 23) // LINE_PAYLOAD)


def test_registered_once_as_a_two_shot_with_its_own_check_code():
    mine = [p for p in C.cuda_all_reduce_protocols() if p["name"] == "ll128"]
    assert len(mine) == 1
    assert mine[0]["algorithms"] == ["twoshot"] and mine[0]["check_plan"] == "two-shot (LL128 protocol)"
    assert mine[0]["has_region"]
    assert C.cuda_engine_limits(2)["protocols"]["ll128"] == {"max_bytes": 16 * MiB, "max_blocks": 128}
    assert C.cuda_engine_limits(8)["protocols"]["ll128"]["max_bytes"] == 0  # not measured beyond four


@pytest.mark.parametrize("world", [2, 3, 4])
@pytest.mark.parametrize("es", [1, 2, 4, 8])
def test_plans_fit_its_region(world, es):
    lim = C.cuda_engine_limits(world, H100_SMS)["protocols"]["ll128"]
    for nbytes in (es, 3 * es, 120, 121 * es, 64 * 120 * world + 8, 1 * MiB + 8, 4 * MiB, 16 * MiB):
        p = plan(nbytes, world, "twoshot", es)
        count = nbytes // es
        assert p["protocol"] == "ll128" and p["check_plan"] == "two-shot (LL128 protocol)" and p["fits"]
        assert p["seg"] * world >= count and (p["seg"] * es) % 16 == 0
        lines = -(-min(p["seg"], count) * es // LINE_PAYLOAD)
        assert lines <= lines_for(lim["max_bytes"], world)
        assert p["grid"] == max(1, min(lim["max_blocks"], lines // 64))
    assert plan(16 * MiB + 16, world, "twoshot")["protocol"] == "channel"  # above its limit


@pytest.mark.parametrize("nbytes", [4 * MiB, 8 * MiB, 16 * MiB - 16])
def test_two_ranks_run_it_from_4_to_16_mib(nbytes):
    # 4 MiB 18.1 against 24.2 us for one-shot, 8 MiB 33.0 against 38.0 (2x H200, decision 0010).
    assert plan(nbytes, 2)["describe"].startswith("twoshot ll128")
    assert C.cuda_algorithm("all_reduce", nbytes, 2) == "twoshot"


@pytest.mark.parametrize("world", [3, 4])
@pytest.mark.parametrize("nbytes", [512 * KiB, 1 * MiB, 16 * MiB])
def test_three_and_four_ranks_run_it_from_512_kib_to_16_mib(world, nbytes):
    assert plan(nbytes, world)["describe"].startswith("twoshot ll128")  # decision 0012


def test_its_settings_change_the_plan(monkeypatch):
    assert "ll128" not in plan(4 * MiB, 8)["describe"]  # more than four ranks: off unless set
    monkeypatch.setenv("PYCOLL_CUDA_LL128_MAX_KIB", "0")
    assert plan(8 * MiB, 2)["describe"].startswith("oneshot channel")  # the channel two-shot loses there
    assert C.cuda_algorithm("all_reduce", 8 * MiB, 2) == "oneshot"
    monkeypatch.setenv("PYCOLL_CUDA_LL128_MAX_KIB", "4096")
    assert plan(4 * MiB, 8)["describe"].startswith("twoshot ll128")
    monkeypatch.setenv("PYCOLL_CUDA_LL128_BLOCKS", "5")
    assert plan(4 * MiB, 2, "twoshot")["grid"] == 5
    monkeypatch.setenv("PYCOLL_CUDA_LL128_BLOCKS", "129")
    with pytest.raises(ValueError, match="PYCOLL_CUDA_LL128_BLOCKS"):
        plan(4 * MiB, 2)


@pytest.mark.parametrize("nranks,max_bytes", [(2, 64 * MiB), (2, 1), (3, 5 * MiB + 7), (8, 16 * MiB)])
def test_its_region(nranks, max_bytes):
    for rank in {0, nranks - 1}:
        doc = C.cuda_workspace_layout(nranks, rank, protocols={"ll128": max_bytes})
        lines = doc["regions"]["ll128"]["param"]
        # Every segment of a message up to max_bytes fits, for every element size.
        assert lines == lines_for(max_bytes, nranks)
        for es in (1, 2, 4, 8):
            for nbytes in {max_bytes - max_bytes % es, es, min(max_bytes, 8 * es) - min(max_bytes, 8 * es) % es}:
                if nbytes <= 0:
                    continue
                seg = -(-(nbytes // es) // nranks) * es
                seg = -(-seg // 16) * 16
                assert lines * LINE_PAYLOAD >= min(seg, nbytes), (es, nbytes)
        data = doc["ranges"]["ll128.data"]
        assert len(data) == 2 * (nranks - 1) and all(e - b == 128 * lines for b, e in data)
        assert all(b % 128 == 0 for b, _ in data + doc["ranges"]["ll128.header"])
        assert len(doc["ranges"]["ll128.header"]) == (nranks - 1) * 2 * 128
        assert len(doc["ranges"]["ll128.epoch"]) == 128
    plain = C.cuda_workspace_layout(2, 0)
    assert "ll128.data" not in plain["ranges"]
    assert C.cuda_workspace_layout(2, 0, protocols={"ll128": 64 * MiB})["total_bytes"] > plain["total_bytes"] + 64 * MiB


def _all_reduce_ll128(rank, world, seed):
    """The LL128 two-shot (cuda/kernels/ll128_two_shot.cuh; PYCOLL_CUDA_LL128_MAX_KIB, here 64 MiB on
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
                out.append(reduce_at_offset(seed, key, rank, world, numel, offset, dtype, op, dev))
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
        check_broadcast_and_all_gather(rank, world, dev, i, 1000 + i, 3)
    _check_ll128_grid_changes(rank, world, dev)
    set_algo("twoshot")
    check_graph_replays(rank, world, [torch.zeros(n, device=dev) for n in (3, 4099, 300007, (4 << 20) + 1)])
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


@pytest.mark.gpu
@pytest.mark.shares_gpus
@pytest.mark.pycoll_only
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
            out.append(reduce_at_offset(seed, ("ar-ll128-grid", str(dtype), numel), rank, world, numel, 1, dtype,
                                         R.SUM, dev))
    _check_ll128_grid_changes(rank, world, dev)
    set_algo("auto")
    return out


@pytest.mark.gpu
@pytest.mark.shares_gpus
@pytest.mark.pycoll_only
def test_all_reduce_ll128_full_grid(seed):
    env = {"PYCOLL_CUDA_LL128_MAX_KIB": str(64 << 10)}
    assert_same_digests(run_ranks(WORLD, _all_reduce_ll128_grid, seed, timeout=600, pg_timeout=PG_TIMEOUT, env=env))


if __name__ == "__main__":  # pragma: no cover - lets the device machine run it without pytest plugins
    run_as_script(globals())
