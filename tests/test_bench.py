"""pycoll-bench (pycollectives/bench): end-to-end CLI runs on CPU ranks, the checker, the
argument errors, and --calibrate.

The CLI runs pycoll beside gloo when ``import pycollectives`` registers "pycoll", else (the
extension not built yet, or PYCOLL_TEST_BACKEND=gloo) gloo beside gloo, so that the harness
itself can be tested before the backend exists.  40 to 60 s on 2 cores.
"""
import importlib
import json
import os
import subprocess
import sys
import types

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PKG_DIR = os.path.join(REPO, "pycollectives")
SUBPROCESS_TIMEOUT = 240


def _pycoll_available():
    if os.environ.get("PYCOLL_TEST_BACKEND", "pycoll") == "gloo":
        return False
    try:
        import pycollectives  # noqa: F401
        import torch.distributed as dist
    except Exception:
        return False
    return "pycoll" in dist.Backend.backend_list


def _package_importable():
    try:
        import pycollectives  # noqa: F401
        return True
    except Exception:
        return False


PYCOLL = _pycoll_available()
BACKENDS = ["pycoll", "gloo"] if PYCOLL else ["gloo", "gloo"]
LABELS = ["pycoll", "gloo"] if PYCOLL else ["gloo", "gloo#2"]

# When pycollectives/__init__.py cannot import (extension not built), run the CLI through a
# script that installs a bare package object for pycollectives first; spawned ranks re-run
# the script as their __main__, so they get the same package.
_SHIM = """\
import sys, types
pkg = types.ModuleType("pycollectives")
pkg.__path__ = [{pkg_dir!r}]
sys.modules["pycollectives"] = pkg
from pycollectives.bench.cli import main
if __name__ == "__main__":
    sys.exit(main())
"""


def _bench_module(name):
    """pycollectives.bench.<name>, importable even when pycollectives itself is not."""
    if _package_importable():
        return importlib.import_module(f"pycollectives.bench.{name}")
    saved = {k: v for k, v in sys.modules.items() if k == "pycollectives" or k.startswith("pycollectives.")}
    pkg = types.ModuleType("pycollectives")
    pkg.__path__ = [PKG_DIR]
    sys.modules["pycollectives"] = pkg
    try:
        return importlib.import_module(f"pycollectives.bench.{name}")
    finally:
        for k in [k for k in sys.modules if k == "pycollectives"]:
            del sys.modules[k]
        sys.modules.update(saved)


def run_cli(args, tmp_path, env_extra=None):
    env = dict(os.environ)
    env["PYTHONPATH"] = REPO + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.pop("RANK", None)
    env.pop("WORLD_SIZE", None)
    env.update(env_extra or {})
    if _package_importable():
        cmd = [sys.executable, "-m", "pycollectives.bench"]
    else:
        shim = tmp_path / "bench_shim.py"
        shim.write_text(_SHIM.format(pkg_dir=PKG_DIR))
        cmd = [sys.executable, str(shim)]
    return subprocess.run(cmd + list(args), cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=SUBPROCESS_TIMEOUT)


def _describe(proc):
    return f"exit {proc.returncode}\n--- stdout\n{proc.stdout[-4000:]}\n--- stderr\n{proc.stderr[-6000:]}"


def _check_types(obj, spec, where="doc"):
    for key, types_ in spec.items():
        assert key in obj, f"{where}: missing key {key!r}"
        assert isinstance(obj[key], types_), f"{where}.{key}: {type(obj[key]).__name__} is not {types_}"


NUM = (int, float)
OPT_NUM = (int, float, type(None))
OPT_STR = (str, type(None))
ROW_SPEC = {
    "op": str, "bytes": int, "count": int, "dtype": str, "reduce_op": OPT_STR, "label": str, "backend": str,
    "algo": OPT_STR, "mode": str, "inplace": bool, "warmup": int, "iters": int, "time_us": NUM,
    "algbw_gbps": NUM, "busbw_gbps": NUM, "check": OPT_STR, "check_error": OPT_STR, "error": OPT_STR,
    "baseline": str, "time_ratio": OPT_NUM, "busbw_ratio": OPT_NUM,
}
META_SPEC = {
    "card": str, "device": str, "torch": str, "cuda": OPT_STR, "driver": OPT_STR, "hostname": str,
    "date": str, "nproc": int, "world_size": int, "command": str, "argv": list, "launcher": str,
}
ENTRY_SPEC = {"op": str, "algo": str, "alpha_us": NUM, "beta_us_per_byte": NUM, "min_bytes": int, "max_bytes": int}
BASELINE = "gloo"
BUSBW = {"all_reduce": 2 * (2 - 1) / 2, "all_gather": 1 / 2, "reduce_scatter": 1 / 2, "broadcast": 1.0}


def test_cli_end_to_end_json_and_plot(tmp_path):
    out = tmp_path / "results"
    proc = run_cli(["--backends", ",".join(BACKENDS), "--nproc", "2", "-b", "8", "-e", "64K",
                    "--check", "--budget", "0.01", "--out", str(out)], tmp_path)
    assert proc.returncode == 0, _describe(proc)
    assert "busbw GB/s" in proc.stdout and f"x {BASELINE}" in proc.stdout, proc.stdout

    jsons = sorted(out.glob("*.json"))
    pngs = sorted(out.glob("*.png"))
    assert len(jsons) == 1 and len(pngs) == 1, list(out.iterdir())
    assert jsons[0].stem == pngs[0].stem
    date, rest = jsons[0].stem[:10], jsons[0].stem[11:]
    assert date.count("-") == 2 and rest.endswith(f"{'-vs-'.join(BACKENDS)}-np2"), jsons[0].name
    png = pngs[0].read_bytes()
    assert len(png) > 1000 and png[:8] == b"\x89PNG\r\n\x1a\n"

    doc = json.loads(jsons[0].read_text())
    _check_types(doc, {"schema": str, "metadata": dict, "config": dict, "baseline": str, "labels": list,
                       "results": list, "skipped": list, "summary": dict, "files": dict})
    assert doc["schema"] == "pycoll-bench/1"
    meta = doc["metadata"]
    _check_types(meta, META_SPEC, "metadata")
    assert meta["nproc"] == 2 and meta["device"] == "cpu" and "-e 64K" in meta["command"]
    assert doc["labels"] == LABELS and doc["baseline"] == BASELINE
    assert doc["config"]["prewarm_s"] == 1.0  # the default warm-up before the first size is recorded

    sizes = [8 << k for k in range(14)]                      # 8 B .. 64 KiB
    ops = ["all_reduce", "all_gather", "reduce_scatter", "broadcast"]
    rows = doc["results"]
    labels = LABELS + ["floor"]  # CPU runs time the memory floor at each size (bench/floor.py)
    assert len(rows) == len(sizes) * len(ops) * len(labels)
    expected = {(o, s, lb) for o in ops for s in sizes for lb in labels}
    assert {(r["op"], r["bytes"], r["label"]) for r in rows} == expected
    assert "of floor" in proc.stdout, proc.stdout
    floor = {(r["op"], r["bytes"]): r["time_us"] for r in rows if r["label"] == "floor"}
    for r in rows:
        _check_types(r, ROW_SPEC, f"row {r.get('label')} {r.get('op')} {r.get('bytes')}")
        assert r["floor_fraction"] == pytest.approx(floor[r["op"], r["bytes"]] / r["time_us"]), r
        if r["label"] == "floor":
            assert r["error"] is None and r["check"] is None, r
            assert r["floor_fraction"] == pytest.approx(1.0)
        else:
            assert r["error"] is None and r["check"] == "ok", r
        assert r["time_us"] > 0 and r["iters"] >= 3
        assert r["algbw_gbps"] == pytest.approx(r["bytes"] / r["time_us"] / 1e3)
        assert r["busbw_gbps"] == pytest.approx(r["algbw_gbps"] * BUSBW[r["op"]])
        if r["label"] == BASELINE:
            assert r["busbw_ratio"] == pytest.approx(1.0)
        else:
            assert r["busbw_ratio"] > 0 and r["time_ratio"] == pytest.approx(1 / r["busbw_ratio"])
    assert doc["summary"]["check_failures"] == 0 and doc["summary"]["errors"] == 0


def test_rounds_report_the_median(tmp_path):
    """--rounds 3: every row is timed in each of the 3 rounds; its time is their median."""
    import statistics
    out = tmp_path / "results"
    proc = run_cli(["--backends", ",".join(BACKENDS), "--nproc", "2", "-b", "8", "-e", "64", "--ops", "all_reduce",
                    "--rounds", "3", "--check", "--budget", "0.01", "--prewarm", "0", "--out", str(out),
                    "--no-plot"], tmp_path)
    assert proc.returncode == 0, _describe(proc)
    assert "median of 3 rounds" in proc.stdout, proc.stdout
    doc = json.loads(sorted(out.glob("*.json"))[0].read_text())
    assert doc["config"]["rounds"] == 3
    rows = [r for r in doc["results"] if r["label"] != "floor"]
    assert len(rows) == 4 * len(LABELS)  # 8, 16, 32, 64 B
    for r in rows:
        times = r["round_times_us"]
        assert len(times) == 3 and all(t > 0 for t in times), r
        assert r["time_us"] == pytest.approx(statistics.median(times))
        assert r["algbw_gbps"] == pytest.approx(r["bytes"] / r["time_us"] / 1e3)
        assert r["check"] == "ok" and r["error"] is None


def test_shared_tensors_rows_are_checked_and_read_in_place(tmp_path):
    """--shared-tensors: every backend's buffers in shared memory, results still checked; pycoll's
    large ops read them in place (the debug log's plan), the JSON says which buffers were timed."""
    out = tmp_path / "results"
    proc = run_cli(["--backends", ",".join(BACKENDS), "--nproc", "2", "-b", "512K", "-e", "512K", "--ops",
                    "all_reduce,reduce_scatter,all_gather,broadcast", "--shared-tensors", "--check", "--budget",
                    "0.01", "--prewarm", "0", "--out", str(out), "--no-plot"], tmp_path,
                   env_extra={"PYCOLL_DEBUG": "INFO"})
    assert proc.returncode == 0, _describe(proc)
    assert "buffers in shared memory" in proc.stdout, proc.stdout
    doc = json.loads(sorted(out.glob("*.json"))[0].read_text())
    assert doc["config"]["shared_tensors"] is True
    rows = [r for r in doc["results"] if r["label"] != "floor"]
    assert len(rows) == 4 * len(LABELS)
    assert all(r["check"] == "ok" and r["error"] is None for r in rows), rows
    if PYCOLL:
        for op in ("allreduce", "reduce_scatter", "allgather", "broadcast"):
            assert any(f"] {op} " in line and "plan=mapped in place" in line for line in proc.stderr.splitlines()), (
                op, proc.stderr[-3000:])


def test_async_op_rows_are_checked(tmp_path):
    """--async-op: every collective issued with async_op=True and waited on, results still checked."""
    out = tmp_path / "results"
    proc = run_cli(["--backends", ",".join(BACKENDS), "--nproc", "2", "-b", "4K", "-e", "512K", "-f", "128",
                    "--ops", "all_reduce,reduce,broadcast,all_gather,reduce_scatter,all_to_all", "--async-op",
                    "--check", "--budget", "0.01", "--prewarm", "0", "--out", str(out), "--no-plot"], tmp_path)
    assert proc.returncode == 0, _describe(proc)
    assert "issued with async_op=True" in proc.stdout, proc.stdout
    doc = json.loads(sorted(out.glob("*.json"))[0].read_text())
    assert doc["config"]["async_op"] is True
    rows = [r for r in doc["results"] if r["label"] != "floor"]
    assert len(rows) == 6 * 2 * len(LABELS)
    assert all(r["check"] == "ok" and r["error"] is None for r in rows), rows


def test_three_ranks_round_split_ops_down_to_a_multiple_of_the_world(tmp_path):
    """A split op (one chunk per rank) on 3 ranks runs the largest multiple of 3 elements that fits
    each swept size and records those bytes; a size with fewer elements than ranks is skipped with
    the reason. Results are checked, so a wrong chunking fails here."""
    out = tmp_path / "results"
    proc = run_cli(["--backends", ",".join(BACKENDS), "--nproc", "3", "-b", "8", "-e", "2K", "-f", "4", "--ops",
                    "all_gather,reduce_scatter,all_reduce", "--check", "--budget", "0.01", "--prewarm", "0",
                    "--out", str(out), "--no-plot"], tmp_path)
    assert proc.returncode == 0, _describe(proc)
    doc = json.loads(sorted(out.glob("*.json"))[0].read_text())
    rows = [r for r in doc["results"] if r["label"] != "floor"]
    assert all(r["check"] == "ok" and r["error"] is None for r in rows), rows
    for op in ("all_gather", "reduce_scatter"):
        # 32, 128, 512, 2048 B of float32: 8, 32, 128, 512 elements, down to 6, 30, 126, 510.
        assert sorted({r["bytes"] for r in rows if r["op"] == op}) == [24, 120, 504, 2040], op
        assert all(r["count"] * 4 == r["bytes"] for r in rows if r["op"] == op)
    assert sorted({r["bytes"] for r in rows if r["op"] == "all_reduce"}) == [8, 32, 128, 512, 2048]
    skipped = {(s["op"], s["bytes"]): s["reason"] for s in doc["skipped"]}
    assert skipped == {(op, 8): "8 B holds fewer than 3 4-byte elements (one per rank)"
                       for op in ("all_gather", "reduce_scatter")}, skipped


def test_async_op_call_waits_on_the_work(monkeypatch):
    ops = _bench_module("ops")
    seen = []

    class Work:
        def wait(self):
            seen.append("wait")

    def fake_all_reduce(x, op=None, group=None, async_op=False):
        seen.append(("issue", async_op))
        return Work() if async_op else None

    import torch

    monkeypatch.setattr(ops.dist, "all_reduce", fake_all_reduce)
    coll = ops.AllReduce()
    bufs = {"input": torch.ones(4)}
    coll.bind(bufs, None, ops.REDUCE_OP["sum"], 0, 0, 1)()
    coll.async_op = True
    coll.bind(bufs, None, ops.REDUCE_OP["sum"], 0, 0, 1)()
    assert seen == [("issue", False), ("issue", True), "wait"]


def test_combine_rounds():
    combine = _bench_module("runner").combine_rounds

    def row(t, check="ok", error=None, label="pycoll"):
        return dict(op="all_reduce", bytes=1000, dtype="float32", label=label, mode="eager", time_us=t,
                    algbw_gbps=None if t is None else 1000 / t / 1e3,
                    busbw_gbps=None if t is None else 1000 / t / 1e3 * 0.5,
                    check=check, check_error=None if check != "fail" else "wrong", error=error)

    rounds = [[row(10.0), row(20.0, label="gloo")], [row(30.0), row(40.0, label="gloo", check="fail")],
              [row(20.0, error="boom"), row(None, label="gloo")]]
    a, b = combine(rounds)
    assert a["time_us"] == 20.0 and a["round_times_us"] == [10.0, 30.0, 20.0]
    assert a["algbw_gbps"] == pytest.approx(1000 / 20.0 / 1e3)
    assert a["busbw_gbps"] == pytest.approx(a["algbw_gbps"] * 0.5)
    assert a["error"] == "boom" and a["check"] == "ok"
    assert b["time_us"] == 30.0  # the rounds that timed it: 20 and 40
    assert b["check"] == "fail" and b["check_error"] == "wrong"
    single = [[row(5.0)]]
    assert combine(single) == single[0]
    with pytest.raises(RuntimeError, match="do not line up"):
        combine([[row(1.0), row(2.0, label="gloo")], [row(1.0, label="gloo"), row(2.0)]])
    with pytest.raises(RuntimeError, match="different rows"):
        combine([[row(1.0)], [row(1.0), row(2.0, label="gloo")]])


def test_checker_catches_wrong_result():
    import torch

    checker = _bench_module("checker")
    world, count = 3, 48
    for op in ("all_reduce", "reduce", "broadcast", "all_gather", "reduce_scatter", "all_to_all", "sendrecv", "send",
               "pingpong"):
        for dtype in (torch.float32, torch.bfloat16, torch.int8):
            for reduce_op in ("sum", "prod", "max"):
                ref = checker.expected(op, 1, world, count, dtype, "cpu", reduce_op, root=1)
                assert ref is not None and ref.dtype == dtype
                good = ref.clone()
                assert checker.compare(good, ref) is None
                bad = ref.clone()
                bad[len(bad) // 2] += 1
                msg = checker.compare(bad, ref)
                assert msg is not None and f"index {len(bad) // 2}" in msg, (op, dtype, reduce_op)
    # all_reduce(sum) of the known inputs, computed by hand
    ins = [checker.pattern(r, 0, count, torch.float32, "cpu") for r in range(world)]
    assert torch.equal(checker.expected("all_reduce", 0, world, count, torch.float32, "cpu"), sum(ins))
    # wrong shape, NaN, and avg within / beyond the dtype's tolerance
    ref = checker.expected("all_reduce", 0, world, count, torch.float16, "cpu", "avg")
    assert checker.compare(ref[:-1], ref) is not None
    nan = ref.clone()
    nan[3] = float("nan")
    assert checker.compare(nan, ref, exact=False) is not None
    assert checker.compare(ref * (1 + 1e-3), ref, exact=False) is None
    assert checker.compare(ref + 0.5, ref, exact=False) is not None
    assert checker.expected("reduce", 0, world, count, torch.float32, "cpu", root=1) is None
    # send: rank 2i sends to 2i+1; senders (and the idle last rank of an odd world) check nothing
    assert checker.expected("send", 0, world, count, torch.float32, "cpu") is None
    assert checker.expected("send", 2, world, count, torch.float32, "cpu") is None
    assert torch.equal(checker.expected("send", 1, world, count, torch.float32, "cpu"), ins[0])
    # pingpong: rank 0's buffer goes to rank 1 and back, so both end with it; rank 2 idles
    for r in (0, 1):
        assert torch.equal(checker.expected("pingpong", r, world, count, torch.float32, "cpu"), ins[0])
    assert checker.expected("pingpong", 2, world, count, torch.float32, "cpu") is None


def test_one_direction_send_and_pingpong_rows(tmp_path):
    """`--ops send` times back-to-back dist.send/dist.recv from rank 2i to 2i+1, `pingpong` round
    trips between ranks 0 and 1; both check what the receivers got; with 3 ranks the last idles."""
    proc = run_cli(["--backends", ",".join(BACKENDS), "--nproc", "3", "--ops", "send,pingpong", "-b", "8",
                    "-e", "256K", "-f", "32", "--check", "--budget", "0.01", "--no-save", "--no-progress"], tmp_path)
    assert proc.returncode == 0, _describe(proc)
    for op in ("send", "pingpong"):
        rows = [ln.split() for ln in proc.stdout.splitlines() if ln.startswith(op + " ")]
        timed = [r for r in rows if r[3] != "floor"]
        assert len(timed) == 4 * len(BACKENDS), proc.stdout  # 8 B, 256 B, 8 KiB, 256 KiB
        assert all(r[-1] == "ok" for r in timed), proc.stdout
        # CPU runs time the memory floor of point-to-point too (bench/floor.py: the message's copy).
        assert len([r for r in rows if r[3] == "floor"]) == 4, proc.stdout
    assert "of floor" in proc.stdout, proc.stdout


@pytest.mark.parametrize("argv", [
    ["-b", "1X"],
    ["-b", "1M", "-e", "1K"],
    ["--ops", "all_reduce,nonsense"],
    ["--dtype", "float128"],
    ["-n", "0"],
    ["-f", "1"],
    ["--op", "xor"],
    ["--op", "avg", "--dtype", "int32"],
    ["--backends", "gloo", "--algo", "ring"],
    ["--backends", "nccl", "--device", "cpu"],
    ["--backends", "nosuchbackend"],
    ["--root", "7"],
    ["--graph", "--device", "cpu"],
])
def test_bad_arguments_are_usage_errors(argv, capsys):
    cli = _bench_module("cli")
    with pytest.raises(SystemExit) as info:
        cli.parse_config(["--backends", "gloo,gloo"] + argv if "--backends" not in argv else argv)
    assert info.value.code == 2
    assert "usage: pycoll-bench" in capsys.readouterr().err


# -- ranks sharing GPUs (no GPU needed: the bench's view of torch.cuda is faked) -----------------
def _fake_gpus(monkeypatch, count, launched=None):
    """parse_config sees `count` GPUs; launched=(rank, world, local_world) fakes a torchrun rank."""
    cli = _bench_module("cli")
    monkeypatch.setattr(cli.torch.cuda, "is_available", lambda: count > 0)
    monkeypatch.setattr(cli.torch.cuda, "device_count", lambda: count)
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "PYCOLL_CUDA_SAME_DEVICE"):
        monkeypatch.delenv(var, raising=False)
    if launched:
        rank, world, local_world = launched
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", str(world))
        monkeypatch.setenv("LOCAL_RANK", str(rank % local_world))
        monkeypatch.setenv("LOCAL_WORLD_SIZE", str(local_world))
    return cli


@pytest.mark.pycoll_only
def test_ranks_sharing_a_gpu_run_against_gloo(monkeypatch, capsys):
    cli = _fake_gpus(monkeypatch, 1)
    cfg, launched = cli.parse_config(["--device", "cuda", "--nproc", "2"])
    assert launched is None and cfg.device == "cuda" and cfg.nproc == 2
    assert cfg.backends == ["pycoll", "gloo"]
    assert cfg.gpu_layout == "2 ranks on 1 GPU(s), ranks sharing GPUs"
    assert cfg.same_device == "auto" and cfg.notes == [] and cfg.hint is None
    assert capsys.readouterr().err == ""  # nothing was left out
    monkeypatch.setenv("PYCOLL_CUDA_SAME_DEVICE", " Kernels ")  # read as the extension reads it
    cfg, _ = cli.parse_config(["--device", "cuda", "--nproc", "4"])
    assert cfg.same_device == "kernels" and cfg.gpu_layout.startswith("4 ranks on 1 GPU(s)")
    # One rank per GPU: NCCL stays the comparison and no layout line is printed.
    cli = _fake_gpus(monkeypatch, 2)
    cfg, _ = cli.parse_config(["--device", "cuda", "--nproc", "2"])
    assert cfg.backends == ["pycoll", "nccl"] and cfg.gpu_layout is None and cfg.same_device is None
    cfg, _ = cli.parse_config(["--device", "cuda", "--nproc", "3"])
    assert cfg.backends == ["pycoll", "gloo"] and cfg.gpu_layout == "3 ranks on 2 GPU(s), ranks sharing GPUs"
    # Under torchrun, the ranks of this host (LOCAL_WORLD_SIZE) decide.
    cli = _fake_gpus(monkeypatch, 2, launched=(1, 8, 4))
    cfg, launched = cli.parse_config(["--device", "cuda"])
    assert launched == (1, 8, 1) and cfg.backends == ["pycoll", "gloo"]
    assert cfg.gpu_layout == "4 ranks per host on 2 GPU(s), ranks sharing GPUs"
    cli = _fake_gpus(monkeypatch, 4, launched=(0, 8, 4))
    cfg, _ = cli.parse_config(["--device", "cuda"])
    assert cfg.backends == ["pycoll", "nccl"] and cfg.gpu_layout is None


@pytest.mark.pycoll_only
def test_the_header_says_the_layout_and_the_same_device_path(monkeypatch):
    cli = _fake_gpus(monkeypatch, 1)
    report = _bench_module("report")
    cfg, _ = cli.parse_config(["--device", "cuda", "--nproc", "2", "--backends", "pycoll,nccl,gloo"])
    meta = {"world_size": 2, "device": "cuda", "card": "a GPU", "torch": "x"}
    head = report.format_table([], meta, cfg, "gloo").splitlines()
    assert ("# 2 ranks on 1 GPU(s), ranks sharing GPUs; pycoll runs their CUDA ops auto "
            "(PYCOLL_CUDA_SAME_DEVICE): all_reduce, reduce_scatter, all_gather and broadcast ordered by CUDA IPC "
            "events from a measured size up, everything else through host memory") in head
    assert '# nccl left out: 2 ranks on 1 GPU(s), ranks sharing GPUs, which NCCL refuses ("Duplicate GPU detected")' \
        in head


@pytest.mark.pycoll_only
def test_nccl_is_left_out_where_ranks_share_gpus(monkeypatch, capsys):
    cli = _fake_gpus(monkeypatch, 1)
    cfg, _ = cli.parse_config(["--device", "cuda", "--nproc", "2", "--backends", "pycoll,nccl"])
    assert cfg.backends == ["pycoll"]
    note = 'nccl left out: 2 ranks on 1 GPU(s), ranks sharing GPUs, which NCCL refuses ("Duplicate GPU detected")'
    assert cfg.notes == [note]
    assert capsys.readouterr().err == f"pycoll-bench: {note}; running pycoll\n"
    cfg, _ = cli.parse_config(["--device", "cuda", "--nproc", "2", "--backends", "nccl,pycoll,gloo"])
    assert cfg.backends == ["pycoll", "gloo"] and cfg.notes == [note]
    # Under torchrun only rank 0 says it.
    cli = _fake_gpus(monkeypatch, 1, launched=(1, 2, 2))
    capsys.readouterr()
    cfg, _ = cli.parse_config(["--device", "cuda", "--backends", "pycoll,nccl"])
    assert cfg.backends == ["pycoll"] and cfg.notes == [note] and capsys.readouterr().err == ""


def test_nccl_alone_on_shared_gpus_is_refused(monkeypatch, capsys):
    cli = _fake_gpus(monkeypatch, 1)
    for backends in ("nccl", "nccl,nccl"):
        with pytest.raises(SystemExit) as info:
            cli.parse_config(["--device", "cuda", "--nproc", "2", "--backends", backends])
        err = capsys.readouterr().err
        assert info.value.code == 2 and "usage: pycoll-bench" in err
        assert 'which NCCL refuses ("Duplicate GPU detected")' in err and "--backends pycoll,gloo" in err
    with pytest.raises(SystemExit) as info:  # --link gives each simulated host GPUs of its own
        cli.parse_config(["--device", "cuda", "--nproc", "4", "--hosts", "2", "--link", "1gbit",
                          "--backends", "gloo"])
    assert info.value.code == 2 and "give --nproc at most 1" in capsys.readouterr().err


@pytest.mark.pycoll_only
def test_a_bad_same_device_setting_is_a_usage_error(monkeypatch, capsys):
    cli = _fake_gpus(monkeypatch, 1)
    monkeypatch.setenv("PYCOLL_CUDA_SAME_DEVICE", "fast")
    with pytest.raises(SystemExit) as info:
        cli.parse_config(["--device", "cuda", "--nproc", "2"])
    assert info.value.code == 2
    assert "PYCOLL_CUDA_SAME_DEVICE='fast' is not valid: it must be one of auto, staged, kernels" in capsys.readouterr().err


def test_default_run_on_one_gpu_stays_on_cpu_and_says_how_to_share_it(monkeypatch):
    cli = _fake_gpus(monkeypatch, 1)
    cfg, _ = cli.parse_config(["--backends", "gloo,gloo"])
    assert cfg.device == "cpu" and cfg.nproc == 2 and cfg.gpu_layout is None
    assert cfg.hint.startswith("one GPU visible: ") and "--device cuda --nproc 2 runs two ranks on it" in cfg.hint
    assert cli.gpu_hint("auto", "cpu", 1, None) == cfg.hint
    # Only the default device choice on exactly one GPU, and not under a launcher.
    assert cli.gpu_hint("cpu", "cpu", 1, None) is None
    assert cli.gpu_hint("auto", "cpu", 0, None) is None
    assert cli.gpu_hint("auto", "cuda", 2, None) is None
    assert cli.gpu_hint("auto", "cpu", 1, (0, 2, 0)) is None
    for count in (0, 2):
        cli = _fake_gpus(monkeypatch, count)
        cfg, _ = cli.parse_config(["--backends", "gloo,gloo"] + (["--device", "cpu"] if count else []))
        assert cfg.hint is None


def test_bad_arguments_exit_code_2(tmp_path):
    proc = run_cli(["--backends", "gloo,gloo", "-b", "64K", "-e", "8"], tmp_path)
    assert proc.returncode == 2, _describe(proc)
    assert "usage:" in proc.stderr and "below minimum size" in proc.stderr


def test_sizes():
    sizes = _bench_module("sizes")
    assert sizes.parse_size("8") == 8 and sizes.parse_size("64K") == 65536
    assert sizes.parse_size("1M") == 1 << 20 and sizes.parse_size("1G") == 1 << 30
    assert sizes.parse_size("2KiB") == 2048 and sizes.parse_size("1.5K") == 1536
    assert sizes.size_range(8, 64) == [8, 16, 32, 64]
    assert sizes.size_range(8, 40, step=16) == [8, 24, 40]
    for bad in ("", "K", "1X", "-1", "1.3"):
        with pytest.raises(ValueError):
            sizes.parse_size(bad)


def test_cpu_card_names_the_generation_behind_a_bare_family_name(monkeypatch):
    report = _bench_module("report")
    bare = {"model name": "AMD EPYC", "cpu family": "26", "model": "2"}
    monkeypatch.setattr(report, "_cpuinfo_fields", lambda: bare)
    assert report.cpu_model() == "AMD EPYC family 26 model 2"
    assert report.slugify(report.cpu_model()) == "amd-epyc-family-26-model-2"
    named = {"model name": "Intel(R) Xeon(R) Platinum 8480+ CPU @ 2.00GHz", "cpu family": "6", "model": "143"}
    monkeypatch.setattr(report, "_cpuinfo_fields", lambda: named)
    assert report.cpu_model() == named["model name"]
    caches = report.cpu_caches()
    assert all(k in ("L1d", "L2", "L3", "L4") for k in caches), caches


def _package_files():
    """The files of the package directory tree, and the old calibration file's mtime (None when
    absent): --calibrate must add no file there and rewrite no calibration."""
    out = set()
    for root, dirs, files in os.walk(PKG_DIR):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        out.update(os.path.join(root, f) for f in files if not f.endswith(".pyc"))
    old = os.path.join(PKG_DIR, "cost_model.json")
    return out, (os.stat(old).st_mtime_ns if os.path.exists(old) else None)


def test_calibrate_and_wrong_result(tmp_path):
    """--calibrate writes a schema-valid constants file, by default into this user's cache
    ($XDG_CACHE_HOME/pycollectives), nothing into the package; in the same run a result corrupted
    on purpose (broadcast, on the last rank) fails --check: exit status 1, the row marked 'fail',
    and the failing rows left out of the fit."""
    target = tmp_path / "cache" / "pycollectives" / "cost_model.json"
    before = _package_files()
    proc = run_cli(["--backends", ",".join(BACKENDS), "--ops", "all_reduce,broadcast", "-b", "8", "-e", "32K",
                    "-f", "4", "--budget", "0.01", "--check", "--calibrate", "--no-save",
                    "--inject-fault", "broadcast"], tmp_path, env_extra={"XDG_CACHE_HOME": str(tmp_path / "cache")})
    after = _package_files()
    assert after[0] <= before[0] and after[1] == before[1], \
        f"pycoll-bench --calibrate wrote into the package directory: {sorted(after[0] - before[0])}"
    assert target.exists(), _describe(proc)
    assert f"import pycollectives loads {target}" in proc.stdout, _describe(proc)
    assert proc.returncode == 1, _describe(proc)
    assert "WRONG RESULT" in proc.stderr and "broadcast" in proc.stderr, _describe(proc)
    assert "all_reduce" not in "".join(l for l in proc.stderr.splitlines() if "WRONG RESULT" in l)
    table = [line.split() for line in proc.stdout.splitlines()
             if line.startswith(("all_reduce ", "broadcast ")) and line.split()[3] != "floor"]
    assert table and all(row[-1] == ("ok" if row[0] == "all_reduce" else "fail") for row in table), proc.stdout

    doc = json.loads(target.read_text())
    _check_types(doc, {"device": str, "card": str, "date": str, "command": str, "world_size": int,
                       "entries": list, "reference_entries": list, "units": dict})
    assert doc["device"] == "cpu" and doc["world_size"] == 2 and "--calibrate" in doc["command"]
    if PYCOLL:
        assert doc["entries"], doc
        assert {e["algo"] for e in doc["entries"]} <= {"ring", "tree", "oneshot", "twoshot"}
    else:
        assert doc["entries"] == []
    fits = doc["entries"] + doc["reference_entries"]
    assert BASELINE in {e["algo"] for e in doc["reference_entries"]}
    for e in fits:
        _check_types(e, ENTRY_SPEC, "entry")
        assert e["op"] == "all_reduce", e        # the broadcast rows failed --check: not fitted
        assert e["alpha_us"] >= 0 and e["beta_us_per_byte"] >= 0
        assert e["min_bytes"] == 8 and e["max_bytes"] == 32768


def test_calibrate_out_defaults_to_the_user_cache(tmp_path, monkeypatch):
    """--calibrate-out PATH is written as given; without it, $XDG_CACHE_HOME/pycollectives/, else
    ~/.cache/pycollectives/: never the package directory."""
    cli = _bench_module("cli")
    for var in ("RANK", "WORLD_SIZE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    argv = ["--backends", "gloo,gloo", "--device", "cpu", "--calibrate"]
    cfg, _ = cli.parse_config(argv)
    assert cfg.calibrate_out == str(tmp_path / "xdg" / "pycollectives" / "cost_model.json")
    cfg, _ = cli.parse_config(argv + ["--calibrate-out", str(tmp_path / "mine.json")])
    assert cfg.calibrate_out == str(tmp_path / "mine.json")
    monkeypatch.delenv("XDG_CACHE_HOME")
    cfg, _ = cli.parse_config(argv)
    assert cfg.calibrate_out == str(tmp_path / "home" / ".cache" / "pycollectives" / "cost_model.json")
    assert not cfg.calibrate_out.startswith(PKG_DIR + os.sep)
    with pytest.raises(SystemExit) as exc:  # the file only --calibrate writes
        cli.parse_config(["--backends", "gloo,gloo", "--device", "cpu", "--calibrate-out", "x.json"])
    assert exc.value.code == 2


@pytest.mark.skipif(not PYCOLL, reason="needs the built extension (import pycollectives loads the file)")
def test_import_loads_the_calibration_from_the_user_cache(tmp_path):
    """A fresh `import pycollectives` applies the cache's calibration and, with PYCOLL_DEBUG=INFO,
    names the file once."""
    path = tmp_path / "cache" / "pycollectives" / "cost_model.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"device": "cpu", "card": "test card", "date": "2026-11-27", "entries": [
        {"op": "all_reduce", "algo": "ring", "alpha_us": 3.0, "beta_us_per_byte": 0.001}]}))
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path / "cache"), PYCOLL_DEBUG="INFO")
    env["PYTHONPATH"] = REPO + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.pop("PYCOLL_COST_MODEL", None)
    code = "import pycollectives; print('applied', pycollectives.load_cost_model())"
    proc = subprocess.run([sys.executable, "-c", code], cwd=str(tmp_path), env=env, capture_output=True, text=True,
                          timeout=SUBPROCESS_TIMEOUT)
    assert proc.returncode == 0, _describe(proc)
    assert "applied 1" in proc.stdout, _describe(proc)
    assert proc.stderr.count(f"[pycoll] auto uses the calibration {path} (cpu, test card") == 1, _describe(proc)


def test_fit_alpha_beta_recovers_a_line():
    calibrate = _bench_module("calibrate")
    pts = [(b, 5.0 + 0.01 * b) for b in (8, 64, 512, 4096, 32768)]
    alpha, beta, rel = calibrate.fit_alpha_beta(pts)
    assert alpha == pytest.approx(5.0, rel=1e-6) and beta == pytest.approx(0.01, rel=1e-6) and rel < 1e-9
