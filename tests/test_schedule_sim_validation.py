"""benchmarks/schedule_sim_validation.py: fitted to one program's times, the simulator predicts
another's. Here the "measurements" are simulated with known link parameters plus an overhead
per op, so the fit must find parameters that predict a second program within 10%, and must not
predict it when its "measured" times are off by a factor."""
import json
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

import schedule_sim_validation as v  # noqa: E402

TRUE = [3e-6, 2e-6, 1 / 8e9, 0.05e-9, 0.04e-9]  # overhead, alpha, beta, gamma, copy_gamma
SIZES = [64 << 10, 256 << 10, 1 << 20, 4 << 20]


def _result_file(tmp_path, scale_other=1.0):
    results = []
    for prog in ("ring_all_reduce", "rabenseifner"):
        for size in SIZES:
            t = v.predict(TRUE, prog, 4, size) * (scale_other if prog == "rabenseifner" else 1.0)
            results.append({"op": "all_reduce", "bytes": size, "label": f"pycoll/{prog}", "time_us": t * 1e6})
        results.append({"op": "all_reduce", "bytes": SIZES[0], "label": "pycoll/ring", "time_us": 1.0})  # built in
    doc = {"schema": "pycoll-bench/1", "config": {"nproc": 4}, "metadata": {"world_size": 4}, "results": results}
    path = tmp_path / "run.json"
    path.write_text(json.dumps(doc))
    return str(path)


@pytest.mark.parametrize("scale,right", [(1.0, True), (1.6, False)])
def test_fit_to_the_ring_predicts_rabenseifner(tmp_path, scale, right):
    times = v.measured([_result_file(tmp_path, scale)])
    assert {k[0] for k in times} == {"ring_all_reduce", "rabenseifner"}  # the built-in ring is not a program
    out = v.validate(times, "ring_all_reduce", 64 << 20)
    rows = [r for r in out[4]["rows"] if not r["fitted"]]
    assert len(rows) == len(SIZES)
    worst = max(abs(r["ratio"] - 1) for r in rows)
    assert (worst < 0.10) == right, worst
