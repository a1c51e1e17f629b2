"""The flight recorder (csrc/backend/flight_recorder.h): what it records, the dumps every rank writes
when an op fails, and what `pycoll-trace analyze` makes of them; a dead peer left unreaped."""

import datetime
import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import torch
import torch.distributed as dist

from ranks import IS_GLOO, run_ranks

pytestmark = pytest.mark.skipif(IS_GLOO, reason="the flight recorder is pycoll's")

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _wait_for_dumps(prefix, world, seconds):
    """Every rank's dump, as JSON, once all exist (the peers answer a request within about 1 s)."""
    deadline = time.time() + seconds
    paths = [f"{prefix}{r}" for r in range(world)]
    while time.time() < deadline and not all(os.path.exists(p) for p in paths):
        time.sleep(0.05)
    missing = [p for p in paths if not os.path.exists(p)]
    assert not missing, f"no dump after {seconds} s: {missing}"
    return [json.load(open(p)) for p in paths]


def _analyze(directory):
    return subprocess.run([sys.executable, "-m", "pycollectives.trace", "analyze", directory], capture_output=True,
                          text=True, timeout=120, cwd=REPO)


def _skip_one_all_reduce(rank, world, prefix):
    for _ in range(3):
        dist.all_reduce(torch.ones(16))
    t0 = time.time()
    if rank != 1:  # rank 1 skips the fourth all_reduce: the others time out in it
        with pytest.raises(RuntimeError, match="timed out"):
            dist.all_reduce(torch.ones(16))
    dumps = _wait_for_dumps(prefix, world, seconds=20)
    return time.time() - t0, dumps[rank]


def test_a_rank_that_skips_an_op_is_named(tmp_path):
    prefix = str(tmp_path / "rank_")
    out = run_ranks(3, _skip_one_all_reduce, prefix, env={"TORCH_FR_DUMP_TEMP_FILE": prefix, "PYCOLL_FR_STACKS": "1"},
                    pg_timeout=datetime.timedelta(seconds=3), destroy=False, timeout=90)
    for rank, (elapsed, dump) in enumerate(out):
        assert elapsed < 3 + 10, f"rank {rank} saw every dump only after {elapsed:.1f} s"
        assert dump["backend"] == "pycoll" and dump["rank"] == rank and dump["world_size"] == 3
        last = dump["entries"][-1]
        if rank == 1:
            assert last["state"] == "completed" and last["profiling_name"] == "pycoll:all_reduce"
            assert dump["dump_reason"].startswith("peer request: rank ")
        else:
            assert last["state"] == "completed" and "timed out" in last["error"]
            assert dump["dump_reason"].startswith("error: ") or dump["dump_reason"].startswith("peer request")
    hung_seq = out[0][1]["entries"][-1]["collective_seq_id"]
    assert out[1][1]["entries"][-1]["collective_seq_id"] == hung_seq - 1
    res = _analyze(str(tmp_path))
    assert res.returncode == 1, res.stdout + res.stderr
    assert f"#{hung_seq}" in res.stdout and "rank 1" in res.stdout and "all_reduce" in res.stdout, res.stdout
    assert "called from _skip_one_all_reduce (" in res.stdout, res.stdout  # rank 1's last op, from its stack


def _mismatched_size(rank, world, prefix):
    dist.all_reduce(torch.ones(8))
    with pytest.raises(RuntimeError, match="mismatch"):
        dist.all_reduce(torch.ones(16 if rank == 1 else 8))
    return _wait_for_dumps(prefix, world, seconds=15)[rank]


def test_a_size_mismatch_is_named(tmp_path):
    prefix = str(tmp_path / "rank_")
    out = run_ranks(2, _mismatched_size, prefix, env={"TORCH_FR_DUMP_TEMP_FILE": prefix}, destroy=False, timeout=90)
    assert out[1]["entries"][-1]["input_sizes"] == [[16]] and out[0]["entries"][-1]["input_sizes"] == [[8]]
    res = _analyze(str(tmp_path))
    assert res.returncode == 1, res.stdout + res.stderr
    assert "[16]" in res.stdout and "[8]" in res.stdout and "rank 1" in res.stdout, res.stdout


def _mismatched_dtype(rank, world, prefix):
    dist.all_reduce(torch.ones(8))
    with pytest.raises(RuntimeError, match="mismatch"):
        dist.all_reduce(torch.ones(8, dtype=torch.float64 if rank == 1 else torch.float32))
    return _wait_for_dumps(prefix, world, seconds=15)[rank]


def test_a_dtype_mismatch_is_named(tmp_path):
    prefix = str(tmp_path / "rank_")
    run_ranks(2, _mismatched_dtype, prefix, env={"TORCH_FR_DUMP_TEMP_FILE": prefix}, destroy=False, timeout=90)
    res = _analyze(str(tmp_path))
    assert res.returncode == 1, res.stdout + res.stderr
    assert "Double" in res.stdout and "Float" in res.stdout and "rank 1" in res.stdout, res.stdout


def _two_groups_one_rank_gone(rank, world, prefix):
    # Groups {0,1,2} (the world) and {1,2} interleave; rank 0 leaves the job after two ops of the
    # world, without a dump: rank 1's and 2's next world op fails and names it.
    sub = dist.new_group([1, 2])
    for _ in range(2):
        dist.all_reduce(torch.ones(4))
        if rank > 0:
            dist.all_reduce(torch.ones(4), group=sub)
    if rank == 0:
        os._exit(0)
    with pytest.raises(RuntimeError):
        dist.all_reduce(torch.ones(4))
    dist.all_reduce(torch.ones(4), group=sub)  # the sub-group still works
    deadline = time.time() + 15
    while time.time() < deadline and not all(os.path.exists(f"{prefix}{r}") for r in (1, 2)):
        time.sleep(0.05)
    return True


def test_two_groups_and_a_rank_that_left(tmp_path):
    prefix = str(tmp_path / "rank_")
    run_ranks(3, _two_groups_one_rank_gone, prefix, env={"TORCH_FR_DUMP_TEMP_FILE": prefix}, destroy=False,
              timeout=90, expect_exit={0: 0}, pg_timeout=datetime.timedelta(seconds=20))
    assert sorted(os.listdir(tmp_path)) == ["rank_1", "rank_2"]
    dumps = {r: json.load(open(tmp_path / f"rank_{r}")) for r in (1, 2)}
    for d in dumps.values():
        groups = {e["process_group"][0] for e in d["entries"]}
        assert len(groups) == 2, groups  # both groups' ops, told apart
        failed = [e for e in d["entries"] if e["error"]]
        assert len(failed) == 1 and "rank 0" in failed[0]["error"], failed
    res = _analyze(str(tmp_path))
    assert res.returncode == 1, res.stdout + res.stderr
    assert "rank 0 left no dump" in res.stdout, res.stdout


def _recv_without_send(rank, world, prefix):
    dist.all_reduce(torch.ones(4))
    if rank == 1:
        with pytest.raises(RuntimeError):
            dist.recv(torch.empty(4), src=0)
    return _wait_for_dumps(prefix, world, seconds=15)[rank]


def test_a_receive_without_its_send_is_named(tmp_path):
    prefix = str(tmp_path / "rank_")
    out = run_ranks(2, _recv_without_send, prefix, env={"TORCH_FR_DUMP_TEMP_FILE": prefix}, destroy=False,
                    timeout=90, pg_timeout=datetime.timedelta(seconds=3))
    recv = out[1]["entries"][-1]
    assert recv["profiling_name"] == "pycoll:recv" and recv["peer"] == 0 and recv["error"], recv
    res = _analyze(str(tmp_path))
    assert res.returncode == 1, res.stdout + res.stderr
    assert "recv" in res.stdout and "rank 1" in res.stdout, res.stdout


def _clean_job(rank, world, prefix, ops):
    import pycollectives.trace

    sub = dist.new_group([0, 1])
    for i in range(ops):
        t = torch.arange(10, dtype=torch.float64)
        dist.all_reduce(t)
        if i % 5 == 0 and rank < 2:
            dist.all_gather_into_tensor(torch.empty(20, dtype=torch.float64), t, group=sub)
    if rank == 0:
        dist.send(torch.ones(3), 1)
    elif rank == 1:
        dist.recv(torch.empty(3), 0)
    path = pycollectives.trace.dump(prefix)
    return path, json.load(open(path))


@pytest.mark.parametrize("size", [2000, 8])
def test_a_clean_job_records_every_op(tmp_path, size):
    prefix = str(tmp_path / "rank_")
    ops = 20
    out = run_ranks(3, _clean_job, prefix, ops, env={"PYCOLL_FR_BUFFER_SIZE": str(size)}, timeout=90)
    for rank, (path, dump) in enumerate(out):
        assert path == f"{prefix}{rank}"
        entries = dump["entries"]
        ids = [e["record_id"] for e in entries]
        assert ids == list(range(ids[-1] - len(ids) + 1, ids[-1] + 1)), "oldest first, none missing"
        expected = ops + (4 + 1 if rank < 2 else 0)  # all_reduce, the sub-group's all_gathers, the send/recv
        assert ids[-1] == expected and len(entries) == min(size, expected)
        for e in entries:
            assert e["state"] == "completed" and not e["error"]
            assert e["time_created_ns"] <= e["time_discovered_started_ns"] <= e["time_discovered_completed_ns"]
            assert e["duration_ms"] >= 0 and e["engine"] and e["thread_name"] is not None
        reduces = [e for e in entries if e["profiling_name"] == "pycoll:all_reduce"]
        assert reduces and all(e["input_sizes"] == [[10]] and e["input_dtypes"] == ["Double"] for e in reduces)
        assert all(e["algorithm"] for e in reduces)
        assert dump["pg_config"]["0"]["ranks"] == "[0, 1, 2]" and dump["pg_config"]["0"]["desc"] == "default_pg"
        if size == 2000 and rank < 2:
            p2p = [e for e in entries if e["is_p2p"]]
            assert len(p2p) == 1 and p2p[0]["peer"] == 1 - rank and p2p[0]["p2p_seq_id"] == 1
            assert p2p[0]["profiling_name"] == ("pycoll:send" if rank == 0 else "pycoll:recv")
    res = _analyze(str(tmp_path))
    assert res.returncode == 0, res.stdout + res.stderr


def test_recording_is_cheap():
    import pycollectives._C as C

    ns = min(C.flight_recorder_bench(50000) for _ in range(3))
    # The bound is 300 ns on the 2-core machine; a loaded CI machine gets some slack here.
    assert ns < 1500, f"{ns:.0f} ns per op"


_CONCURRENT_DUMPS = textwrap.dedent("""
    import json, threading
    import pycollectives._C as C
    ops, fail_every = 20000, 7
    plan = "allreduce oneshot path=eager lanes=1"
    bench = threading.Thread(target=C.flight_recorder_bench, args=(ops, 3, 2, fail_every))
    bench.start()
    dumps = 0
    def check(dump):
        ids = [e["record_id"] for e in dump["entries"]]
        assert ids == sorted(set(ids)) and len(ids) <= 64, ids
        for status in dump["pg_status"].values():
            assert status["last_completed_collective"] <= status["last_started_collective"], status
            assert status["last_started_collective"] <= status["last_enqueued_collective"], status
        for e in dump["entries"]:
            status = dump["pg_status"][e["process_group"][0]]
            assert e["profiling_name"] == "pycoll:all_reduce" and e["op_id"] == e["collective_seq_id"] > 0, e
            assert e["input_sizes"] == [[3]] and e["output_dtypes"] == ["Float"], e
            assert e["process_group"][0] in ("flight_recorder_bench", "flight_recorder_bench/1"), e
            assert e["collective_seq_id"] <= status["last_enqueued_collective"], (e, status)
            if e["state"] == "scheduled":
                assert e["time_discovered_started_ns"] is None and e["engine"] == "", e
                continue
            assert e["time_created_ns"] <= e["time_discovered_started_ns"], e
            assert (e["engine"], e["algorithm"], e["plan"]) in [("", "", ""), ("cpu", "oneshot", plan)], e
            if e["state"] == "completed":
                assert e["engine"] == "cpu" and e["retired"], e
                assert e["time_discovered_started_ns"] <= e["time_discovered_completed_ns"], e
                failed = e["op_id"] % fail_every == 0
                assert e["error"] == ("bench failure" if failed else ""), e
            else:
                assert e["state"] == "started" and e["error"] == "" and not e["retired"], e
    while bench.is_alive() or dumps == 0:
        check(json.loads(C.flight_recorder_json("test")))
        dumps += 1
    bench.join()
    final = json.loads(C.flight_recorder_json("test"))
    check(final)
    assert len(final["entries"]) == 64 and all(e["state"] == "completed" for e in final["entries"])
    # 100 ops of a third group (named as the first) leave none of the first two in the ring: their
    # pg_status still counts every op. Parsed keeping both values of the name twice in pg_status.
    C.flight_recorder_bench(100, 3)
    def keep_repeats(pairs):
        d = {}
        for k, v in pairs:
            d.setdefault(k, []).append(v)
        return {k: v if len(v) > 1 else v[0] for k, v in d.items()}
    last = json.loads(C.flight_recorder_json("test"), object_pairs_hook=keep_repeats)
    assert {e["process_group"][0] for e in last["entries"]} == {"flight_recorder_bench"}
    status = last["pg_status"]
    done = lambda n: {"last_enqueued_collective": n, "last_started_collective": n, "last_completed_collective": n}
    assert status["flight_recorder_bench"] == [done(ops), done(100)], status
    assert status["flight_recorder_bench/1"] == done(ops), status
    print("DUMPS", dumps)
""")


def test_dumps_taken_while_threads_record_are_consistent(tmp_path):
    # Two threads record, start, plan and complete (some failing) ops into a ring of 64 while
    # the main thread dumps: every dump is valid JSON whose entries are each whole.
    script = tmp_path / "fr_dumps_while_recording.py"
    script.write_text(_CONCURRENT_DUMPS)
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""),
               PYCOLL_FR_BUFFER_SIZE="64")
    res = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, env=env)
    assert res.returncode == 0, res.stdout + res.stderr
    assert int(res.stdout.split("DUMPS ")[1]) > 1, res.stdout


_UNREAPED = textwrap.dedent("""
    import datetime, os, signal, sys, time
    import torch, torch.distributed as dist
    import pycollectives
    rank = int(sys.argv[1])
    dist.init_process_group("pycoll", init_method="file://" + sys.argv[2], rank=rank, world_size=2,
                            timeout=datetime.timedelta(seconds=30))
    for _ in range(5):
        dist.all_reduce(torch.ones(4))
    if rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)  # the parent does not reap it until the end
    t0 = time.time()
    try:
        dist.all_reduce(torch.ones(4))
    except RuntimeError as e:
        print(f"ELAPSED {time.time() - t0:.3f}")
        print("ERROR", str(e).splitlines()[0])
        os._exit(0)
    os._exit(3)
""")


def test_a_peer_killed_and_not_reaped_is_noticed_at_once(tmp_path):
    script = tmp_path / "unreaped.py"
    script.write_text(_UNREAPED)
    store = str(tmp_path / "store")
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    procs = [subprocess.Popen([sys.executable, str(script), str(r), store], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, env=env) for r in range(2)]
    try:
        out, _ = procs[0].communicate(timeout=60)
        # Rank 1 was never waited for: it is a zombie until the end of the test.
        assert procs[1].returncode is None
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGKILL)
            p.wait()
    assert procs[0].returncode == 0, out
    elapsed = float(out.split("ELAPSED ")[1].split()[0])
    assert elapsed < 1.0, out
    assert "rank 1 exited" in out, out


def test_bench_writes_a_timeline_of_its_run(tmp_path):
    out = tmp_path / "run.json"
    res = subprocess.run([sys.executable, "-m", "pycollectives.bench", "--device", "cpu", "--nproc", "2",
                          "--backends", "pycoll", "--ops", "all_reduce,all_gather", "-b", "8", "-e", "1K",
                          "--prewarm", "0", "--budget", "0.005", "--no-save", "--no-progress", "--trace", str(out)],
                         capture_output=True, text=True, timeout=300, cwd=REPO)
    assert res.returncode == 0, res.stdout + res.stderr
    assert f"timeline of" in res.stdout and str(out) in res.stdout, res.stdout
    ops = [e for e in json.load(open(out))["traceEvents"] if e["ph"] == "X" and e.get("cat") == "op"]
    assert {e["pid"] for e in ops} == {0, 1}
    assert {e["args"]["op"] for e in ops} >= {"all_reduce", "all_gather"}
    assert {e["args"]["bytes"] for e in ops if e["args"]["op"] == "all_reduce"} >= {8, 1024}
    assert sorted(os.listdir(str(out) + ".dumps")) == ["rank_0", "rank_1"]


def _dump_through_the_pipe(rank, world, pipe_prefix, dump_prefix):
    for _ in range(2):
        dist.all_reduce(torch.ones(8))
    pipe = f"{pipe_prefix}{rank}.pipe"
    deadline = time.time() + 10
    while not os.path.exists(pipe) and time.time() < deadline:  # made once the rank is known
        time.sleep(0.05)
    assert os.path.exists(pipe), "no named pipe"
    assert not os.path.exists(f"{dump_prefix}{rank}")
    fd = os.open(pipe, os.O_WRONLY | os.O_NONBLOCK)
    os.write(fd, b"1")
    os.close(fd)
    dump = _wait_for_dumps(dump_prefix, world, seconds=10)[rank]
    return [e["state"] for e in dump["entries"]], dump.get("dump_reason", "")


def test_writing_into_the_named_pipe_dumps(tmp_path):
    pipe, prefix = str(tmp_path / "fr_"), str(tmp_path / "dump_")
    env = {"PYCOLL_FR_DUMP_PIPE": pipe, "TORCH_FR_DUMP_TEMP_FILE": prefix}
    for states, reason in run_ranks(2, _dump_through_the_pipe, pipe, prefix, env=env, timeout=60):
        assert states[-2:] == ["completed", "completed"] and "pipe" in reason
    assert not any(p.endswith(".pipe") for p in os.listdir(tmp_path))  # removed at exit


def _a_named_caller(rank, world):
    dist.all_reduce(torch.ones(4))


def _stacks(rank, world, prefix):
    import pycollectives.trace

    for _ in range(3):
        _a_named_caller(rank, world)
    dump = json.load(open(pycollectives.trace.dump(prefix)))
    return [[f["name"] for f in e["frames"]] for e in dump["entries"]], dump["entries"][-1]["frames"][:1]


def test_python_stacks_are_recorded_when_asked(tmp_path):
    prefix = str(tmp_path / "stack_")
    for names, top in run_ranks(2, _stacks, prefix, env={"PYCOLL_FR_STACKS": "1", "PYCOLL_FR_BUFFER_SIZE": "2"},
                                timeout=60):
        assert len(names) == 2 and all("_a_named_caller" in n for n in names), names  # the ring kept 2
        assert top[0]["filename"].endswith(".py") and top[0]["line"] > 0, top
    for names, _ in run_ranks(2, _stacks, prefix, timeout=60):  # off by default
        assert all(n == [] for n in names)


def _outlive_the_store_host(rank, world, port):
    """Rank 0 hosts the TCPStore, destroys the group and leaves; rank 1 destroys it too but keeps
    the group alive (as a DDP model does) past two of the dump watcher's Store polls."""
    dist.init_process_group("pycoll", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    kept = dist.group.WORLD
    dist.all_reduce(torch.ones(4))
    dist.barrier()
    dist.destroy_process_group()
    if rank == 0:
        return None
    time.sleep(2.5)
    del kept
    with open(os.environ["PYCOLL_TEST_LOG"]) as fh:
        return [line for line in fh if "recvValue failed" in line or "Connection was likely closed" in line]


def test_a_destroyed_group_is_not_watched_once_its_store_is_gone():
    # Once the group is destroyed, the dump watcher polls its Store no more: polls of a Store whose
    # host left made torch log a stack trace per poll at the end of every such job.
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = run_ranks(2, _outlive_the_store_host, port, init=None, destroy=False, timeout=60)
    assert out[1] == [], out[1]
