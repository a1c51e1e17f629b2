"""The CUDA engine's `auto` choices (csrc/cuda/select.cpp), checked without a GPU against the
crossovers measured on H200 (docs/decisions/). A change to the model that moves a choice away
from what was measured fails here."""
import os

import pytest

import pycollectives

MiB = 1 << 20
choose = pycollectives._C.cuda_algorithm


@pytest.mark.parametrize("nbytes", [8, 4096, 1 * MiB, 2 * MiB, 4 * MiB - 1])
def test_two_ranks_small_all_reduce_is_one_shot(nbytes):
    # One flag hop (the LL protocol up to 1 MiB): 11-18 us, host-bound, up to 2 MiB (2x H200).
    assert choose("all_reduce", nbytes, 2) == "oneshot"


def test_two_ranks_medium_all_reduce_follows_the_registered_two_shot():
    # Two ranks, 4-16 MiB: two-shot where a registered two-shot protocol (the LL128 two-shot,
    # tests/test_ll128_two_shot.py) runs the size, else one-shot: the channel two-shot lost to
    # one-shot below 16 MiB (29.2 / 39.9 against 24.2 / 38.0 us at 4 / 8 MiB, decision 0010).
    for nbytes in (4 * MiB, 8 * MiB, 16 * MiB - 1):
        assert choose("all_reduce", nbytes, 2, fast_two_shot_max_bytes=0) == "oneshot"
        assert choose("all_reduce", nbytes, 2, fast_two_shot_max_bytes=16 * MiB) == "twoshot"
    assert choose("all_reduce", 8 * MiB, 2, fast_two_shot_max_bytes=4 * MiB) == "oneshot"
    assert choose("all_reduce", 4 * MiB, 2, fast_two_shot_max_bytes=4 * MiB) == "twoshot"
    assert choose("all_reduce", 16 * MiB, 2, fast_two_shot_max_bytes=0) == "twoshot"
    assert choose("all_reduce", 64 * MiB, 4, fast_two_shot_max_bytes=0) == choose("all_reduce", 64 * MiB, 4)


@pytest.mark.parametrize("nbytes", [16 * MiB, 32 * MiB, 64 * MiB, 127 * MiB])
def test_two_ranks_mid_all_reduce_is_two_shot(nbytes):
    # Half the bytes per link direction from 16 MiB on: 65.2-66.1 vs 68.0-68.8 us at 16 MiB and 209 vs
    # 229 us at 64 MiB against the fused one-shot; the split one-shot ties with two-shot here
    # (2x H200, docs/decisions/0006-two-shot-from-16-mib.md).
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
    # 116.9-117.3 at 32 MiB, a tie at 64 MiB (2x H200, docs/decisions/0009-two-shot-waves.md).
    wide = pycollectives._C.cuda_two_shot_max_blocks
    assert wide(nbytes, 2, True, 64, 128) == 128
    assert wide(nbytes, 2, False, 64, 128) == 64  # without waves: not measured wide
    assert wide(nbytes, 2, True, 64, 0) == 64     # PYCOLL_CUDA_MAX_BLOCKS set: its cap holds
    assert wide(nbytes, 4, True, 64, 128) == 64   # more ranks: not measured


@pytest.mark.parametrize("nbytes", [64 * MiB + 1, 127 * MiB, 1024 * MiB])
def test_two_ranks_large_two_shot_keeps_64_ctas(nbytes):
    assert pycollectives._C.cuda_two_shot_max_blocks(nbytes, 2, True, 64, 128) == 64


# ---- this machine's measured choices (pycoll-bench --calibrate on GPUs) -----------------------

@pytest.fixture
def no_measured_choices():
    pycollectives._C.clear_cuda_choices()
    yield
    pycollectives._C.clear_cuda_choices()


# The measured choices decide the algorithm; whether two ranks below 16 MiB then keep two-shot also
# depends on the registered two-shot protocols (choose_all_reduce). These tests fix that limit, so
# that they test the calibration alone.
def choose_measured(op, nbytes, world, **kw):
    return choose(op, nbytes, world, fast_two_shot_max_bytes=16 * MiB, **kw)


def test_measured_choices_rule_inside_their_range_only(no_measured_choices):
    C = pycollectives._C
    assert C.cuda_choices_digest(2) == ""
    C.set_cuda_choices("all_reduce", 2, [(1 * MiB, "twoshot"), (8 * MiB, "ring")], 64 * MiB)
    assert choose_measured("all_reduce", 1 * MiB, 2) == "twoshot"
    assert choose_measured("all_reduce", 8 * MiB - 1, 2) == "twoshot"
    assert choose_measured("all_reduce", 8 * MiB, 2) == "ring"
    assert choose_measured("all_reduce", 64 * MiB, 2) == "ring"
    # Outside the measured sizes, other world sizes and other ops: the built-in rules.
    assert choose_measured("all_reduce", 1 * MiB - 1, 2) == "oneshot"
    assert choose_measured("all_reduce", 128 * MiB, 2) == "oneshot"
    assert choose_measured("all_reduce", 8 * MiB, 3) == choose("all_reduce", 8 * MiB, 3, builtin=True)
    assert choose("all_gather", 8 * MiB, 2) == choose("all_gather", 8 * MiB, 2, builtin=True)
    assert choose("all_reduce", 8 * MiB, 2, builtin=True) == "twoshot"
    assert choose_measured("all_reduce", 2 * MiB, 2) == "twoshot"
    assert choose("all_reduce", 2 * MiB, 2, builtin=True) == "oneshot"
    digest = C.cuda_choices_digest(2)
    assert "x2" in digest and "twoshot" in digest and "ring" in digest
    assert C.cuda_choices_digest(4) == ""  # a group of 4 ranks compares only tables for 4
    C.clear_cuda_choices()
    assert choose_measured("all_reduce", 2 * MiB, 2) == "oneshot" and C.cuda_choices_digest(2) == ""


@pytest.mark.parametrize("op,world,steps,max_bytes,what", [
    ("all_reduce", 2, [], 10, "no steps"),
    ("all_reduce", 2, [(10, "ring"), (10, "twoshot")], 100, "increasing"),
    ("all_reduce", 2, [(10, "ring")], 5, "max_bytes"),
    ("all_gather", 2, [(10, "twoshot")], 100, "cannot run twoshot"),
    ("broadcast", 2, [(10, "ring")], 100, "only all_reduce"),
    ("all_reduce", 1, [(10, "ring")], 100, "world size"),
    ("all_reduce", 2, [(10, "fastest")], 100, "unknown algorithm"),
])
def test_bad_measured_choices_are_rejected(no_measured_choices, op, world, steps, max_bytes, what):
    with pytest.raises(ValueError, match=what):
        pycollectives._C.set_cuda_choices(op, world, steps, max_bytes)
    assert pycollectives._C.cuda_choices_digest(world if world > 0 else 2) == ""


def _calibrate():
    from pycollectives.bench import calibrate
    return calibrate


def _rows(op, table):
    """pycoll-bench rows: {bytes: {algo: time_us}}."""
    return [dict(op=op, bytes=b, backend="pycoll", algo=a, mode="eager", dtype="float32", error=None,
                 check=None, time_us=t) for b, by_algo in table.items() for a, t in by_algo.items()]


def test_fit_cuda_choices_keeps_the_builtin_choice_within_the_margin():
    cal = _calibrate()
    rows = _rows("all_reduce", {
        1 * MiB: {"oneshot": 10.0, "twoshot": 9.6, "ring": 20.0},    # 4% faster: noise, keep oneshot
        2 * MiB: {"oneshot": 10.0, "twoshot": 9.0, "ring": 20.0},    # 10% faster: twoshot
        4 * MiB: {"oneshot": 20.0, "twoshot": 15.0},                 # still twoshot (one step)
        8 * MiB: {"twoshot": 30.0, "ring": 25.0},                    # built-in not measured: fastest
        16 * MiB: {"twoshot": 60.0},                                 # one algorithm: no comparison
    }) + _rows("all_gather", {
        2 * MiB: {"oneshot": 10.0, "ring": 5.0, "twoshot": 1.0},     # twoshot is not an all_gather choice
    }) + [dict(op="all_reduce", bytes=32 * MiB, backend="nccl", algo=None, mode="eager", dtype="float32",
               error=None, check=None, time_us=1.0)]
    builtin = lambda op, nb, world: "oneshot"  # noqa: E731
    out = cal.fit_cuda_choices(rows, "float32", 2, builtin)
    assert out["all_reduce"] == {"max_bytes": 8 * MiB, "steps": [[1 * MiB, "oneshot"], [2 * MiB, "twoshot"],
                                                                [8 * MiB, "ring"]],
                                 "sizes": [1 * MiB, 2 * MiB, 4 * MiB, 8 * MiB]}
    # all_gather's bench bytes are the output: the engine counts one rank's share.
    assert out["all_gather"]["steps"] == [[1 * MiB, "ring"]] and out["all_gather"]["max_bytes"] == 1 * MiB


def test_fit_cuda_choices_ignores_a_one_size_winner():
    cal = _calibrate()
    sizes = [8 << k for k in range(8)]
    builtin = lambda op, nb, world: "oneshot"  # noqa: E731
    # At sizes[2] tree wins by 4% over twoshot, the choice of both neighbours: noise.
    table = {b: {"oneshot": 10.0, "twoshot": 5.0} for b in sizes}
    table[sizes[2]] = {"oneshot": 10.0, "twoshot": 5.2, "tree": 5.0}
    # At sizes[5] ring wins, but its neighbours' twoshot did not run there: kept.
    table[sizes[5]] = {"oneshot": 10.0, "ring": 5.0}
    out = cal.fit_cuda_choices(_rows("all_reduce", table), "float32", 2, builtin)
    assert out["all_reduce"]["steps"] == [[sizes[0], "twoshot"], [sizes[5], "ring"], [sizes[6], "twoshot"]]
    # A clear one-size winner stays (tree in half of twoshot's time).
    table[sizes[2]] = {"oneshot": 10.0, "twoshot": 5.0, "tree": 2.5}
    out = cal.fit_cuda_choices(_rows("all_reduce", table), "float32", 2, builtin)
    assert [sizes[2], "tree"] in out["all_reduce"]["steps"]
    # Two sizes in a row are a step, and so is a change at the last size.
    rows = _rows("all_reduce", {b: {"oneshot": 10.0, ("ring" if b in sizes[3:5] or b == sizes[-1] else "twoshot"): 5.0}
                                for b in sizes})
    out = cal.fit_cuda_choices(rows, "float32", 2, builtin)
    assert out["all_reduce"]["steps"] == [[sizes[0], "twoshot"], [sizes[3], "ring"], [sizes[5], "twoshot"],
                                          [sizes[7], "ring"]]


def test_calibrated_file_installs_the_choices(tmp_path, no_measured_choices):
    import json
    cal = _calibrate()
    rows = _rows("all_reduce", {4 * MiB: {"oneshot": 30.0, "twoshot": 20.0}, 8 * MiB: {"oneshot": 40.0, "twoshot": 30.0}})
    doc = {"device": "cuda", "entries": []}
    cal.add_cuda_choices(doc, rows, "float32", 2, lambda op, nb, world: "oneshot")
    path = tmp_path / "cost_model.json"
    path.write_text(json.dumps(doc))
    assert pycollectives.load_cost_model(str(path)) == 1
    assert choose_measured("all_reduce", 4 * MiB, 2) == choose_measured("all_reduce", 8 * MiB, 2) == "twoshot"
    assert choose_measured("all_reduce", 2 * MiB, 2) == "oneshot"  # below the measured sizes
    # A bad table installs nothing, not even the good ones before it.
    doc["cuda_choices"]["ops"]["reduce_scatter"] = {"steps": [[4 * MiB, "nosuch"]], "max_bytes": 8 * MiB}
    path.write_text(json.dumps(doc))
    with pytest.raises(ValueError, match="unknown algorithm"):
        pycollectives.load_cost_model(str(path))
    assert pycollectives._C.cuda_choices_digest(2) == ""
    path.write_text(json.dumps([1, 2]))
    with pytest.raises(ValueError, match="not a pycoll-bench --calibrate file"):
        pycollectives.load_cost_model(str(path))


def test_calibration_is_loaded_from_the_user_cache(tmp_path, monkeypatch, capfd, no_measured_choices):
    """Without PYCOLL_COST_MODEL, load_cost_model() (what import runs) reads this user's cache:
    $XDG_CACHE_HOME/pycollectives, else ~/.cache/pycollectives, never the package directory; with
    PYCOLL_DEBUG=INFO it names the file once; PYCOLL_COST_MODEL still wins."""
    import json
    from pycollectives import cache, config
    cal = _calibrate()
    rows = _rows("all_reduce", {4 * MiB: {"oneshot": 30.0, "twoshot": 20.0}, 8 * MiB: {"oneshot": 40.0, "twoshot": 30.0}})
    doc = {"device": "cuda", "card": "test card", "date": "2026-11-27", "entries": []}
    cal.add_cuda_choices(doc, rows, "float32", 2, lambda op, nb, world: "oneshot")
    monkeypatch.delenv("PYCOLL_COST_MODEL", raising=False)
    monkeypatch.setenv("PYCOLL_DEBUG", "INFO")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setattr(config, "_logged", set())
    path = tmp_path / "xdg" / "pycollectives" / "cost_model.json"
    assert cache.cost_model_path() == str(path)
    assert not cache.cost_model_path().startswith(os.path.dirname(pycollectives.__file__))
    assert pycollectives.load_cost_model() == 0   # no calibration yet: the built-in choices
    assert choose("all_reduce", 4 * MiB, 2, builtin=True) == choose_measured("all_reduce", 4 * MiB, 2)

    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(doc))
    assert pycollectives.load_cost_model() == 1
    assert choose_measured("all_reduce", 8 * MiB, 2) == "twoshot" and pycollectives._C.cuda_choices_digest(2) != ""
    assert pycollectives.load_cost_model() == 1
    err = capfd.readouterr().err
    assert err.count(f"[pycoll] auto uses the calibration {path} (cuda, test card") == 1, err

    # ~/.cache without XDG_CACHE_HOME, and a relative one is ignored (the XDG spec says so).
    for xdg in (None, "relative/cache"):
        if xdg is None:
            monkeypatch.delenv("XDG_CACHE_HOME")
        else:
            monkeypatch.setenv("XDG_CACHE_HOME", xdg)
        assert cache.cost_model_path() == str(tmp_path / "home" / ".cache" / "pycollectives" / "cost_model.json")
    pycollectives._C.clear_cuda_choices()
    assert pycollectives.load_cost_model() == 0 and pycollectives._C.cuda_choices_digest(2) == ""
    monkeypatch.setenv("PYCOLL_COST_MODEL", str(path))
    assert pycollectives.load_cost_model() == 1


def test_wide_two_shot_chunks():
    # Two ranks with waves up to 64 MiB: each CTA's share in equal chunks of at most 128 KiB unless
    # PYCOLL_CUDA_CHUNK_KIB is set (64 MiB: 206.3-206.7 against 209.8-210.2 us with 256 KiB chunks,
    # 2x H200, docs/decisions/0009-two-shot-waves.md).
    f = pycollectives._C.cuda_two_shot_chunk_bytes
    KiB = 1 << 10

    def cap(nbytes, chunk=256 * KiB, chunk_set=False, world=2, waves=True, wide=128):
        return f(nbytes, nbytes // world, world, waves, wide, chunk, chunk_set)

    assert cap(64 * MiB) == 128 * KiB
    assert cap(48 * MiB) == 96 * KiB             # 192 KiB per CTA: two equal chunks, not 128 + 64
    assert cap(40 * MiB) == 80 * KiB
    assert cap(32 * MiB) == 256 * KiB and cap(16 * MiB) == 256 * KiB  # one chunk per CTA: unchanged
    assert cap(64 * MiB, chunk=64 * KiB) == 64 * KiB   # a smaller slot stays the cap
    assert cap(64 * MiB, chunk_set=True) == 256 * KiB  # PYCOLL_CUDA_CHUNK_KIB wins
    assert cap(64 * MiB + 16) == 256 * KiB            # above 64 MiB: the plain two-shot
    assert cap(64 * MiB, world=3) == 256 * KiB
    assert cap(64 * MiB, waves=False) == 256 * KiB
    assert cap(64 * MiB, wide=0) == 256 * KiB


def test_wide_two_shot_chunks_are_equal_per_cta():
    # With the engine's own cut (plan_geometry: chunk c to CTA c % blocks), no CTA carries more than
    # its share rounded up to one 16-byte word per chunk, at sizes that do not divide evenly too.
    f = pycollectives._C.cuda_two_shot_chunk_bytes
    for nbytes in (33 * MiB + 4, 40 * MiB, 48 * MiB - 12, 56 * MiB, 64 * MiB):
        seg = -(-nbytes // 8) * 4  # float32 segment: ceil(count / 2) elements, 16-byte aligned
        seg = -(-seg // 16) * 16
        chunk = f(nbytes, seg, 2, True, 128, 256 << 10, False)
        nchunks = -(-seg // chunk)
        per_cta = [0] * 128
        for c in range(nchunks):
            per_cta[c % 128] += min(chunk, seg - c * chunk)
        assert max(per_cta) <= -(-seg // 128) + 32, (nbytes, chunk, max(per_cta), seg / 128)
