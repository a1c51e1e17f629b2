"""The calibrated form across hosts (issue 22: "auto chooses by a cost model whose constants the
benchmark calibrates"): `pycoll-bench --hosts N --calibrate` fits alpha-beta to the flat and the
hierarchical form of all_reduce, reduce_scatter and all_gather; load_cost_model() installs them
(csrc/engines/host_form_model.h), the hierarchical engine's auto follows them, and every rank of a
group across hosts must hold the same constants."""

import json
import os
import re
import subprocess
import sys

import pytest
import torch
import torch.distributed as dist

from ranks import run_ranks

pycollectives = pytest.importorskip("pycollectives")
_C = pycollectives._C
from pycollectives.bench import calibrate  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HOSTS_2X2 = [{"PYCOLL_HOSTID": h} for h in ("hostA", "hostA", "hostB", "hostB")]


@pytest.fixture(autouse=True)
def _no_constants_left():
    _C.clear_host_form_entries()
    yield
    _C.clear_host_form_entries()


def _pair(op="all_reduce", device="cpu", flat=(100.0, 0.01), hier=(300.0, 0.001), layout=(2, 2)):
    for form, (a, b) in (("flat", flat), ("hierarchical", hier)):
        _C.set_host_form_entry(device, op, form, layout[0], layout[1], a, b)


def test_the_cheaper_fitted_line_wins_on_each_side_of_the_crossover():
    _pair()  # lines cross at 200 / 0.009 = 22,222 bytes
    assert _C.calibrated_host_form("cpu", "all_reduce", 2, 2, 8) == "flat"
    assert _C.calibrated_host_form("cpu", "all_reduce", 2, 2, 22_000) == "flat"
    assert _C.calibrated_host_form("cpu", "all_reduce", 2, 2, 22_300) == "hierarchical"
    assert _C.calibrated_host_form("cpu", "all_reduce", 2, 2, 1 << 30) == "hierarchical"
    # Only where the op, the device and the layout were measured: elsewhere the built-in rule.
    assert _C.calibrated_host_form("cuda", "all_reduce", 2, 2, 8) is None
    assert _C.calibrated_host_form("cpu", "reduce_scatter", 2, 2, 8) is None
    assert _C.calibrated_host_form("cpu", "all_reduce", 2, 4, 8) is None
    assert _C.calibrated_host_form("cpu", "all_reduce", 4, 2, 8) is None
    # One form alone decides nothing.
    _C.set_host_form_entry("cpu", "all_gather", "flat", 2, 2, 1.0, 0.0)
    assert _C.calibrated_host_form("cpu", "all_gather", 2, 2, 8) is None
    # Ties go to the hierarchical form; an entry set again replaces the old one.
    _pair(flat=(5.0, 0.0), hier=(5.0, 0.0))
    assert _C.calibrated_host_form("cpu", "all_reduce", 2, 2, 8) == "hierarchical"
    assert len(_C.host_form_entries()) == 3


def test_bad_constants_are_refused_with_a_clear_error():
    with pytest.raises(ValueError, match="all_reduce, reduce_scatter and all_gather"):
        _C.set_host_form_entry("cpu", "broadcast", "flat", 2, 2, 1.0, 0.0)
    with pytest.raises(ValueError, match="at least 2 hosts of at least 2 ranks; got 1 x 4"):
        _C.set_host_form_entry("cpu", "all_reduce", "flat", 1, 4, 1.0, 0.0)
    with pytest.raises(ValueError, match="finite and non-negative"):
        _C.set_host_form_entry("cpu", "all_reduce", "flat", 2, 2, -1.0, 0.0)
    with pytest.raises(ValueError, match="finite and non-negative"):
        _C.set_host_form_entry("cpu", "all_reduce", "flat", 2, 2, 1.0, float("nan"))
    with pytest.raises(ValueError, match="expected flat or hierarchical"):
        _C.set_host_form_entry("cpu", "all_reduce", "ring", 2, 2, 1.0, 0.0)
    with pytest.raises(ValueError, match="'cpu' or 'cuda'"):
        _C.set_host_form_entry("xpu", "all_reduce", "flat", 2, 2, 1.0, 0.0)
    assert _C.host_form_entries() == [] and _C.host_form_digest() == ""


def test_digest_names_every_constant_in_a_fixed_order():
    _pair(op="all_gather")
    _pair(op="all_reduce", device="cuda")
    d = _C.host_form_digest()
    assert d.index("cpu allgather 2x2 flat") < d.index("cuda allreduce 2x2 flat"), d
    _C.clear_host_form_entries()
    _pair(op="all_reduce", device="cuda")
    _pair(op="all_gather")
    assert _C.host_form_digest() == d  # the order installed does not matter
    _pair(op="all_gather", flat=(100.0, 0.0100001))
    assert _C.host_form_digest() != d  # a constant that differs in the 7th digit does


def _row(op, algo, nbytes, t, backend="pycoll", **kw):
    r = dict(op=op, algo=algo, bytes=nbytes, time_us=t, backend=backend, mode="eager", dtype="float32",
             error=None, check=None, label=backend)
    r.update(kw)
    return r


def test_fit_host_forms_fits_both_forms_of_each_op_measured_in_both():
    sizes = [8, 1 << 10, 1 << 16, 1 << 20, 1 << 24]
    rows = [_row("all_reduce", "flat", b, 100 + 0.01 * b) for b in sizes]
    rows += [_row("all_reduce", "hierarchical", b, 300 + 0.001 * b) for b in sizes]
    rows += [_row("all_gather", "flat", b, 50 + 0.002 * b) for b in sizes]  # one form only: no entry
    rows += [_row("all_reduce", "hierarchical", 1 << 12, 1e9, error="boom"),  # left out
             _row("all_reduce", "flat", 1 << 12, 1e9, check="fail"),
             _row("all_reduce", None, 1 << 12, 1.0),  # auto: not a form
             _row("all_reduce", "flat", 1 << 12, 1.0, backend="gloo")]
    entries = calibrate.fit_host_forms(rows, "float32", "cpu", 2, 2)
    assert [(e["op"], e["form"]) for e in entries] == [("all_reduce", "flat"), ("all_reduce", "hierarchical")]
    f, h = entries
    assert f["alpha_us"] == pytest.approx(100, rel=1e-6) and f["beta_us_per_byte"] == pytest.approx(0.01, rel=1e-6)
    assert h["alpha_us"] == pytest.approx(300, rel=1e-6) and h["beta_us_per_byte"] == pytest.approx(0.001, rel=1e-6)
    assert f["num_hosts"] == 2 and f["local_size"] == 2 and f["points"] == 5 and f["max_bytes"] == 1 << 24
    assert calibrate.host_form_crossovers(entries) == {
        ("cpu", "all_reduce", "2x2"): "flat below 22,222 B, hierarchical from there"}
    # A new calibration of a layout replaces that layout's entries and keeps the others'.
    other = dict(f, num_hosts=4)
    merged = calibrate.merge_host_forms([other, dict(f, alpha_us=1.0)], entries)
    assert merged == [other] + entries


def _write_model(path, flat, hier, ops=("all_reduce", "reduce_scatter", "all_gather")):
    entries = []
    for op in ops:
        for form, (a, b) in (("flat", flat), ("hierarchical", hier)):
            entries.append(dict(device="cpu", op=op, form=form, num_hosts=2, local_size=2, alpha_us=a,
                                beta_us_per_byte=b))
    path.write_text(json.dumps({"device": "cpu", "entries": [], "host_forms": entries}))
    return str(path)


def test_load_cost_model_installs_all_forms_or_none(tmp_path):
    good = _write_model(tmp_path / "good.json", (1.0, 0.0), (2.0, 0.0))
    assert pycollectives.load_cost_model(good) == 6
    assert _C.calibrated_host_form("cpu", "reduce_scatter", 2, 2, 1 << 20) == "flat"
    bad = tmp_path / "bad.json"
    doc = json.loads((tmp_path / "good.json").read_text())
    doc["host_forms"][3]["alpha_us"] = -5
    bad.write_text(json.dumps(doc))
    with pytest.raises(ValueError, match="host_forms: .*non-negative"):
        pycollectives.load_cost_model(str(bad))
    assert _C.host_form_entries() == []
    # A file without them, or no file, leaves the built-in rule.
    assert pycollectives.load_cost_model(good) == 6
    assert pycollectives.load_cost_model(str(tmp_path / "absent.json")) == 0
    assert _C.host_form_entries() == []


def _forms_that_ran(rank, ws):
    # The ranks may be forked from this test process, which imported pycollectives before
    # PYCOLL_COST_MODEL was set: load it as import would have.
    assert pycollectives.load_cost_model() == 6
    gloo = dist.new_group(backend="gloo")
    for n in (1031, 1 << 18):
        x = torch.arange(n * ws, dtype=torch.float32) * (rank + 1)
        ar, ref = x.clone(), x.clone()
        dist.all_reduce(ar)
        dist.all_reduce(ref, group=gloo)
        assert torch.equal(ar, ref)
        rs = torch.empty(n)
        dist.reduce_scatter_tensor(rs, x)
        assert torch.equal(rs, ref[rank * n:(rank + 1) * n])
        ag = torch.empty(n * ws)
        dist.all_gather_into_tensor(ag, x[:n])
        assert torch.equal(ag, torch.cat([torch.arange(n, dtype=torch.float32) * (r + 1) for r in range(ws)]))
    with open(os.environ["PYCOLL_TEST_LOG"]) as fh:
        found = [re.search(r"\] (allreduce|reduce_scatter|allgather) algo=(\S+)", line) for line in fh]
    return [m.groups() for m in found if m]


@pytest.mark.parametrize("winner,loser", [("flat", "hierarchical"), ("hierarchical", "flat")])
def test_auto_runs_the_form_the_loaded_constants_predict(tmp_path, winner, loser):
    costs = {winner: (1.0, 0.0), loser: (10.0, 1.0)}
    path = _write_model(tmp_path / "model.json", costs["flat"], costs["hierarchical"])
    out = run_ranks(4, _forms_that_ran, rank_env=HOSTS_2X2,
                    env={"PYCOLL_DEBUG": "INFO", "PYCOLL_COST_MODEL": path}, timeout=300)
    for ran in out:
        assert len(ran) == 6 and {algo for _, algo in ran} == {winner}, ran


def _init_and_report(rank, ws, init_file, models):
    os.environ["PYCOLL_COST_MODEL"] = models[rank]
    pycollectives.load_cost_model()
    try:
        dist.init_process_group("pycoll", init_method=f"file://{init_file}", rank=rank, world_size=ws)
        dist.all_reduce(torch.ones(4))
        return "created"
    except Exception as exc:  # noqa: BLE001  (the message is the result)
        return str(exc)


def test_ranks_with_different_constants_cannot_make_a_group(tmp_path):
    a = _write_model(tmp_path / "a.json", (1.0, 0.0), (2.0, 0.0))
    b = _write_model(tmp_path / "b.json", (2.0, 0.0), (1.0, 0.0))
    out = run_ranks(4, _init_and_report, str(tmp_path / "init"), [a, a, a, b], rank_env=HOSTS_2X2, init=None,
                    timeout=120)
    for rank, msg in enumerate(out):
        assert "loaded different constants for the form across hosts" in msg, (rank, msg)
        assert ("rank(s) [3]" if rank < 3 else "rank(s) [0, 1, 2]") in msg, (rank, msg)


def test_bench_calibrates_the_forms_across_simulated_hosts(tmp_path):
    """`pycoll-bench --hosts 2 --nproc 4 --calibrate` measures both forms and adds their constants
    to the file, keeping the one-host constants already there."""
    out = tmp_path / "model.json"
    out.write_text(json.dumps({"device": "cpu", "entries": [dict(op="allreduce", algo="ring", alpha_us=1.0,
                                                                  beta_us_per_byte=0.0)]}))
    env = dict(os.environ, PYTHONPATH=REPO)
    proc = subprocess.run([sys.executable, "-m", "pycollectives.bench", "--backends", "pycoll", "--device", "cpu",
                           "--hosts", "2", "--nproc", "4", "--ops", "all_reduce", "-b", "8", "-e", "64K", "-f", "16",
                           "--budget", "0.01", "--calibrate", "--calibrate-out", str(out), "--no-save"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    doc = json.loads(out.read_text())
    assert doc["entries"][0]["algo"] == "ring", doc  # kept
    forms = doc["host_forms"]
    assert [(e["op"], e["form"], e["num_hosts"], e["local_size"]) for e in forms] == [
        ("all_reduce", "flat", 2, 2), ("all_reduce", "hierarchical", 2, 2)], forms
    assert all(e["points"] == 4 and e["alpha_us"] >= 0 and e["beta_us_per_byte"] >= 0 for e in forms), forms
    assert "cpu 2x2 all_reduce: auto runs" in proc.stdout, proc.stdout
    assert pycollectives.load_cost_model(str(out)) == 3
