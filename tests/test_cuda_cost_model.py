"""The CUDA engine's `auto` choices (csrc/cuda/select.cpp), checked without a GPU against the
crossovers measured on H200 (benchmarks/results/2026-11-26-nvidia-h200-x4-slot256k-np4.json and
2026-11-26-nvidia-h200-x2-pycoll-vs-nccl-np2.json). A change to the model that moves a choice
away from what was measured fails here."""
import pytest

import pycollectives

MiB = 1 << 20
choose = pycollectives._C.cuda_algorithm


@pytest.mark.parametrize("nbytes", [8, 4096, 1 * MiB, 4 * MiB, 8 * MiB, 16 * MiB - 1])
def test_two_ranks_small_all_reduce_is_one_shot(nbytes):
    # One flag hop: 11-18 us against two-shot's 17-21 us (2x H200) up to 4 MiB; 38.4-39.0 against
    # 41.1-41.7 us at 8 MiB.
    assert choose("all_reduce", nbytes, 2) == "oneshot"


@pytest.mark.parametrize("nbytes", [16 * MiB, 32 * MiB, 64 * MiB, 127 * MiB])
def test_two_ranks_mid_all_reduce_is_two_shot(nbytes):
    # Half the bytes per link direction from 16 MiB on: 65.2-66.1 vs 68.0-68.8 us at 16 MiB and 209 vs
    # 229 us at 64 MiB against the fused one-shot; the split one-shot ties with two-shot here
    # (2x H200, select.h).
    assert choose("all_reduce", nbytes, 2) == "twoshot"


@pytest.mark.parametrize("nbytes", [128 * MiB, 256 * MiB, 1024 * MiB])
def test_two_ranks_large_all_reduce_is_split_one_shot(nbytes):
    # "oneshot" runs the split kernel from 32 MiB with two ranks: 2989 vs 3149 us (two-shot) at 1 GiB.
    assert choose("all_reduce", nbytes, 2) == "oneshot"


@pytest.mark.parametrize("world", [3, 4, 8])
def test_many_ranks_large_messages_use_the_ring(world):
    # 4x H200: ring all_reduce 176 vs two-shot 233 us at 32 MiB; reduce_scatter ring from 2 MiB
    # per rank; all_gather ring from 8 MiB per rank (93 vs 98 us), direct below (35 vs 40 us at 2).
    assert choose("all_reduce", 32 * MiB, world) == "ring"
    assert choose("reduce_scatter", 2 * MiB, world) == "ring"
    assert choose("all_gather", 8 * MiB, world) == "ring"
    assert choose("all_gather", 2 * MiB, world) == "oneshot"


def test_two_ranks_gather_and_scatter_stay_direct():
    # One hop moves the same bytes as the ring with two ranks.
    for nbytes in (8, MiB, 512 * MiB):
        assert choose("all_gather", nbytes, 2) == "oneshot"
        assert choose("reduce_scatter", nbytes, 2) == "oneshot"


def test_unknown_op_is_rejected():
    with pytest.raises(ValueError, match="cuda_algorithm"):
        choose("broadcast", 8, 2)
    with pytest.raises((ValueError, RuntimeError), match="unknown op"):
        choose("gossip", 8, 2)


@pytest.mark.parametrize("nbytes", [16 * MiB, 32 * MiB, 64 * MiB])
def test_two_ranks_mid_two_shot_runs_128_ctas(nbytes):
    # 64 leaders and 64 followers: 62.4-63.1 against 64.4-65.8 us at 16 MiB, 112.5-113.0 against
    # 116.9-117.3 at 32 MiB, a tie at 64 MiB (2x H200, select.h: kTwoRankWideTwoShotBlocks).
    wide = pycollectives._C.cuda_two_shot_max_blocks
    assert wide(nbytes, 2, True, 64, 128) == 128
    assert wide(nbytes, 2, False, 64, 128) == 64  # without waves: not measured wide
    assert wide(nbytes, 2, True, 64, 0) == 64     # PYCOLL_CUDA_MAX_BLOCKS set: its cap holds
    assert wide(nbytes, 4, True, 64, 128) == 64   # more ranks: not measured


@pytest.mark.parametrize("nbytes", [64 * MiB + 1, 127 * MiB, 1024 * MiB])
def test_two_ranks_large_two_shot_keeps_64_ctas(nbytes):
    assert pycollectives._C.cuda_two_shot_max_blocks(nbytes, 2, True, 64, 128) == 64
