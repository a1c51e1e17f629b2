"""Process-group initialisation (env://, store=, file://, tcp://, torchrun),
groups, and the spawn helper itself."""

import importlib.util
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import torch
import torch.distributed as dist

from ranks import BACKEND, RankError, free_port, run_ranks


def _check_world(rank, ws):
    assert dist.is_initialized()
    assert dist.get_backend() == BACKEND, dist.get_backend()
    assert dist.get_backend(dist.group.WORLD) == BACKEND
    assert dist.get_rank() == rank and dist.get_world_size() == ws
    for n in (0, 7, 1031):
        t = torch.full((n,), float(rank + 1))
        dist.all_reduce(t)
        assert torch.equal(t, torch.full((n,), ws * (ws + 1) / 2)), t[:4]
    out = [None] * ws
    dist.all_gather_object(out, ("rank", rank))
    assert out == [("rank", r) for r in range(ws)], out
    return rank


# --------------------------------------------------------------------------
# ways to initialise


def _init_env_rank(rank, ws, explicit):
    os.environ["RANK"] = str(rank)
    os.environ["WORLD_SIZE"] = str(ws)
    if explicit:
        dist.init_process_group(BACKEND, init_method="env://")
    else:
        dist.init_process_group(BACKEND)  # env:// is the default
    return _check_world(rank, ws)


@pytest.mark.parametrize("explicit", [False, True], ids=["default", "env://"])
@pytest.mark.parametrize("world_size", [2, 3])
def test_init_env(world_size, explicit):
    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": free_port()}
    assert run_ranks(world_size, _init_env_rank, explicit, init=None, env=env) == list(
        range(world_size))


@pytest.mark.parametrize("store", ["file", "tcp"])
@pytest.mark.parametrize("world_size", [1, 2, 4])
def test_init_store(world_size, store):
    # run_ranks passes store=FileStore(...) or store=TCPStore(...) (hosted here)
    assert run_ranks(world_size, _check_world, init=store) == list(range(world_size))


def _init_method_rank(rank, ws, url):
    dist.init_process_group(BACKEND, init_method=url, rank=rank, world_size=ws)
    return _check_world(rank, ws)


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_init_file_method(world_size, tmp_path):
    url = f"file://{tmp_path}/rendezvous"
    assert run_ranks(world_size, _init_method_rank, url, init=None) == list(range(world_size))


def test_init_tcp_method():
    url = f"tcp://127.0.0.1:{free_port()}"
    assert run_ranks(2, _init_method_rank, url, init=None) == [0, 1]


# --------------------------------------------------------------------------
# groups


def _groups_rank(rank, ws, rounds):
    import itertools

    specs = [list(p) for p in itertools.combinations(range(ws), 2)]
    specs += [list(range(ws)), list(range(ws - 1))]
    groups = [dist.new_group(s) for s in specs]  # every rank creates every group
    for s, g in zip(specs, groups):
        if rank in s:
            assert dist.get_backend(g) == BACKEND, dist.get_backend(g)
            assert g.size() == len(s) and dist.get_rank(g) == s.index(rank)

    def value(r, k, rnd):  # what rank r contributes to group k in round rnd
        return float((r + 1) * (k + 3) + 1000 * rnd)

    for rnd in range(rounds):
        # Issue asynchronously on every group this rank belongs to (the same
        # global order on every rank), interleaved with world ops, then wait
        # in reverse order.
        pending = []
        w_world = torch.full((1031,), float(rank + rnd))
        pending.append(("world", dist.all_reduce(w_world, async_op=True), w_world,
                        float(sum(r + rnd for r in range(ws)))))
        for k, (s, g) in enumerate(zip(specs, groups)):
            if rank not in s:
                continue
            n = 7 + 1024 * (k % 3)
            t = torch.full((n,), value(rank, k, rnd))
            pending.append((f"group {s} all_reduce", dist.all_reduce(t, group=g, async_op=True),
                            t, sum(value(r, k, rnd) for r in s)))
            src = s[-1]
            b = torch.full((5,), value(rank, k, rnd))
            pending.append((f"group {s} broadcast from {src}",
                            dist.broadcast(b, src=src, group=g, async_op=True),
                            b, value(src, k, rnd)))
        for what, work, t, want in reversed(pending):
            work.wait()
            assert torch.equal(t, torch.full_like(t, want)), (
                f"round {rnd} {what}: got {t[:3].tolist()}, expected {want}")
        # Point to point inside a group, addressed by global rank.
        s, g = specs[0], groups[0]
        if rank in s:
            peer = s[1] if rank == s[0] else s[0]
            got = torch.empty(3)
            req = dist.irecv(got, src=peer, group=g, tag=rnd)
            dist.send(torch.full((3,), float(rank + rnd)), dst=peer, group=g, tag=rnd)
            req.wait()
            assert torch.equal(got, torch.full((3,), float(peer + rnd))), got
    for g in groups:
        if g != dist.GroupMember.NON_GROUP_MEMBER:
            dist.destroy_process_group(g)
    _check_world(rank, ws)


@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_groups_do_not_interfere(world_size):
    run_ranks(world_size, _groups_rank, 4, timeout=180)


# --------------------------------------------------------------------------
# torchrun

TORCHRUN_SCRIPT = textwrap.dedent("""
    import os
    import torch
    import torch.distributed as dist

    backend = os.environ["PYCOLL_TEST_BACKEND"]
    if backend == "pycoll":
        import pycollectives  # registers "pycoll"
    dist.init_process_group(backend)  # torchrun's env://, nothing else
    r, w = dist.get_rank(), dist.get_world_size()
    assert dist.get_backend() == backend, dist.get_backend()
    t = torch.full((1031,), float(r + 1))
    dist.all_reduce(t)
    assert torch.equal(t, torch.full((1031,), w * (w + 1) / 2)), t[:4]
    out = [None] * w
    dist.all_gather_object(out, os.environ["LOCAL_RANK"])
    dist.destroy_process_group()
    print(f"torchrun-ok rank={r} world={w} local_ranks={out}", flush=True)
""")


def test_torchrun(tmp_path):
    script = tmp_path / "tiny.py"
    script.write_text(TORCHRUN_SCRIPT)
    env = _python_env()
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           "--nproc_per_node=2", str(script)]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True, cwd=tmp_path)
    try:
        out, _ = proc.communicate(timeout=180)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"torchrun did not finish in 180s:\n{out[-4000:]}")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 0, f"torchrun exit {proc.returncode}:\n{out[-4000:]}"
    for r in range(2):
        assert f"torchrun-ok rank={r} world=2 local_ranks=['0', '1']" in out, out[-4000:]


# --------------------------------------------------------------------------
# normal interpreter exit (run_ranks' children leave through os._exit, like
# every multiprocessing child, so they never run the interpreter's teardown)

EXIT_SCRIPT = textwrap.dedent("""
    import os, sys, datetime
    import torch
    import torch.distributed as dist

    backend = os.environ["PYCOLL_TEST_BACKEND"]
    if backend == "pycoll":
        import pycollectives
    rank, ws = int(sys.argv[1]), int(sys.argv[2])
    store = dist.FileStore(sys.argv[3], ws)
    dist.init_process_group(backend, store=store, rank=rank, world_size=ws,
                            timeout=datetime.timedelta(seconds=60))
    works = [dist.all_reduce(torch.ones(n), async_op=True) for n in (7, 1031, 1 << 20)]
    for w in works:
        w.wait()
    t = torch.ones(1031)
    dist.all_reduce(t)
    assert t[0].item() == ws, t[0]
    dist.barrier()
    if sys.argv[4] == "destroy":
        dist.destroy_process_group()
    print(f"exit-ok rank={rank}", flush=True)
""")


def _python_env():
    env = dict(os.environ, PYCOLL_TEST_BACKEND=BACKEND, OMP_NUM_THREADS="1")
    spec = importlib.util.find_spec("pycollectives")
    if spec is not None and spec.submodule_search_locations:
        root = os.path.dirname(list(spec.submodule_search_locations)[0])
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
    return env


def _script_ranks_exit_ok(script, ws, rounds, store_dir, *extra, what=""):
    """`rounds` launches of `script` as ws plain processes (rank, ws, store path, *extra); every
    rank must print its exit-ok line and exit 0 within 120 s."""
    for rnd in range(rounds):
        store = store_dir / f"store{rnd}"
        procs = [subprocess.Popen([sys.executable, str(script), str(r), str(ws), str(store), *extra],
                                  env=_python_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                  start_new_session=True)
                 for r in range(ws)]
        outs = []
        try:
            for p in procs:
                outs.append(p.communicate(timeout=120)[0])
        except subprocess.TimeoutExpired:
            pytest.fail(f"round {rnd}: a rank did not exit within 120s")
        finally:
            for p in procs:
                if p.poll() is None:
                    os.killpg(p.pid, signal.SIGKILL)
                    p.wait()
        for r, (p, out) in enumerate(zip(procs, outs)):
            assert p.returncode == 0 and f"exit-ok rank={r}" in out, (
                f"round {rnd}{what}: rank {r} exited with {p.returncode}:\n{out[-3000:]}")


@pytest.mark.parametrize("teardown", ["destroy", "no-destroy"])
def test_normal_interpreter_exit(tmp_path, teardown):
    """Plain processes that init, communicate and return from the script,
    with or without destroy_process_group, exit 0 (no abort, no hang)."""
    script = tmp_path / "exit.py"
    script.write_text(EXIT_SCRIPT)
    # An abort at exit may be intermittent.
    _script_ranks_exit_ok(script, 2, 2 if teardown == "destroy" else 1, tmp_path, teardown, what=f" ({teardown})")


PENDING_AT_EXIT_SCRIPT = textwrap.dedent("""
    import os, sys, datetime
    import torch
    import torch.distributed as dist
    import pycollectives

    rank, ws = int(sys.argv[1]), int(sys.argv[2])
    store = dist.FileStore(sys.argv[3], ws)
    dist.init_process_group("pycoll", store=store, rank=rank, world_size=ws,
                            timeout=datetime.timedelta(seconds=60))
    keep = []
    for i in range(40):
        t = torch.ones(1031 + i)
        w = dist.all_reduce(t, async_op=True)
        keep.append(w.get_future().then(lambda f: f.value()[0].sum()))
        del t
    for k in keep[:-5]:  # the last ones are still settling on pycoll's threads at exit
        k.wait()
    peer = 1 - rank  # point-to-point requests still on the CPU engine's lane threads at exit
    sends = [dist.isend(torch.full((1000,), float(i)), peer, tag=i) for i in range(10)]
    recvs = [dist.irecv(torch.empty(1000), peer, tag=i) for i in range(10)]
    for r in recvs[:-3]:
        r.wait()
    print(f"exit-ok rank={rank}", flush=True)
""")


@pytest.mark.pycoll_only
def test_exit_while_completions_run(tmp_path):
    """A script that leaves async ops' Future callbacks running and exits without
    destroy_process_group: pycoll's completion threads drop the last references to tensors
    Python has seen. Without the wait at exit (pycollectives/__init__.py, atexit) a thread doing
    so during finalization took the process down ("terminate called without an active
    exception"): 7 of 8 launches of this script failed."""
    script = tmp_path / "pending.py"
    script.write_text(PENDING_AT_EXIT_SCRIPT)
    _script_ranks_exit_ok(script, 2, 3, tmp_path)


# --------------------------------------------------------------------------
# the spawn helper itself (on Gloo, so that it is tested whatever the backend)


def _returns(rank, ws, k):
    return rank * k, torch.full((3,), float(rank))


def _raise_on_rank1(rank, ws):
    if rank == 1:
        raise ValueError("boom from rank 1")
    dist.barrier()  # rank 1 never arrives: the helper must kill this rank


def _hang_on_rank0(rank, ws):
    if rank == 0:
        time.sleep(1000)


def _exit_on_rank1(rank, ws):
    if rank == 1:
        os._exit(3)


def _segfault_on_rank0(rank, ws):
    if rank == 0:
        import ctypes

        ctypes.string_at(0)


def _all_dead(pids):
    for pid in pids:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            continue
        # A zombie would still answer; reaped children do not.
        return False
    return True


def test_helper_returns_values():
    out = run_ranks(3, _returns, 10, backend="gloo")
    assert [k for k, _ in out] == [0, 10, 20]
    for r, (_, t) in enumerate(out):  # tensors outlive the rank that made them
        assert torch.equal(t, torch.full((3,), float(r))), t


def test_helper_reports_exception_with_rank_and_traceback():
    t0 = time.monotonic()
    with pytest.raises(RankError) as ei:
        run_ranks(3, _raise_on_rank1, backend="gloo", grace=2)
    e = ei.value
    assert time.monotonic() - t0 < 30
    assert e.rank == 1 and e.exc_type == "ValueError", (e.rank, e.exc_type)
    text = str(e)
    assert "failed on rank 1 of 3" in text and "boom from rank 1" in text, text
    assert "_raise_on_rank1" in text and "Traceback" in text, text
    assert _all_dead(e.pids)


def test_helper_kills_hung_rank():
    t0 = time.monotonic()
    with pytest.raises(RankError) as ei:
        run_ranks(2, _hang_on_rank0, backend="gloo", init=None, timeout=3)
    took = time.monotonic() - t0
    e = ei.value
    assert 3 <= took < 20, took
    assert "hung" in e.statuses[0] and e.statuses[1] == "ok", e.statuses
    assert "_hang_on_rank0" in str(e), str(e)  # the faulthandler stack
    assert _all_dead(e.pids)


def test_helper_reports_unexpected_exit_and_crash():
    with pytest.raises(RankError) as ei:
        run_ranks(2, _exit_on_rank1, backend="gloo", init=None)
    assert ei.value.rank == 1 and "exit code 3" in ei.value.statuses[1], ei.value.statuses
    with pytest.raises(RankError) as ei:
        run_ranks(2, _segfault_on_rank0, backend="gloo", init=None)
    assert "SIGSEGV" in ei.value.statuses[0], ei.value.statuses
    assert "_segfault_on_rank0" in str(ei.value), str(ei.value)
    # ...and an expected exit is not a failure.
    assert run_ranks(2, _exit_on_rank1, backend="gloo", init=None,
                     expect_exit={1: 3}) == [None, None]


def _debug_detail_subgroup_rank(rank, ws):
    # TORCH_DISTRIBUTED_DEBUG=DETAIL as torch reads it at import: every new group is wrapped in torch's
    # ProcessGroupWrapper, which sets and reads the backend's sequence numbers and checks each
    # collective's fingerprint across ranks through a Gloo helper group.
    dist.set_debug_level(dist.DebugLevel.DETAIL)
    try:
        sub = dist.new_group(ranks=list(range(ws)), backend="pycoll")
        got = [None] * ws
        dist.all_gather_object(got, {"rank": rank}, group=sub)
        t = torch.ones(3)
        dist.all_reduce(t, group=sub)
        dist.destroy_process_group(sub)
        return got, t.tolist()
    finally:
        dist.set_debug_level(dist.DebugLevel.OFF)


@pytest.mark.pycoll_only
def test_debug_detail_wraps_pycoll_groups():
    for got, t in run_ranks(2, _debug_detail_subgroup_rank):
        assert got == [{"rank": 0}, {"rank": 1}] and t == [2.0, 2.0, 2.0]
