"""The CPU engine's plan (csrc/cpu/plan.cpp), checked without ranks: the one value from which the
engine runs an op and logs it. These tests pin the decisions at every boundary (the decision records
0022-0025 in docs/decisions/ say why each is where it is), check the plan against the engine's
rules written out as a ladder, and check the settings' help texts that quote the thresholds."""
import itertools

import pytest

import pycollectives

_C = pycollectives._C
plan = _C.cpu_plan

KiB = 1 << 10
MiB = 1 << 20
WS = 16 * MiB  # the default PYCOLL_SHM_BYTES
LARGE_STREAM = 1 << 40  # a stream_min_bytes no test size reaches


def bytes_plan(op, nbytes, **kw):
    """The plan of an op whose whole buffer is `nbytes` of float32 (all_gather, reduce_scatter: all blocks)."""
    ranks = kw.get("ranks", 2)
    per = nbytes // 4 // ranks if op in ("allgather", "reduce_scatter") else nbytes // 4
    kw.setdefault("stream_min_bytes", LARGE_STREAM)
    p = plan(op, per, **kw)
    assert p["bytes"] == (per * 4 * ranks if op in ("allgather", "reduce_scatter") else per * 4)
    return p


# --- the algorithm: the cost table, and what a request resolves to -------------------------------

def test_all_reduce_one_shot_below_about_26_kib_two_shot_above():
    """4 + 4e-4 B = 8 + 2.5e-4 B at B = 26,667 bytes (docs/decisions/0025-cpu-algorithm-cost-table.md)."""
    assert bytes_plan("allreduce", 26664)["algorithm"] == "oneshot"
    assert bytes_plan("allreduce", 26668)["algorithm"] == "twoshot"
    for ranks in (2, 3, 4):
        assert bytes_plan("allreduce", 16 * KiB, ranks=ranks)["algorithm"] == "oneshot"
        assert bytes_plan("allreduce", 64 * KiB, ranks=ranks)["algorithm"] == "twoshot"


@pytest.mark.parametrize("op,algo", [("allgather", "oneshot"), ("reduce_scatter", "twoshot"),
                                     ("broadcast", "oneshot"), ("reduce", "oneshot")])
def test_other_ops_run_their_direct_form_at_every_size(op, algo):
    for nbytes in (0, 4 * KiB, 1 * MiB, 64 * MiB, 1 << 30):
        assert bytes_plan(op, nbytes, ranks=4)["algorithm"] == algo


def test_one_rank_runs_one_shot_whatever_is_asked():
    for op, algo in itertools.product(("allreduce", "allgather", "reduce_scatter", "broadcast", "reduce"),
                                      ("auto", "oneshot", "twoshot", "ring", "tree")):
        p = bytes_plan(op, 1 * MiB, ranks=1, algo=algo, threads=4, memory="shared everywhere", peer_read="on")
        assert p["algorithm"] == "oneshot" and p["path"] in ("eager", "direct") and p["lanes"] == 0, (op, algo, p)


@pytest.mark.parametrize("op,asked,runs", [
    ("allreduce", "oneshot", "oneshot"), ("allreduce", "twoshot", "twoshot"), ("allreduce", "ring", "ring"),
    ("allreduce", "tree", "tree"),
    ("allgather", "oneshot", "oneshot"), ("allgather", "twoshot", "oneshot"), ("allgather", "ring", "ring"),
    ("allgather", "tree", "oneshot"),
    ("reduce_scatter", "oneshot", "twoshot"), ("reduce_scatter", "twoshot", "twoshot"),
    ("reduce_scatter", "ring", "ring"), ("reduce_scatter", "tree", "twoshot"),
    ("broadcast", "twoshot", "oneshot"), ("broadcast", "tree", "tree"), ("broadcast", "ring", "oneshot"),
    ("reduce", "twoshot", "oneshot"), ("reduce", "tree", "tree"), ("reduce", "ring", "oneshot"),
    ("allreduce", "hierarchical", "oneshot"), ("allreduce", "flat", "oneshot"),  # forms across hosts: the table's
])
def test_requests_resolve(op, asked, runs):
    assert bytes_plan(op, 8 * KiB, ranks=3, algo=asked)["algorithm"] == runs


def test_the_cost_table_override_changes_auto():
    """pycoll-bench --calibrate writes through set_cost_entry (pycollectives/config.py); the plan reads it."""
    before = {(op, algo): (a, b) for op, algo, a, b in _C.cost_entries()}
    assert before[("allreduce", "oneshot")] == (4.0, 4.0e-4) and before[("allreduce", "twoshot")] == (8.0, 2.5e-4)
    try:
        _C.set_cost_entry("all_reduce", "twoshot", 1.0, 1.0e-6)
        assert bytes_plan("allreduce", 64, ranks=2)["algorithm"] == "twoshot"
        assert _C.select_algorithm("all_reduce", 64, 2) == "twoshot"
    finally:
        _C.set_cost_entry("all_reduce", "twoshot", *before[("allreduce", "twoshot")])
    assert bytes_plan("allreduce", 64, ranks=2)["algorithm"] == "oneshot"
    assert {(op, algo): (a, b) for op, algo, a, b in _C.cost_entries()} == before


# --- the data path ------------------------------------------------------------------------------

def test_one_shot_all_reduce_is_eager_up_to_half_the_data_region():
    half = WS // 2
    assert bytes_plan("allreduce", half, algo="oneshot", workspace_bytes=WS)["path"] == "eager"
    assert bytes_plan("allreduce", half + 4, algo="oneshot", workspace_bytes=WS)["path"] == "direct"
    # Half an odd region is rounded down to a cache line.
    assert bytes_plan("allreduce", 1024, algo="oneshot", workspace_bytes=2 * 1024 + 126)["path"] == "eager"
    assert bytes_plan("allreduce", 1028, algo="oneshot", workspace_bytes=2 * 1024 + 126)["path"] == "direct"
    assert bytes_plan("allreduce", 4, workspace_bytes=WS)["describe"] == "eager oneshot"


@pytest.mark.parametrize("op", ["broadcast", "allgather", "reduce_scatter"])
@pytest.mark.parametrize("ranks", [2, 3, 4])
def test_pipelined_from_256_kib(op, ranks):
    """docs/decisions/0024-cpu-pipelined-from-256-kib.md: the op's whole buffer, all blocks counted."""
    unit = 4 * ranks  # all_gather and reduce_scatter sizes are a multiple of the ranks' blocks
    below, at = (256 * KiB - unit) // unit * unit, 256 * KiB
    if at % unit:
        at += unit - at % unit
    assert bytes_plan(op, below, ranks=ranks, threads=7)["path"] == "direct"
    p = bytes_plan(op, at, ranks=ranks, threads=7)
    # Several lanes from 256 KiB over 2 ranks (a lane per 128 KiB), from 1 MiB over more (per 512 KiB).
    assert p["path"] == "pipelined" and p["lanes"] == (2 if ranks == 2 else 1)


def test_two_shot_all_reduce_is_pipelined_at_every_size():
    for nbytes in (32 * KiB, 128 * KiB, 256 * KiB - 4):
        p = bytes_plan("allreduce", nbytes, threads=7, memory="shared everywhere")
        assert p["algorithm"] == "twoshot" and p["path"] == "pipelined" and p["lanes"] == 1, p
    # Mapped in place only from 256 KiB, as the other ops.
    assert bytes_plan("allreduce", 256 * KiB, memory="shared")["path"] == "mapped in place"
    assert bytes_plan("allreduce", 256 * KiB - 4, memory="shared")["path"] == "pipelined"


@pytest.mark.parametrize("ranks,threads,nbytes,lanes", [
    (2, 7, 256 * KiB, 2), (2, 7, 512 * KiB, 4), (2, 7, 1 * MiB - 4, 7),
    (2, 7, 1 * MiB, 7), (2, 4, 1 * MiB, 4), (2, 3, 256 * KiB * 4, 3), (3, 7, 1 * MiB - 12, 1),
    (2, 8, 1 * MiB, 8), (2, 1, 64 * MiB, 1), (3, 7, 1 * MiB + 12, 2), (3, 7, 3 * MiB, 6), (3, 7, 4 * MiB, 7),
    (4, 3, 1 * MiB, 2), (4, 3, 64 * MiB, 3), (4, 4, 2 * MiB, 4),
])
def test_lanes(ranks, threads, nbytes, lanes):
    """pipeline_lanes (csrc/cpu/pipelined.cpp): one lane below 256 KiB (PYCOLL_CPU_LANES_MIN_OP_BYTES),
    then a lane per 128 KiB (2 ranks) or 512 KiB (more), at most the fewest threads any rank offers."""
    for op in ("allreduce", "broadcast"):
        assert bytes_plan(op, nbytes, ranks=ranks, threads=threads)["lanes"] == lanes, op


def test_shared_tensors_are_mapped_in_place_where_every_read_buffer_is_shared():
    for op in ("allreduce", "broadcast", "allgather", "reduce_scatter"):
        for memory in ("shared", "shared everywhere"):
            assert bytes_plan(op, 1 * MiB, threads=4, memory=memory)["path"] == "mapped in place", (op, memory)
        assert bytes_plan(op, 1 * MiB, threads=4, memory="private")["path"] == "pipelined", op
    assert bytes_plan("reduce", 1 * MiB, memory="shared everywhere")["path"] == "direct"


def test_one_lane_all_gather_and_broadcast_stage_large_shared_tensors():
    """docs/decisions/0023-cpu-shared-tensor-staging-thresholds.md: with one lane an all_gather from
    16 MiB and a broadcast from 64 MiB stage; with two lanes, or for the other ops, never."""
    for op, limit in (("allgather", 16 * MiB), ("broadcast", 64 * MiB)):
        assert bytes_plan(op, limit - 64, threads=1, memory="shared")["path"] == "mapped in place"
        assert bytes_plan(op, limit, threads=1, memory="shared")["path"] == "pipelined"
        assert bytes_plan(op, limit, threads=2, memory="shared")["path"] == "mapped in place"
        # Not mapped, it may still read the buffers in place where PYCOLL_CPU_PEER_READ says so.
        assert bytes_plan(op, limit, threads=1, memory="shared", peer_read="on",
                          probe="allowed")["path"] == "read in place"
    for op in ("allreduce", "reduce_scatter"):
        assert bytes_plan(op, 256 * MiB, threads=1, memory="shared")["path"] == "mapped in place"


def test_broadcast_root_writes_up_to_two_lanes_where_every_buffer_is_shared():
    for threads, writes in ((1, True), (2, True), (3, False), (4, False), (7, False)):
        p = bytes_plan("broadcast", 4 * MiB, threads=threads, memory="shared everywhere")
        assert p["path"] == "mapped in place" and p["root_writes"] == writes, (threads, p)
        assert ("root-writes" in p["describe"]) == writes
        p = bytes_plan("broadcast", 4 * MiB, threads=threads, memory="shared")
        assert p["path"] == "mapped in place" and not p["root_writes"]
    # Lanes, not threads: a message too small for a third lane keeps the root writing.
    assert bytes_plan("broadcast", 384 * KiB - 4, threads=7, memory="shared everywhere")["root_writes"]
    assert not bytes_plan("broadcast", 384 * KiB, threads=7, memory="shared everywhere")["root_writes"]
    for op in ("allreduce", "allgather", "reduce_scatter"):
        assert not bytes_plan(op, 4 * MiB, threads=1, memory="shared everywhere")["root_writes"]


def _read(op, nbytes, ranks, threads, mode="auto", probe="allowed"):
    return bytes_plan(op, nbytes, ranks=ranks, threads=threads, peer_read=mode, probe=probe)["path"]


@pytest.mark.parametrize("ranks", [2, 3, 4])
def test_auto_reads_large_all_gathers_in_place_from_64_mib_with_4_threads(ranks):
    """docs/decisions/0022-cpu-peer-read-rule.md."""
    at = 64 * MiB + (-(64 * MiB) % (4 * ranks))
    below = at - 4 * ranks
    assert _read("allgather", at, ranks, 4) == "read in place"
    assert _read("allgather", below, ranks, 7) == "pipelined"
    assert _read("allgather", at, ranks, 3) == "pipelined"


@pytest.mark.parametrize("ranks,at,threads", [(2, 16 * MiB, 4), (3, 6 * MiB, 4), (4, 6 * MiB, 3)])
def test_auto_reads_large_reduce_scatters_in_place(ranks, at, threads):
    """16 MiB over 2 ranks, 6 MiB over 3 or more; 4 threads, 3 over 4 ranks or more."""
    at += -at % (4 * ranks)
    below = at - 4 * ranks
    assert _read("reduce_scatter", at, ranks, threads) == "read in place"
    assert _read("reduce_scatter", below, ranks, 7) == "pipelined"
    assert _read("reduce_scatter", at, ranks, threads - 1) == "pipelined"


def test_auto_never_reads_broadcasts_or_all_reduces_in_place_on_does_from_256_kib():
    for ranks, threads in ((2, 7), (4, 3)):
        assert _read("broadcast", 256 * MiB, ranks, threads) == "pipelined"
        assert _read("allreduce", 256 * MiB, ranks, threads, mode="on") == "pipelined"
        for op in ("broadcast", "allgather", "reduce_scatter"):
            assert _read(op, 256 * KiB, ranks, 1, mode="on") == "read in place", op
            assert _read(op, 256 * KiB - 4 * ranks, ranks, 1, mode="on") == "direct", op
            assert _read(op, 256 * MiB, ranks, threads, mode="off") == "pipelined", op


def test_the_probe_comes_first_and_a_denial_stages():
    p = bytes_plan("allgather", 1 * MiB, threads=2, peer_read="on", probe="not yet")
    assert p["path"] == "read in place" and p["probe_first"] and p["describe"].endswith(" probe-first")
    p = bytes_plan("allgather", 1 * MiB, threads=2, peer_read="on", probe="allowed")
    assert p["path"] == "read in place" and not p["probe_first"]
    assert bytes_plan("allgather", 1 * MiB, threads=2, peer_read="on", probe="denied")["path"] == "pipelined"
    # Nothing to probe where the rule says stage.
    assert not bytes_plan("allgather", 1 * MiB, threads=2, peer_read="auto", probe="not yet")["probe_first"]


def test_shared_tensors_come_before_reading_in_place():
    p = bytes_plan("reduce_scatter", 64 * MiB, threads=7, memory="shared", peer_read="on", probe="allowed")
    assert p["path"] == "mapped in place" and not p["probe_first"]


def test_ring_and_tree_run_their_own_schedules():
    for op, algo in (("allreduce", "ring"), ("allreduce", "tree"), ("allgather", "ring"), ("reduce_scatter", "ring"),
                     ("broadcast", "tree"), ("reduce", "tree")):
        p = bytes_plan(op, 64 * MiB, ranks=3, algo=algo, threads=7, memory="shared everywhere", peer_read="on",
                       probe="allowed")
        assert p["algorithm"] == algo and p["path"] == "direct" and p["lanes"] == 0
        assert p["describe"] == ("pipelined_binary_tree" if algo == "tree" else "ring")


def test_all_gathers_stream_their_output_from_the_threshold():
    for path_kw in ({}, {"memory": "shared"}, {"peer_read": "on", "probe": "allowed"}):
        assert not plan("allgather", 2 * MiB // 4, ranks=2, stream_min_bytes=4 * MiB + 4, **path_kw)["stream_out"]
        p = plan("allgather", 2 * MiB // 4, ranks=2, stream_min_bytes=4 * MiB, **path_kw)
        assert p["stream_out"] and p["describe"].endswith(" streamed"), path_kw
    for op in ("allreduce", "broadcast", "reduce_scatter"):
        assert not bytes_plan(op, 64 * MiB, stream_min_bytes=1)["stream_out"], op
    assert not bytes_plan("allgather", 128 * KiB, stream_min_bytes=1)["stream_out"]  # direct


def test_describe_starts_with_the_path_as_the_log_names_it():
    """The debug log's `plan=` field; tests of the engine read the path and `lanes=` from it."""
    assert bytes_plan("allreduce", 4 * MiB, threads=3, memory="shared")["describe"] == "mapped in place lanes=3 twoshot"
    assert bytes_plan("reduce_scatter", 4 * MiB, threads=2)["describe"] == "pipelined lanes=2 twoshot"
    assert bytes_plan("allgather", 64 * MiB, threads=4, peer_read="auto", probe="allowed")["describe"] == \
        "read in place lanes=4 oneshot"
    assert bytes_plan("broadcast", 4 * KiB)["describe"] == "direct oneshot"
    assert bytes_plan("allreduce", 64 * MiB, algo="oneshot")["describe"] == "direct oneshot"


def test_unplanned_ops_and_bad_arguments_raise():
    for bad in (dict(op="gather"), dict(op="allreduce", dtype="float99"), dict(op="allreduce", memory="mapped"),
                dict(op="allreduce", peer_read="yes"), dict(op="allreduce", probe="maybe"),
                dict(op="allreduce", algo="fastest"), dict(op="allreduce", ranks=0)):
        kw = dict(count=16, **bad)
        with pytest.raises(ValueError):
            plan(kw.pop("op"), kw.pop("count"), **kw)


def test_bytes_follow_the_dtype():
    assert plan("allreduce", 10, dtype="float16")["bytes"] == 20
    assert plan("allgather", 10, dtype="float64", ranks=3)["bytes"] == 240
    assert plan("reduce_scatter", 10, dtype="int8", ranks=4)["bytes"] == 40


def test_ranks_that_may_ever_read_in_place_name_a_tracer():
    ever = _C.cpu_may_ever_read_in_place
    assert not ever("off", 4, 16) and not ever("on", 1, 16) and ever("on", 2, 1)
    assert ever("auto", 2, 4) and not ever("auto", 2, 3) and not ever("auto", 3, 3)
    assert ever("auto", 4, 3) and not ever("auto", 4, 2)


# --- the plan against the engine's rules written out as one ladder --------------------------------

def _lanes(nbytes, ranks, threads):
    if nbytes < 256 * KiB:
        return 1
    return min(max(nbytes // ((128 if ranks <= 2 else 512) * KiB), 1), max(1, threads))


def _auto_reads(op, nbytes, ranks, threads):
    if op == "allgather":
        return nbytes >= 64 * MiB and threads >= 4
    if op == "reduce_scatter":
        return nbytes >= (16 if ranks <= 2 else 6) * MiB and threads >= (3 if ranks >= 4 else 4)
    return False


def _ladder(op, nbytes, ranks, threads, memory, mode, probe, algo):
    """(path, lanes, root_writes, probe_first) as the engine decides for an auto op."""
    big = ranks > 1 and nbytes >= 256 * KiB
    lanes = _lanes(nbytes, ranks, threads)
    if op == "allreduce":
        if algo == "oneshot":
            return ("eager" if nbytes <= WS // 2 else "direct"), 0, False, False
        return ("mapped in place" if big and memory != "private" else "pipelined"), lanes, False, False
    if op == "reduce" or not big:
        return "direct", 0, False, False
    worth = lanes > 1 or (op == "allgather" and nbytes < 16 * MiB) or (op == "broadcast" and nbytes < 64 * MiB) \
        or op == "reduce_scatter"
    if memory != "private" and worth:
        return "mapped in place", lanes, op == "broadcast" and memory == "shared everywhere" and lanes <= 2, False
    reads = mode != "off" and probe != "denied" and (mode == "on" or _auto_reads(op, nbytes, ranks, threads))
    if reads:
        return "read in place", lanes, False, probe == "not yet"
    return "pipelined", lanes, False, False


SIZES = sorted({4, 26664, 26668, 256 * KiB - 48, 256 * KiB, 1 * MiB - 48, 1 * MiB, 6 * MiB - 48, 6 * MiB,
                16 * MiB - 48, 16 * MiB, 64 * MiB - 48, 64 * MiB, 256 * MiB})


@pytest.mark.parametrize("op", ["allreduce", "reduce", "broadcast", "allgather", "reduce_scatter"])
def test_the_plan_is_the_engines_ladder_everywhere(op):
    checked = 0
    for ranks, threads, nbytes, memory, mode, probe in itertools.product(
            (1, 2, 3, 4), (1, 3, 4, 7), SIZES, ("private", "shared", "shared everywhere"), ("off", "auto", "on"),
            ("not yet", "allowed", "denied")):
        if op in ("allgather", "reduce_scatter"):
            nbytes -= nbytes % (4 * ranks)
        p = bytes_plan(op, nbytes, ranks=ranks, threads=threads, memory=memory, peer_read=mode, probe=probe,
                       workspace_bytes=WS)
        want = _ladder(op, nbytes, ranks, threads, memory, mode, probe, p["algorithm"])
        got = (p["path"], p["lanes"], p["root_writes"], p["probe_first"])
        assert got == want, (op, ranks, threads, nbytes, memory, mode, probe, p)
        checked += 1
    assert checked == 4 * 4 * len(SIZES) * 3 * 3 * 3


# --- the settings' help texts quote the plan's thresholds -------------------------------------------

def _doc(name):
    return next(s["doc"] for s in _C.settings() if s["name"] == name)


def test_the_peer_read_help_quotes_the_rule():
    doc = _doc("PYCOLL_CPU_PEER_READ")
    assert ("auto reads in place, when every rank has at least 4 threads (PYCOLL_CPU_THREADS), an all_gather of "
            "64 MiB or more and a reduce_scatter of 16 MiB or more over 2 ranks, 6 MiB or more over 3 or more "
            "(over 4 or more, 3 threads are enough for a reduce_scatter)") in doc
    # What it says is what the plan does.
    assert _read("allgather", 64 * MiB, 2, 4) == "read in place" and _read("allgather", 64 * MiB, 2, 3) != "read in place"
    assert _read("reduce_scatter", 16 * MiB, 2, 4) == "read in place"
    assert _read("reduce_scatter", 6 * MiB, 3, 4) == "read in place"
    assert _read("reduce_scatter", 6 * MiB, 4, 3) == "read in place"


def test_the_shared_tensors_help_quotes_the_staging_sizes():
    doc = _doc("PYCOLL_CPU_SHARED_TENSORS")
    assert ("with one thread per rank an all_gather of 16 MiB or more and a broadcast of 64 MiB or more still "
            "stage") in doc
    assert bytes_plan("allgather", 16 * MiB, threads=1, memory="shared")["path"] == "pipelined"
    assert bytes_plan("broadcast", 64 * MiB, threads=1, memory="shared")["path"] == "pipelined"
