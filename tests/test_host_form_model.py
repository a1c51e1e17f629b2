"""The calibrated form across hosts (issue 22: "auto chooses by a cost model whose constants the
benchmark calibrates"): `pycoll-bench --hosts N --calibrate` times the flat and the hierarchical
form of all_reduce, reduce_scatter and all_gather and writes which won where; load_cost_model()
installs the tables (csrc/engines/host_form_model.h), the hierarchical engine's auto follows them
inside the measured sizes, and every rank of a group across hosts must hold the same tables."""

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
KIB, MIB = 1 << 10, 1 << 20


@pytest.fixture(autouse=True)
def _no_tables_left():
    _C.clear_host_form_tables()
    yield
    _C.clear_host_form_tables()


def test_the_table_decides_inside_the_measured_sizes_and_the_builtin_rule_outside():
    _C.set_host_form_table("cpu", "all_reduce", 2, 2, [(8, "flat"), (64 * KIB, "hierarchical")], 64 * MIB)
    form = lambda nb, **kw: _C.host_form("cpu", "all_reduce", 2, 2, nb, **kw)  # noqa: E731
    assert [form(nb) for nb in (8, 64 * KIB - 1, 64 * KIB, 64 * MIB)] == ["flat", "flat", "hierarchical",
                                                                         "hierarchical"]
    # Outside the measured sizes, and for another op, device or layout: the built-in rule.
    assert form(4) == form(64 * MIB + 1) == "hierarchical" == form(8, builtin=True)
    assert _C.host_form("cpu", "reduce_scatter", 2, 2, 8) == "hierarchical"
    assert _C.host_form("cpu", "all_reduce", 2, 4, 8) == "hierarchical"
    assert _C.host_form("cpu", "all_reduce", 4, 2, 8) == "hierarchical"
    # The built-in rule on CUDA tensors: NCCL's one flat call for small messages.
    cuda = lambda op, nb: _C.host_form("cuda", op, 2, 2, nb)  # noqa: E731
    assert [cuda("all_reduce", nb) for nb in (128 * KIB - 1, 128 * KIB)] == ["flat", "hierarchical"]
    assert [cuda("reduce_scatter", nb) for nb in (32 * KIB - 1, 32 * KIB)] == ["flat", "hierarchical"]
    assert [cuda("all_gather", nb) for nb in (8, 512 * KIB - 1, 512 * KIB, 1 << 30)] == ["flat", "flat",
                                                                                      "hierarchical",
                                                                                      "hierarchical"]
    # A table set again replaces the old one.
    _C.set_host_form_table("cpu", "all_reduce", 2, 2, [(8, "hierarchical")], 64 * MIB)
    assert form(8) == "hierarchical" and len(_C.host_form_tables()) == 1


def test_bad_tables_are_refused_with_a_clear_error():
    ok = [(8, "flat")]
    with pytest.raises(ValueError, match="all_reduce, reduce_scatter and all_gather"):
        _C.set_host_form_table("cpu", "broadcast", 2, 2, ok, 64)
    with pytest.raises(ValueError, match="at least 2 hosts of at least 2 ranks; got 1 x 4"):
        _C.set_host_form_table("cpu", "all_reduce", 1, 4, ok, 64)
    with pytest.raises(ValueError, match="at least one step"):
        _C.set_host_form_table("cpu", "all_reduce", 2, 2, [], 64)
    with pytest.raises(ValueError, match="increasing, non-negative"):
        _C.set_host_form_table("cpu", "all_reduce", 2, 2, [(64, "flat"), (8, "hierarchical")], 1024)
    with pytest.raises(ValueError, match="below its last step"):
        _C.set_host_form_table("cpu", "all_reduce", 2, 2, [(8, "flat"), (64, "hierarchical")], 32)
    with pytest.raises(ValueError, match="expected flat or hierarchical"):
        _C.set_host_form_table("cpu", "all_reduce", 2, 2, [(8, "ring")], 64)
    with pytest.raises(ValueError, match="'cpu' or 'cuda'"):
        _C.set_host_form_table("xpu", "all_reduce", 2, 2, ok, 64)
    assert _C.host_form_tables() == [] and _C.host_form_digest() == ""


def test_digest_names_every_table_in_a_fixed_order():
    _C.set_host_form_table("cuda", "all_reduce", 2, 2, [(8, "flat"), (256 * KIB, "hierarchical")], 1 << 30)
    _C.set_host_form_table("cpu", "all_gather", 2, 2, [(32, "hierarchical")], 32 * MIB)
    d = _C.host_form_digest()
    assert d.index("cpu allgather 2x2: hierarchical@32") < d.index("cuda allreduce 2x2: flat@8 hierarchical@262144"), d
    _C.clear_host_form_tables()
    _C.set_host_form_table("cpu", "all_gather", 2, 2, [(32, "hierarchical")], 32 * MIB)
    _C.set_host_form_table("cuda", "all_reduce", 2, 2, [(8, "flat"), (256 * KIB, "hierarchical")], 1 << 30)
    assert _C.host_form_digest() == d  # the order installed does not matter
    _C.set_host_form_table("cpu", "all_gather", 2, 2, [(32, "hierarchical")], 64 * MIB)
    assert _C.host_form_digest() != d


def _row(op, algo, nbytes, t, backend="pycoll", **kw):
    r = dict(op=op, algo=algo, bytes=nbytes, time_us=t, backend=backend, mode="eager", dtype="float32",
             error=None, check=None, label=backend)
    r.update(kw)
    return r


def test_fit_host_forms_keeps_the_builtin_form_unless_the_other_clearly_won():
    builtin = lambda op, nb: "hierarchical"  # noqa: E731  (the CPU rule)
    times = {  # bytes: (flat, hierarchical) in us
        8: (900, 1000),        # flat 10% faster: flat
        64: (980, 1000),       # 2% faster: the built-in form, but between two flat sizes: flat
        512: (500, 1000),
        4096: (1000, 900),     # hierarchical at one size, by 10%: an island, taken for noise
        32768: (500, 1000),
        1 << 20: (3000, 1000),
        1 << 23: (9000, 8000),
        1 << 25: (9700, 10000),  # flat 3% faster: within the margin, the built-in form
    }
    rows = []
    for nb, (f, h) in times.items():
        rows += [_row("all_reduce", "flat", nb, f), _row("all_reduce", "hierarchical", nb, h)]
    rows += [_row("all_gather", "flat", nb, 1.0) for nb in times]  # one form only: no table
    rows += [_row("all_reduce", "hierarchical", 1 << 25, 1e9, error="boom"),  # left out
             _row("all_reduce", "flat", 1 << 23, 1.0, check="fail"),
             _row("all_reduce", None, 1 << 23, 1.0),  # auto: not a form
             _row("all_reduce", "flat", 1 << 23, 1.0, backend="gloo")]
    tables = calibrate.fit_host_forms(rows, "float32", "cpu", 2, 2, builtin)
    assert len(tables) == 1, tables
    t = tables[0]
    assert (t["device"], t["op"], t["num_hosts"], t["local_size"], t["max_bytes"]) == ("cpu", "all_reduce", 2, 2,
                                                                                       1 << 25)
    assert t["steps"] == [[8, "flat"], [1 << 20, "hierarchical"]], t
    # What the file holds is what the engine then runs.
    _C.set_host_form_table(t["device"], t["op"], 2, 2, [tuple(s) for s in t["steps"]], t["max_bytes"])
    assert [_C.host_form("cpu", "all_reduce", 2, 2, nb) for nb in times] == ["flat"] * 5 + ["hierarchical"] * 3
    # A new calibration of a layout replaces that layout's tables and keeps the others'.
    other = dict(t, num_hosts=4)
    assert calibrate.merge_host_forms([other, dict(t, max_bytes=1)], tables) == [other] + tables


def _write_model(path, form, ops=("all_reduce", "reduce_scatter", "all_gather")):
    tables = [dict(device="cpu", op=op, num_hosts=2, local_size=2, steps=[[1, form]], max_bytes=1 << 30)
              for op in ops]
    path.write_text(json.dumps({"device": "cpu", "entries": [], "host_forms": tables}))
    return str(path)


def test_load_cost_model_installs_all_tables_or_none(tmp_path):
    good = _write_model(tmp_path / "good.json", "flat")
    assert pycollectives.load_cost_model(good) == 3
    assert _C.host_form("cpu", "reduce_scatter", 2, 2, MIB) == "flat"
    bad = tmp_path / "bad.json"
    doc = json.loads((tmp_path / "good.json").read_text())
    doc["host_forms"][2]["steps"] = [[64, "flat"], [8, "flat"]]
    bad.write_text(json.dumps(doc))
    with pytest.raises(ValueError, match="host_forms: .*increasing"):
        pycollectives.load_cost_model(str(bad))
    assert _C.host_form_tables() == []
    # No file: the built-in rule.
    assert pycollectives.load_cost_model(good) == 3
    assert pycollectives.load_cost_model(str(tmp_path / "absent.json")) == 0
    assert _C.host_form_tables() == []


def _forms_that_ran(rank, ws):
    # The ranks may be forked from this test process, which imported pycollectives before
    # PYCOLL_COST_MODEL was set: load it as import would have.
    assert pycollectives.load_cost_model() == 3
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


@pytest.mark.parametrize("winner", ["flat", "hierarchical"])
def test_auto_runs_the_form_the_loaded_table_names(tmp_path, winner):
    path = _write_model(tmp_path / "model.json", winner)
    out = run_ranks(4, _forms_that_ran, rank_env=HOSTS_2X2,
                    env={"PYCOLL_DEBUG": "INFO", "PYCOLL_COST_MODEL": path}, timeout=300)
    for ran in out:
        assert len(ran) == 6 and {algo for _, algo in ran} == {winner}, ran


def _init_and_report(rank, ws, init_file, models=None):
    if models:
        os.environ["PYCOLL_COST_MODEL"] = models[rank]
        pycollectives.load_cost_model()
    try:
        dist.init_process_group("pycoll", init_method=f"file://{init_file}", rank=rank, world_size=ws)
        dist.all_reduce(torch.ones(4))
        return "created"
    except Exception as exc:  # noqa: BLE001  (the message is the result)
        return str(exc)


def test_ranks_with_different_constants_cannot_make_a_group(tmp_path):
    a = _write_model(tmp_path / "a.json", "flat")
    b = _write_model(tmp_path / "b.json", "hierarchical")
    out = run_ranks(4, _init_and_report, str(tmp_path / "init"), [a, a, a, b], rank_env=HOSTS_2X2, init=None,
                    timeout=120)
    for rank, msg in enumerate(out):
        assert "loaded different tables of forms across hosts" in msg, (rank, msg)
        assert ("rank(s) [3]" if rank < 3 else "rank(s) [0, 1, 2]") in msg, (rank, msg)


def test_ranks_that_set_different_link_rates_cannot_make_a_group(tmp_path):
    # The links' rate decides how many pieces a hierarchical op runs in (PYCOLL_LINK): ranks that
    # differ would wait in different calls.
    links = ["1gbit", "1gbit", "1gbit", "10gbit"]
    out = run_ranks(4, _init_and_report, str(tmp_path / "init"), init=None, timeout=120,
                    rank_env=[dict(env, PYCOLL_LINK=link) for env, link in zip(HOSTS_2X2, links)])
    for rank, msg in enumerate(out):
        assert "set different rates of the links between hosts (PYCOLL_LINK" in msg, (rank, msg)
        assert ("rank(s) [3]" if rank < 3 else "rank(s) [0, 1, 2]") in msg, (rank, msg)


def test_bench_calibrates_the_forms_across_simulated_hosts(tmp_path):
    """`pycoll-bench --hosts 2 --nproc 4 --calibrate` measures both forms and adds their table to
    the file, keeping the one-host constants already there."""
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
    tables = doc["host_forms"]
    assert [(t["device"], t["op"], t["num_hosts"], t["local_size"], t["max_bytes"]) for t in tables] == [
        ("cpu", "all_reduce", 2, 2, 32 * KIB)], tables
    assert tables[0]["sizes"] == [8, 128, 2 * KIB, 32 * KIB] and tables[0]["steps"][0][0] == 8, tables
    assert {f for _, f in tables[0]["steps"]} <= {"flat", "hierarchical"}, tables
    assert "cpu 2x2 all_reduce: auto runs" in proc.stdout, proc.stdout
    assert pycollectives.load_cost_model(str(out)) == 2
