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
