"""The CUDA engine's all_reduce plan (csrc/cuda/all_reduce_plan.cpp), checked without a GPU: the
one value from which the engine launches, writes the check word and logs. These tests pin the
invariants every launch relies on (grid within the workspace and the SMs, chunks that cover the
message at 16-byte boundaries) and the measured decisions (docs/decisions/) per size."""
import itertools

import pytest

import pycollectives

MiB = 1 << 20
KiB = 1 << 10
plan = pycollectives._C.cuda_all_reduce_plan
limits = pycollectives._C.cuda_engine_limits
H100_SMS = 132
PROTOCOLS = {p["name"]: p for p in pycollectives._C.cuda_all_reduce_protocols()}

SIZES = sorted({1, 3, 4096 - 4, 16 * KiB, 16 * KiB + 4, 1 * MiB, 1 * MiB + 4, 2 * MiB, 4 * MiB, 8 * MiB + 12,
                16 * MiB, 33 * MiB + 4, 64 * MiB, 96 * MiB, 128 * MiB, 256 * MiB + 8})


def ceil_div(a, b):
    return -(-a // b)


def check_invariants(p, count, es, world, lim):
    """What the engine's launch of plan `p` needs, whatever the size (cuda_engine.cu, cuda/kernels/args.h)."""
    nbytes = count * es
    pack = max(1, 16 // es)
    assert p["algorithm"] in ("oneshot", "twoshot", "ring", "tree")
    assert p["algorithm"] in p["describe"] or (p["algorithm"] == "tree" and "double_binary_tree" in p["describe"])
    assert p["protocol"] in p["describe"]
    assert p["protocol"] in PROTOCOLS and p["algorithm"] in PROTOCOLS[p["protocol"]]["algorithms"]
    assert p["fits"]  # what the engine checks before it launches: the plan inside the workspace
    mine = lim["protocols"][p["protocol"]]
    assert 0 < nbytes <= mine["max_bytes"]
    if p["protocol"] == "ll":
        assert p["algorithm"] == "oneshot" and p["check_plan"].startswith("one-shot")
        assert p["grid"] == ceil_div(nbytes, 16 * KiB) and 1 <= p["grid"] <= 64
        return
    if p["protocol"] != "channel":  # a protocol with a check code of its own (cuda/all_reduce_registry.h)
        r = PROTOCOLS[p["protocol"]]
        assert p["check_plan"] == r["check_plan"] and 1 <= p["grid"] <= mine["max_blocks"]
        return
    assert p["protocol"] == "channel"
    if p["variant"].startswith("split"):
        assert world == 2 and p["algorithm"] == "oneshot" and nbytes >= lim["split_min_bytes"]
        assert p["grid"] % 2 == 0 and 2 <= p["grid"] <= H100_SMS
        assert p["grid"] // 2 <= min(lim["max_blocks"], H100_SMS // 2) and not p["early_ok"]
        if p["variant"] == "split-claimed":
            assert p["nchunks"] == ceil_div(count, p["chunk"]) and p["chunk"] * es == lim["claimed_chunk_bytes"]
        else:
            assert p["seg"] * (p["grid"] // 2) >= count and (p["seg"] * es) % 16 == 0
            assert p["chunk"] * es <= lim["split_chunk_bytes"] and (p["chunk"] * es) % 32 == 0
        return
    assert 1 <= p["grid"] <= lim["workspace_blocks"] and p["grid"] <= H100_SMS
    assert p["chunk"] % pack == 0 and p["chunk"] * es <= lim["slot_bytes"]
    covered = p["seg"] if p["algorithm"] in ("twoshot", "ring") else count
    if p["algorithm"] in ("twoshot", "ring"):
        assert p["seg"] * world >= count and (p["seg"] * es) % 16 == 0
    assert p["nchunks"] == ceil_div(covered, p["chunk"]) and p["grid"] <= p["nchunks"]
    if p["grid"] > lim["max_blocks"]:
        assert p["variant"] == "wide-waves" and p["grid"] <= lim["two_shot_wide_blocks"]


@pytest.mark.parametrize("world", [2, 3, 4, 8])
@pytest.mark.parametrize("es", [1, 2, 4, 8])
def test_every_plan_fits_the_workspace(world, es):
    lim = limits(world, H100_SMS)
    for nbytes, algo in itertools.product(SIZES, ["auto", "oneshot", "twoshot", "ring", "tree"]):
        count = max(1, nbytes // es)
        p = plan(count, es, world, algo, H100_SMS)
        if algo != "auto":
            assert p["algorithm"] == algo
        check_invariants(p, count, es, world, lim)


@pytest.mark.parametrize("world", [2, 3, 4, 8])
def test_auto_plans_the_cost_models_choice(world):
    for nbytes in SIZES:
        count = max(1, nbytes // 4)
        assert plan(count, 4, world)["algorithm"] == pycollectives._C.cuda_algorithm("all_reduce", count * 4, world)


@pytest.mark.parametrize("nbytes,expected", [
    (8, "oneshot ll"),                       # docs/decisions/0001: LL up to 1 MiB
    (1 * MiB, "oneshot ll"),
    (2 * MiB, "oneshot channel"),
    (32 * MiB, "twoshot channel wide-waves"),  # 0006 + 0009: channel two-shot, 128 CTAs in waves
    (96 * MiB, "twoshot channel waves"),
    (256 * MiB, "oneshot channel split-claimed"),  # 0004 + 0008
])
def test_two_rank_plans_follow_the_measured_decisions(nbytes, expected):
    assert plan(nbytes // 4, 4, 2)["describe"].startswith(expected)


@pytest.mark.parametrize("world", [3, 4])
@pytest.mark.parametrize("nbytes,expected", [
    (256 * KiB, "oneshot ll"),                 # 0001: LL one-shot below 512 KiB
    (512 * KiB, "twoshot "),                   # 0012: two-shot 512 KiB-16 MiB on 3 and 4 ranks
    (1 * MiB, "twoshot "),                     # (the LL128 two-shot: tests/test_ll128_two_shot.py)
    (16 * MiB, "twoshot "),
    (16 * MiB + 16, "ring channel"),           # 0012: the ring above 16 MiB
    (64 * MiB, "ring channel"),
])
def test_three_and_four_rank_plans_follow_the_measured_decisions(world, nbytes, expected):
    assert plan(nbytes // 4, 4, world)["describe"].startswith(expected)


def test_more_than_four_ranks_run_ring_from_16_mib():
    # Not measured beyond four ranks: the cost model and the ring from 16 MiB (decision 0003).
    assert plan(16 * MiB // 4, 4, 8)["describe"].startswith("ring channel")


def test_two_rank_wide_two_shot_uses_128_ctas():
    assert plan(32 * MiB // 4, 4, 2)["grid"] == 128


def test_settings_change_the_plan(monkeypatch):
    monkeypatch.setenv("PYCOLL_CUDA_SPLIT_CLAIMED", "0")
    assert plan(256 * MiB // 4, 4, 2)["describe"].startswith("oneshot channel split ")
    monkeypatch.setenv("PYCOLL_CUDA_LL_MAX_KIB", "0")
    assert plan(1024, 4, 2)["protocol"] == "channel"
    monkeypatch.setenv("PYCOLL_CUDA_MAX_BLOCKS", "8")
    p = plan(64 * MiB // 4, 4, 4, "ring")
    assert p["grid"] == 8 and limits(4, H100_SMS)["max_blocks"] == 8


def test_more_ranks_run_ring_for_large_messages():
    # docs/decisions/0003-ring-crossovers-beyond-two-ranks.md
    assert plan(64 * MiB // 4, 4, 4)["describe"].startswith("ring channel")
    assert plan(64 * MiB // 4, 4, 4)["check_plan"] == "ring"


def test_tree_is_named_the_double_binary_tree():
    p = plan(4096, 4, 4, "tree")
    assert p["algorithm"] == "tree" and p["describe"].startswith("double_binary_tree channel")


def test_nothing_to_launch():
    assert plan(0, 4, 4)["protocol"] == "none" and plan(0, 4, 4)["grid"] == 0
    assert plan(1000, 4, 1)["protocol"] == "none"


def test_bad_requests_name_the_problem(monkeypatch):
    with pytest.raises(ValueError, match="no all_reduce algorithm 'hierarchical'"):
        plan(1024, 4, 2, "hierarchical")
    with pytest.raises(ValueError, match="elem_bytes"):
        plan(1024, 3, 2)
    monkeypatch.setenv("PYCOLL_CUDA_MAX_BLOCKS", "999")
    with pytest.raises(ValueError, match="PYCOLL_CUDA_MAX_BLOCKS"):
        plan(1024, 4, 2)


def test_every_all_reduce_runs_through_the_protocol_registry():
    # The registry (cuda/all_reduce_registry.h) holds every protocol the plan can pick, in the
    # order it tries them: LL128 (two-shot up to its limit), LL (one-shot up to 1 MiB), then the
    # channel protocol, which runs every schedule at any size.
    names = [p["name"] for p in pycollectives._C.cuda_all_reduce_protocols()]
    assert names == ["ll128", "ll", "channel"]
    assert PROTOCOLS["channel"]["algorithms"] == ["oneshot", "twoshot", "ring", "tree"]
    assert PROTOCOLS["ll"]["algorithms"] == ["oneshot"]
    assert not PROTOCOLS["ll"]["has_region"] and not PROTOCOLS["channel"]["has_region"]
    lim = limits(2, H100_SMS)["protocols"]
    assert lim["ll"]["max_bytes"] == MiB and lim["channel"]["max_bytes"] >= 1 << 62
    seen = {plan(count, 4, world, algo)["protocol"] for count in (1, 1024, 64 * KiB, 4 * MiB, 64 * MiB)
            for world in (2, 4, 8) for algo in ("oneshot", "twoshot", "ring", "tree")}
    assert seen == set(names)
    # A protocol without a region of its own takes no workspace.
    assert pycollectives._C.cuda_workspace_layout(2, 0, protocols={"ll": MiB, "channel": MiB})["regions"] == {}
