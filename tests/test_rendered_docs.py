"""The result tables of README.md and docs/performance.md are what benchmarks/render_tables.py
renders from benchmarks/results (no ranks, no torch)."""
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(REPO, "benchmarks", "render_tables.py")

_spec = importlib.util.spec_from_file_location("render_tables", SCRIPT)
render_tables = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(render_tables)


def _markers(doc):
    with open(os.path.join(REPO, doc)) as fh:
        text = fh.read()
    return [(m.group(1), render_tables.parse_marker(m.group(1), m.group(2)))
            for m in render_tables.BEGIN_RE.finditer(text)]


def test_docs_match_result_files():
    proc = subprocess.run([sys.executable, SCRIPT, "--check"], cwd=REPO, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_tables_cite_existing_files():
    assert len(_markers("README.md")) >= 3  # one per platform
    for doc in render_tables.DOCS:
        for name, spec in _markers(doc):
            assert os.path.exists(os.path.join(REPO, spec["source"])), (doc, name, spec["source"])


def _copy_tree(tmp_path):
    for doc in render_tables.DOCS:
        os.makedirs(os.path.dirname(os.path.join(tmp_path, doc)) or tmp_path, exist_ok=True)
        shutil.copy(os.path.join(REPO, doc), os.path.join(tmp_path, doc))
    shutil.copytree(os.path.join(REPO, "benchmarks", "results"), os.path.join(tmp_path, "benchmarks", "results"))


def test_a_changed_result_makes_the_check_fail(tmp_path, capsys):
    _copy_tree(tmp_path)
    assert render_tables.main(["--check", "--root", str(tmp_path)]) == 0
    # The README's first table: triple its label's time at its first op and size, in every launch.
    name, spec = _markers("README.md")[0]
    path = os.path.join(tmp_path, spec["source"])
    with open(path) as fh:
        doc = json.load(fh)
    launches = doc["launches"] if "launches" in doc else [doc]
    label = spec.get("label", "pycoll")
    op, _, own = spec["ops"].split(",")[0].partition(":")
    nbytes = render_tables.parse_size((own.split("+") if own else spec["sizes"].split(","))[0])
    changed = 0
    for launch in launches:
        for r in launch["results"]:
            if (r["label"], r["op"], r["bytes"]) == (label, op, nbytes):
                r["time_us"] *= 3
                changed += 1
    assert changed == len(launches)
    with open(path, "w") as fh:
        json.dump(doc, fh)
    capsys.readouterr()
    assert render_tables.main(["--check", "--root", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert re.search(r"^-\| " + op + r" \|", out, re.MULTILINE), out
    assert re.search(r"^\+\| " + op + r" \|", out, re.MULTILINE), out
    # Rendering without --check rewrites the copy, after which it checks clean.
    assert render_tables.main(["--root", str(tmp_path)]) == 0
    assert render_tables.main(["--check", "--root", str(tmp_path)]) == 0
    with open(os.path.join(REPO, "README.md")) as fh, open(os.path.join(tmp_path, "README.md")) as fh2:
        assert fh.read() != fh2.read()


def _is_bench(path):
    with open(path) as fh:
        return json.load(fh).get("schema") in (render_tables.BENCH_SCHEMA, render_tables.LAUNCHES_SCHEMA)


def test_merge_keeps_every_launch_and_refuses_mixed_layouts(tmp_path):
    results = os.path.join(REPO, "benchmarks", "results")
    single = sorted(f for f in os.listdir(results) if f.endswith(".json") and _is_bench(os.path.join(results, f))
                    and len(render_tables.load_launches(os.path.join(results, f))) == 1
                    and render_tables.load_launches(os.path.join(results, f))[0]["metadata"]["device"] == "cpu")
    a = os.path.join(results, single[0])
    out = os.path.join(tmp_path, "merged.json")
    assert render_tables.main(["--merge", out, a, a]) == 0
    assert len(render_tables.load_launches(out)) == 2
    other = next(f for f in single if render_tables.load_launches(os.path.join(results, f))[0]["metadata"]["world_size"]
                 != render_tables.load_launches(a)[0]["metadata"]["world_size"]
                 or render_tables.load_launches(os.path.join(results, f))[0]["metadata"]["card"]
                 != render_tables.load_launches(a)[0]["metadata"]["card"])
    assert render_tables.main(["--merge", out, a, os.path.join(results, other)]) == 2


def test_caption_command_drops_output_options_only():
    meta = {"command": "/usr/bin/python3 -m pycollectives.bench --nproc 4 --out /tmp/R --no-progress -b 1M "
                       "--name x --rounds 3",
            "env": {"PYCOLL_CPU_ALLOCATOR": "shared", "PYCOLL_HOSTID": "h0", "NCCL_VERSION": "2"}}
    assert render_tables.reproduce_command(meta) == \
        "PYCOLL_CPU_ALLOCATOR=shared pycoll-bench --nproc 4 -b 1M --rounds 3"


def test_caption_names_gpus_that_ranks_share():
    meta = {"card": "NVIDIA H200", "device": "cuda", "world_size": 4, "torch": "2.11.0+cu130",
            "env": {"NCCL_VERSION": "2.28.3-1"}}
    shared = {"gpu_layout": "4 ranks on 1 GPU(s), ranks sharing GPUs"}
    assert render_tables.describe_platform(meta, shared) == "4 ranks on one NVIDIA H200, torch 2.11.0"
    two = {"gpu_layout": "4 ranks on 2 GPU(s), ranks sharing GPUs"}
    assert render_tables.describe_platform(meta, two) == "4 ranks on 2 NVIDIA H200s, torch 2.11.0"
    own = {"gpu_layout": "4 ranks on 4 GPU(s)"}
    assert render_tables.describe_platform(meta, own) == "4 x NVIDIA H200, torch 2.11.0, NCCL 2.28.3"
    assert render_tables.describe_platform(meta) == "4 x NVIDIA H200, torch 2.11.0, NCCL 2.28.3"


def _ddp_row(layout, link, method, step_ms, loss, link_bytes=1e6):
    return {"model": "mlp", "layout": layout, "link": link, "link_measured_bps": 0.95 * render_tables._link_bps(link),
            "method": method, "step_ms": step_ms, "steps": 20, "warmup": 3, "params": 10, "loss": loss,
            "link_bytes_per_step": link_bytes, "hook_bytes_per_step": link_bytes}


def test_ddp_table_shows_step_time_speedup_and_loss_and_refuses_a_row_without_loss(tmp_path):
    rows = [_ddp_row("2x1", "1gbit", "none", 400.0, 0.25, 52e6), _ddp_row("2x1", "1gbit", "signsgd", 50.0, 0.5, 1.6e6),
            _ddp_row("2x1", "100mbit", "none", 4000.0, 0.25, 52e6),
            _ddp_row("2x1", "100mbit", "signsgd", 160.0, 0.5, 1.7e6)]
    runs = [{"date": "2026-12-05T01:00:00+00:00", "model": "mlp", "layout": "2x1", "link": link,
             "link_measured_bps": 0.95 * render_tables._link_bps(link),
             "command": f"pycoll-cluster --hosts 2 --nproc-per-host 1 --link {link} -- python s.py --model mlp"}
            for link in ("100mbit", "1gbit")]
    doc = {"schema": render_tables.DDP_SCHEMA, "machine": {"cpu": "Some CPU", "cpu_count": 2, "torch": "2.1"},
           "rows": rows, "runs": runs}
    path = tmp_path / "ddp.json"
    path.write_text(json.dumps(doc))
    spec = {"source": "ddp.json", "kind": "ddp", "model": "mlp"}
    out = render_tables.render_table("t", spec, str(tmp_path))
    lines = out.splitlines()
    assert lines[2] == "| layout | method | link MB/step | ms/step at 100mbit | ms/step at 1gbit | loss after 23 steps |"
    assert lines[4] == "| 2 x 1 | none | 52 | 4000 | 400 | 0.2500 |"
    assert lines[5] == "| 2 x 1 | signsgd | 1.65 | 160 (25.0x) | 50.0 (8.00x) | 0.5000 |"
    assert "100mbit measured 95 Mbit/s; 1gbit measured 950 Mbit/s" in lines[0]
    assert "`pycoll-cluster --hosts 2 --nproc-per-host 1 --link {100mbit,1gbit} -- python s.py --model mlp`" in lines[0]
    # A faster step is never shown without what it costs: a row without its loss is refused.
    del rows[3]["loss"]
    path.write_text(json.dumps(doc))
    try:
        render_tables.render_table("t", spec, str(tmp_path))
    except render_tables.RenderError as exc:
        assert "100mbit signsgd: no loss" in str(exc)
    else:
        raise AssertionError("a row without a loss was rendered")


def _launch(card, world, us):
    """A minimal pycoll-bench/1 launch: all_reduce of 1 MiB, pycoll at ``us`` against gloo at 2 x ``us``."""
    rows = [{"label": label, "op": "all_reduce", "bytes": 1 << 20, "dtype": "float32", "time_us": t,
             "busbw_gbps": 1.0} for label, t in (("pycoll", us), ("gloo", 2 * us))]
    return {"schema": render_tables.BENCH_SCHEMA, "labels": ["pycoll", "gloo"], "baseline": "gloo",
            "config": {"dtypes": ["float32"], "rounds": 3}, "results": rows,
            "metadata": {"card": card, "device": "cpu", "world_size": world, "cpu_count": 2, "torch": "2.1",
                         "date": "2026-12-05T01:00:00+00:00", "command": f"pycoll-bench --nproc {world} --out /tmp/x"}}


def _write(path, doc):
    path.write_text(json.dumps(doc))
    return str(path)


def test_result_set_run_selects_its_run_and_the_caption_names_it(tmp_path):
    a = _write(tmp_path / "a.json", _launch("CPU A", 2, 100.0))
    b = _write(tmp_path / "b.json", {"schema": render_tables.LAUNCHES_SCHEMA,
                                     "launches": [_launch("CPU B", 4, 30.0), _launch("CPU B", 4, 50.0)]})
    assert render_tables.main(["--bundle", str(tmp_path / "set.json"), f"two={a}", f"four={b}"]) == 0
    spec = {"source": "set.json", "run": "four", "columns": "us,us:gloo,ratio"}
    out = render_tables.render_table("t", spec, str(tmp_path)).splitlines()
    assert out[0].startswith("*4 ranks on CPU B (2 CPUs)"), out[0]
    assert out[0].endswith("`pycoll-bench --nproc 4` ([data](set.json), run four)*"), out[0]
    assert out[4] == "| all_reduce | 1 MiB | 40.0 | 80.0 | 2.00x |"  # the median over the run's two launches
    out = render_tables.render_table("t", dict(spec, run="two"), str(tmp_path)).splitlines()
    assert out[0].startswith("*2 ranks on CPU A (2 CPUs)") and out[0].endswith("([data](set.json), run two)*")
    assert out[4] == "| all_reduce | 1 MiB | 100 | 200 | 2.00x |"
    # Without a set, the caption names the file only.
    plain = render_tables.render_table("t", {"source": "a.json"}, str(tmp_path)).splitlines()
    assert plain[0].endswith("([data](a.json))*") and plain[2:] == out[2:]


def _render_error(spec, root):
    try:
        render_tables.render_table("t", spec, root)
    except render_tables.RenderError as exc:
        return str(exc)
    raise AssertionError(f"{spec} rendered")


def test_result_set_refuses_a_missing_or_wrong_run_naming_the_file_and_its_runs(tmp_path):
    a = _write(tmp_path / "a.json", _launch("CPU A", 2, 100.0))
    assert render_tables.main(["--bundle", str(tmp_path / "set.json"), f"np2={a}", f"np2-again={a}"]) == 0
    root = str(tmp_path)
    for spec in ({"source": "set.json", "run": "np4"}, {"source": "set.json"}):
        msg = _render_error(spec, root)
        assert "set.json" in msg and "np2, np2-again" in msg, msg
        assert ("no run 'np4'" in msg) == ("run" in spec), msg
    msg = _render_error({"source": "a.json", "run": "np2"}, root)
    assert "a.json" in msg and "not a result set" in msg, msg
    _write(tmp_path / "ddp.json", {"schema": render_tables.DDP_SCHEMA, "rows": []})
    assert "run=" in _render_error({"source": "ddp.json", "kind": "ddp", "model": "mlp", "run": "x"}, root)


def test_bundle_round_trips_and_adds_to_an_existing_set(tmp_path, capsys):
    one = _launch("CPU A", 2, 100.0)
    two = {"schema": render_tables.LAUNCHES_SCHEMA, "launches": [_launch("CPU A", 4, 30.0)]}
    a, b = _write(tmp_path / "a.json", one), _write(tmp_path / "b.json", two)
    out = str(tmp_path / "set.json")
    assert render_tables.main(["--bundle", out, f"x={a}"]) == 0
    assert render_tables.main(["--bundle", out, f"y={b}"]) == 0  # added to the set
    with open(out) as fh:
        doc = json.load(fh)
    assert doc == {"schema": render_tables.SET_SCHEMA, "runs": {"x": one, "y": two}}
    assert render_tables.load_launches(out, "x") == [one]
    assert render_tables.load_launches(out, "y") == two["launches"]
    assert render_tables.main(["--bundle", out, f"x={b}"]) == 0  # a run of the same name is replaced
    assert render_tables.load_launches(out, "x") == two["launches"]
    capsys.readouterr()
    # Refused: a bad name, a set as a run, a file that is not a set as OUT, a pair without a name.
    assert render_tables.main(["--bundle", out, f"a b={a}"]) == 2
    assert render_tables.main(["--bundle", out, f"z={out}"]) == 2
    assert render_tables.main(["--bundle", a, f"z={b}"]) == 2
    with open(a) as fh:
        assert json.load(fh) == one
    try:
        render_tables.main(["--bundle", out, a])
    except SystemExit as exc:
        assert exc.code == 2
    else:
        raise AssertionError("--bundle took a run without a name")


def test_every_result_set_run_is_cited():
    """A run in a result set of benchmarks/results that no table shows would be a file no doc cites."""
    cited = {(spec["source"], spec.get("run")) for doc in render_tables.DOCS for _, spec in _markers(doc)}
    results = os.path.join(REPO, "benchmarks", "results")
    for f in sorted(os.listdir(results)):
        if not f.endswith(".json"):
            continue
        with open(os.path.join(results, f)) as fh:
            doc = json.load(fh)
        if doc.get("schema") == render_tables.SET_SCHEMA:
            for run in doc["runs"]:
                assert (f"benchmarks/results/{f}", run) in cited, (f, run)
