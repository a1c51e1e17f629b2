"""make bench-compare (benchmarks/regression/compare.py): its verdict rule on known numbers, and one
short real comparison against HEAD (nothing is timed for its result here: CI machines are noisy)."""
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benchmarks", "regression"))

import compare  # noqa: E402
from cases import build_cases, case_op  # noqa: E402


def test_verdict_flags_a_slowdown_beyond_base_spread():
    base = [100.0, 102.0, 98.0, 101.0, 99.0, 100.0, 103.0, 97.0]
    after = [101.0, 100.0, 99.0, 102.0, 98.0, 101.0, 100.0, 99.0]
    same = [100.5, 101.0, 98.5, 101.5, 98.5, 100.5, 101.5, 98.0]
    change, spread, flagged = compare.verdict(base, same, after)
    assert abs(change) < 0.01 and not flagged
    slower = [w * 1.10 for w in same]
    change, spread, flagged = compare.verdict(base, slower, after)
    assert 0.09 < change < 0.11 and spread < 0.06 and flagged


def test_verdict_spread_is_base_against_itself():
    # BASE disagreeing with itself by +-15% in alternate rounds hides a 10% change.
    base = [100.0, 100.0] * 4
    after = [115.0, 85.0] * 4
    work = [110.0 * (a * b) ** 0.5 / 100.0 for a, b in zip(base, after)]
    change, spread, flagged = compare.verdict(base, work, after)
    assert spread > 0.2 and not flagged


def test_cases_cover_every_op_size_and_algorithm():
    cpu = {c["name"] for c in build_cases("cpu", 2)}
    for op in ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "sendrecv", "all_to_all"):
        for size in ("8B", "64KiB", "1MiB", "16MiB"):
            assert f"{op}-{size}" in cpu
    assert {"all_reduce-1MiB-ring", "all_reduce-1MiB-tree", "all_reduce-1MiB-oneshot", "all_reduce-1MiB-twoshot",
            "ddp-step", "signsgd-1MiB", "powersgd-1MiB"} <= cpu
    gpu = {c["name"] for c in build_cases("cuda", 2, compare=True)}
    assert {"all_reduce-32MiB", "all_reduce-64MiB", "all_reduce-256MiB"} <= gpu
    assert "all_gather-8B" not in {c["name"] for c in build_cases("cpu", 4)}  # 2 floats do not split in 4
    assert case_op(next(c for c in build_cases("cpu", 2) if c["kind"] == "ddp")) == "ddp"


@pytest.mark.pycoll_only
def test_compare_against_head_runs_end_to_end(tmp_path):
    out = tmp_path / "cmp.json"
    proc = subprocess.run(
        [sys.executable, os.path.join(ROOT, "benchmarks", "regression", "compare.py"), "--base", "HEAD",
         "--device", "cpu", "--cases", "all_reduce-64KiB,broadcast-8B", "--rounds", "4", "--round-ms", "1",
         "--inject", "all_reduce-64KiB", "--no-fail", "--json", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(out.read_text())
    rows = {r["name"]: r for r in result["rows"]}
    assert set(rows) == {"all_reduce-64KiB", "broadcast-8B"}
    for r in rows.values():
        assert r["error"] is None
        assert len(r["base_us"]) == len(r["work_us"]) == len(r["base_after_us"]) == 4
        assert all(t > 0 for t in r["base_us"] + r["work_us"] + r["base_after_us"])
    assert rows["all_reduce-64KiB"]["delay_us"] > 0 and rows["broadcast-8B"]["delay_us"] == 0
    assert "BASE HEAD" in proc.stdout and "all_reduce-64KiB (+delay)" in proc.stdout
