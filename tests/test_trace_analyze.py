"""pycoll-trace analyze on synthetic dumps of a 3-rank job (tests/trace_dumps.py): each fault is
named by rank, group, op and sequence number, and only then is the exit status 1."""
import json
import os
import pickle
import subprocess
import sys

from trace_dumps import Job

from pycollectives.trace import analyze, load_dumps
from pycollectives.trace.cli import main

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_cli(folder, capsys):
    rc = main(["analyze", str(folder)])
    out = capsys.readouterr().out
    return rc, out


def problem_lines(out):
    return [l for l in out.splitlines()[1:-1] if not l.startswith("note: ")]


def test_clean_job_exits_0(tmp_path, capsys):
    job = Job()
    for _ in range(5):
        job.coll("all_reduce")
    job.coll("broadcast", sizes=[(7, 3)], dtypes=["Long"])
    job.write(tmp_path)
    rc, out = run_cli(tmp_path, capsys)
    assert rc == 0, out
    assert out.splitlines()[-1] == "no problem found: 3 ranks, 1 group, 6 ops matched"
    assert problem_lines(out) == []


def test_rank_skips_an_all_reduce(tmp_path, capsys):
    job = Job()
    for _ in range(11):
        job.coll("all_reduce")
    job.coll("all_reduce", skip=[1], state="started")  # ranks 0 and 2 wait in #12 for rank 1
    job.write(tmp_path, reason="timeout")
    rc, out = run_cli(tmp_path, capsys)
    assert rc == 1
    assert problem_lines(out) == [
        "group 0 (default_pg): all_reduce #12: ranks 0, 2 entered it (started), "
        "rank 1 never did: its last op in this group is #11 (completed)"]
    assert out.splitlines()[-1] == "1 problem found"
    report = analyze(load_dumps(tmp_path))
    (p,) = report.problems
    assert (p.kind, p.group, p.op, p.seq, p.ranks) == ("missing", "0", "all_reduce", 12, [1])


def test_size_mismatch(tmp_path, capsys):
    job = Job()
    job.coll("all_reduce")
    job.coll("all_reduce")
    job.op(0, "all_reduce")
    job.op(1, "all_reduce", sizes=[(2048,)], state="started")
    job.op(2, "all_reduce")
    job.write(tmp_path)
    rc, out = run_cli(tmp_path, capsys)
    assert rc == 1
    assert problem_lines(out) == [
        "group 0 (default_pg): all_reduce #3: ranks 0, 2 called all_reduce [1024] Float, "
        "rank 1 called all_reduce [2048] Float"]


def test_dtype_mismatch(tmp_path, capsys):
    job = Job()
    job.coll("all_reduce")
    job.op(0, "all_reduce", sizes=[(4, 8)])
    job.op(1, "all_reduce", sizes=[(4, 8)])
    job.op(2, "all_reduce", sizes=[(4, 8)], dtypes=["Half"])
    job.coll("all_reduce", sizes=[(4, 8)], dtypes=["Half"])  # the same later mismatch is counted, not repeated
    job.write(tmp_path)
    rc, out = run_cli(tmp_path, capsys)
    assert rc == 1
    assert problem_lines(out) == [
        "group 0 (default_pg): all_reduce #2: ranks 0, 1 called all_reduce [4, 8] Float, "
        "rank 2 called all_reduce [4, 8] Half"]


def test_different_op_at_one_seq(tmp_path, capsys):
    job = Job()
    job.op(0, "all_reduce")
    job.op(1, "broadcast")
    job.op(2, "all_reduce")
    job.write(tmp_path)
    rc, out = run_cli(tmp_path, capsys)
    assert rc == 1
    assert problem_lines(out) == [
        "group 0 (default_pg): all_reduce/broadcast #1: ranks 0, 2 called all_reduce [1024] Float, "
        "rank 1 called broadcast [1024] Float"]


def test_all_to_all_sizes_may_differ(tmp_path, capsys):
    job = Job()
    for r in range(3):
        job.op(r, "all_to_all", sizes=[(10 + r,)], out_sizes=[(12,)])
    job.write(tmp_path)
    rc, out = run_cli(tmp_path, capsys)
    assert rc == 0, out


def test_rank_without_dump(tmp_path, capsys):
    job = Job()
    job.coll("all_reduce")
    job.coll("all_reduce", state="started")
    job.write(tmp_path, no_dump=[2], reason="timeout")
    rc, out = run_cli(tmp_path, capsys)
    assert rc == 1
    assert problem_lines(out) == [
        "rank 2 left no dump (dead, or the dump did not reach it) (member of group 0 (default_pg))"]
    assert out.splitlines()[0] == "pycoll-trace: 2 dumps (ranks 0, 1), 1 group"
    assert "note: group 0 (default_pg): all_reduce #2: entered by every rank with a dump, completed by none" in out


def test_two_groups_interleaved(tmp_path, capsys):
    job = Job()
    job.group("1", "sub", [0, 2])
    for i in range(4):
        job.coll("all_reduce", "0")
        # group 1's op #3 is skipped by rank 2; its seqs go on alike in both groups on ranks 0, 1
        job.coll("all_gather", "1", skip=[2] if i == 3 else [], sizes=[(16,)],
                 state="started" if i == 3 else "completed")
    job.coll("all_reduce", "0")
    job.write(tmp_path)
    rc, out = run_cli(tmp_path, capsys)
    assert rc == 1
    assert problem_lines(out) == [
        "group 1 (sub): all_gather #4: rank 0 entered it (started), "
        "rank 2 never did: its last op in this group is #3 (completed)"]
    assert "group 0 (default_pg)" not in out


def test_p2p_send_without_recv(tmp_path, capsys):
    job = Job()
    job.coll("all_reduce")
    job.op(0, "send", peer=2)
    job.op(2, "recv", peer=0)
    job.op(0, "send", peer=2, state="started")
    job.op(1, "send", peer=2)
    job.op(2, "recv", peer=1)
    job.write(tmp_path)
    rc, out = run_cli(tmp_path, capsys)
    assert rc == 1
    assert problem_lines(out) == [
        "group 0 (default_pg): send #2 rank 0 -> rank 2 (started): rank 2 never posted the matching recv: "
        "its last recv from rank 0 is #1 (completed); its last op in this group is recv #2 (completed)"]
    p = analyze(load_dumps(tmp_path)).problems[0]
    assert (p.kind, p.op, p.seq, p.ranks) == ("p2p", "send", 2, [2])


def test_p2p_recv_without_send_and_size(tmp_path, capsys):
    job = Job()
    job.op(0, "send", peer=1, sizes=[(8,)])
    job.op(1, "recv", peer=0, sizes=[(4,)])
    job.op(1, "recv", peer=0, state="started")
    job.write(tmp_path)
    rc, out = run_cli(tmp_path, capsys)
    assert rc == 1
    assert problem_lines(out) == [
        "group 0 (default_pg): recv #2 rank 1 <- rank 0 (started): rank 0 never posted the matching send: "
        "its last send to rank 1 is #1 (completed); its last op in this group is send #1 (completed)",
        "group 0 (default_pg): send #1 rank 0 -> rank 1 and its recv #1 differ: rank 0 sent [8] Float, "
        "rank 1 received into [4] Float"]


def test_wrapped_ring(tmp_path, capsys):
    job = Job()
    for _ in range(50):
        job.coll("all_reduce")
    job.write(tmp_path / "clean", ring={1: 10, 2: 25})
    rc, out = run_cli(tmp_path / "clean", capsys)
    assert rc == 0, out
    # only seqs every rank still holds are compared: 41..50
    assert out.splitlines()[-1] == "no problem found: 3 ranks, 1 group, 10 ops matched"

    job.coll("all_reduce", skip=[0], state="started")
    job.write(tmp_path / "hang", ring={0: 5, 1: 10, 2: 25})
    rc, out = run_cli(tmp_path / "hang", capsys)
    assert rc == 1
    assert problem_lines(out) == [
        "group 0 (default_pg): all_reduce #51: ranks 1, 2 entered it (started), "
        "rank 0 never did: its last op in this group is #50 (completed)"]


def test_wrapped_ring_with_nothing_of_a_group_left(tmp_path, capsys):
    job = Job()
    job.group("1", "sub", [0, 1, 2])
    job.coll("barrier", "1", sizes=[], dtypes=[])
    for _ in range(20):
        job.coll("all_reduce", "0")
    job.coll("barrier", "1", sizes=[], dtypes=[], skip=[1], state="started")
    job.write(tmp_path, ring={1: 5})  # rank 1's ring holds nothing of group 1; its pg_status says #1
    rc, out = run_cli(tmp_path, capsys)
    assert rc == 1
    assert problem_lines(out) == [
        "group 1 (sub): barrier #2: ranks 0, 2 entered it (started), "
        "rank 1 never did: its last op in this group is #1 (completed)"]


def test_errors_are_reported(tmp_path, capsys):
    job = Job()
    job.coll("all_reduce")
    job.op(0, "all_reduce", error="timed out waiting for rank 1 after 600000 ms")
    job.op(1, "all_reduce")
    job.op(2, "all_reduce")
    job.write(tmp_path)
    rc, out = run_cli(tmp_path, capsys)
    assert rc == 1
    assert problem_lines(out) == [
        "rank 0: group 0 (default_pg): all_reduce #2 failed: timed out waiting for rank 1 after 600000 ms"]


def test_other_files_are_skipped_and_torch_pickles_read(tmp_path, capsys):
    job = Job(world=2)
    job.coll("all_reduce")
    paths = job.write(tmp_path)
    (tmp_path / "rank_0.tmp123").write_text('{"backend": "pyco')  # a dump being written
    (tmp_path / "notes.json").write_text(json.dumps({"backend": "gloo", "entries": []}))
    (tmp_path / "evil").write_bytes(pickle.dumps(os.system))  # a pickle that asks for a class
    # rank 1 as torch's own recorder would write it: a pickle, named by the file, torch's op names
    data = json.load(open(paths[1]))
    del data["backend"], data["rank"]
    data["entries"][0]["profiling_name"] = "nccl:all_reduce"
    os.remove(paths[1])
    with open(tmp_path / "torch_rank_1", "wb") as f:
        pickle.dump(data, f)
    dumps = load_dumps(tmp_path)
    assert [(d.rank, os.path.basename(d.path)) for d in dumps] == [(0, "rank_0"), (1, "torch_rank_1")]
    assert {os.path.basename(p) for p, _ in dumps.skipped} == {"rank_0.tmp123", "notes.json", "evil"}
    rc, out = run_cli(tmp_path, capsys)
    assert rc == 0, out


def test_no_dump_in_folder(tmp_path, capsys):
    (tmp_path / "x").write_text("hello")
    assert main(["analyze", str(tmp_path)]) == 2
    assert "no flight-recorder dump in" in capsys.readouterr().err


def test_python_dash_m(tmp_path):
    job = Job()
    job.coll("all_reduce")
    job.coll("all_reduce", skip=[2], state="started")
    job.write(tmp_path)
    p = subprocess.run([sys.executable, "-m", "pycollectives.trace", "analyze", str(tmp_path)], cwd=REPO,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 1, p.stderr
    assert "all_reduce #2: ranks 0, 1 entered it (started), rank 2 never did" in p.stdout


def test_dump_on_demand(tmp_path):
    import pycollectives._C as C

    import pycollectives.trace as trace

    if not hasattr(C, "flight_recorder_dump"):  # an extension built before the recorder
        try:
            trace.dump(str(tmp_path / "rank_"))
        except RuntimeError as e:
            assert "flight_recorder_dump is missing" in str(e)
        else:
            raise AssertionError("dump() without the binding did not raise")
        return
    path = trace.dump(str(tmp_path / "rank_"), reason="test")
    assert os.path.dirname(path) == str(tmp_path) and os.path.basename(path).startswith("rank_")
    (d,) = load_dumps(tmp_path)
    assert d.path == path and d.dump_reason == "test" and isinstance(d.entries, list)


def test_wrapped_ring_p2p(tmp_path, capsys):
    job = Job(world=2)
    for _ in range(30):
        job.op(0, "send", peer=1)
        job.op(1, "recv", peer=0)
    job.write(tmp_path / "clean", ring={1: 5})  # rank 1 holds its last 5 recvs; the 25 sends before are unpaired
    rc, out = run_cli(tmp_path / "clean", capsys)
    assert rc == 0, out
    job.op(0, "send", peer=1, state="started")
    job.write(tmp_path / "hang", ring={0: 7, 1: 5})
    rc, out = run_cli(tmp_path / "hang", capsys)
    assert rc == 1
    assert problem_lines(out) == [
        "group 0 (default_pg): send #31 rank 0 -> rank 1 (started): rank 1 never posted the matching recv: "
        "its last recv from rank 0 is #30 (completed); its last op in this group is recv #30 (completed)"]
