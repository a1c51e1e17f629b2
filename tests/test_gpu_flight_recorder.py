"""The flight recorder on CUDA ops (backend/cuda_op_watcher.h): states from the events around each
op's kernels, found by a background thread without synchronizing any stream; GPU durations with
PYCOLL_FR_GPU_TIMING=1. Runs with ranks sharing one GPU where PYCOLL_GPU_WORLD says so."""
import json
import os
import subprocess
import sys
import textwrap
import time

import pytest
import torch
import torch.distributed as dist

from gpu_collectives_util import GPU_MARKS, WORLD, run_bound

pytestmark = GPU_MARKS


def _dump_after(prefix, seconds=5.0):
    """The dump once every entry is completed (the watcher polls every millisecond), at most `seconds`."""
    import pycollectives.trace

    deadline = time.monotonic() + seconds
    while True:
        dump = json.load(open(pycollectives.trace.dump(prefix)))
        if all(e["state"] == "completed" for e in dump["entries"]) or time.monotonic() > deadline:
            return dump
        time.sleep(0.01)


def _cuda_ops(rank, world, prefix):
    import pycollectives.trace

    dev = torch.device("cuda", torch.cuda.current_device())
    # The engine's first op meets the peers, and the first asynchronous one makes the group's
    # communication streams, which waited for the GPU's queued work (about a second below, on an
    # H100 with 2 ranks sharing it): both before the queue below, or the op would have started by
    # the time it returns.
    x = torch.ones(1 << 20, device=dev)
    dist.all_reduce(x, async_op=True).wait()
    torch.cuda.synchronize()
    # A long kernel first on this rank's stream (a spin of about a second, however the GPU is
    # shared): the collective queued behind it must not be recorded as started before the stream
    # reaches it.
    torch.cuda._sleep(2_000_000_000)
    work = dist.all_reduce(x, async_op=True)
    early = json.load(open(pycollectives.trace.dump(prefix)))["entries"][-1]
    work.wait()
    dist.all_reduce(x)  # synchronous: on the caller's stream
    peer = (rank + 1) % world
    if world > 1:
        reqs = [dist.isend(x, peer), dist.irecv(torch.empty_like(x), (rank - 1) % world)]
        for r in reqs:
            r.wait()
    torch.cuda.synchronize()
    return early["state"], _dump_after(prefix)


@pytest.mark.parametrize("timing", ["0", "1"])
def test_cuda_ops_complete_from_their_events(tmp_path, timing):
    prefix = str(tmp_path / "rank_")
    out = run_bound(WORLD, _cuda_ops, prefix, env={"PYCOLL_FR_GPU_TIMING": timing}, timeout=180)
    for rank, (early_state, dump) in enumerate(out):
        # Queued behind a second of GPU work, the async all_reduce was not started at issue.
        assert early_state == "scheduled", early_state
        entries = [e for e in dump["entries"] if e["engine"] == "cuda"]
        names = [e["profiling_name"] for e in entries]
        assert names[:3] == ["pycoll:all_reduce"] * 3, names
        for e in entries:
            assert e["state"] == "completed" and not e["error"], e
            assert e["time_created_ns"] <= e["time_discovered_started_ns"] <= e["time_discovered_completed_ns"]
            assert e["duration_ms"] is not None and e["duration_ms"] >= 0
        if timing == "1":
            # The GPU's time of a 4 MiB all_reduce: well under the host's view of the spin before it.
            first = entries[1]  # the async one queued behind the spin
            host_ms = (first["time_discovered_completed_ns"] - first["time_discovered_started_ns"]) / 1e6
            assert 0 < first["duration_ms"] < 1000 and first["duration_ms"] <= host_ms + 2, (first, host_ms)


def _one_rank_skips(rank, world, prefix):
    import pycollectives.trace

    dev = torch.device("cuda", torch.cuda.current_device())
    dist.all_reduce(torch.ones(16, device=dev))  # every rank: the engine exists
    torch.cuda.synchronize()
    dist.barrier()
    if rank == 0:
        # The peers never join: the kernel's wait ends at the group's timeout with a device error,
        # and the watcher completes the entry with it (no wait() or is_completed() asked).
        dist.all_reduce(torch.ones(1024, device=dev))
        torch.cuda.synchronize()  # returns once the kernel gave up
        deadline = time.monotonic() + 10
        while True:
            entry = json.load(open(pycollectives.trace.dump(prefix)))["entries"][-1]
            if entry["state"] == "completed" or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        return entry
    return None


def test_an_op_that_fails_on_the_gpu_is_recorded_with_its_error(tmp_path):
    import datetime

    out = run_bound(WORLD, _one_rank_skips, str(tmp_path / "rank_"), pg_timeout=datetime.timedelta(seconds=4),
                    env={"PYCOLL_FR_DUMP_ON_ERROR": "0"}, timeout=120, destroy=False)
    entry = out[0]
    assert entry["profiling_name"] == "pycoll:all_reduce" and entry["state"] == "completed", entry
    assert entry["error"], entry  # the engine's device error, e.g. a peer that did not arrive
    assert entry["thread_name"] != "", entry


def _one_rank_queues_two(rank, world, prefix):
    import pycollectives.trace

    dev = torch.device("cuda", torch.cuda.current_device())
    dist.all_reduce(torch.ones(16, device=dev), async_op=True).wait()  # every rank: engine and comm stream
    torch.cuda.synchronize()
    dist.barrier()
    if rank != 0:
        return None
    # The peers never join: the first waits on the GPU until the group's timeout, the second is
    # queued behind it on the comm stream. Only the first has started (its start event, on the
    # caller's stream, fired for both).
    works = [dist.all_reduce(torch.ones(1024, device=dev), async_op=True) for _ in range(2)]
    time.sleep(1.0)  # many polls of the watcher
    entries = json.load(open(pycollectives.trace.dump(prefix)))["entries"][-2:]
    torch.cuda.synchronize()  # both kernels give up at the group's timeout
    del works
    return [e["state"] for e in entries]


def test_only_the_first_queued_async_op_has_started(tmp_path):
    import datetime

    out = run_bound(WORLD, _one_rank_queues_two, str(tmp_path / "rank_"), pg_timeout=datetime.timedelta(seconds=3),
                    env={"PYCOLL_FR_DUMP_ON_ERROR": "0"}, timeout=120, destroy=False)
    assert out[0] == ["started", "scheduled"], out[0]


def _traced_ops(rank, world, prefix):
    import pycollectives.trace

    dev = torch.device("cuda", torch.cuda.current_device())
    for numel in (1024, 1 << 22):  # the LL one-shot, then a channel or LL128 all_reduce
        dist.all_reduce(torch.ones(numel, device=dev))
    x = torch.ones(1 << 20, device=dev)
    peer = (rank + 1) % world
    reqs = [dist.isend(x, peer), dist.irecv(torch.empty_like(x), (rank - 1) % world)]
    for r in reqs:
        r.wait()
    for _ in range(20):  # more traced kernels than the ring keeps
        dist.all_reduce(torch.ones(4096, device=dev))
    torch.cuda.synchronize()
    return _dump_after(prefix)


def test_traced_kernels_become_phases_of_their_ops(tmp_path):
    prefix = str(tmp_path / "rank_")
    # The engine's kernels (the events path of ranks sharing a GPU is not traced).
    out = run_bound(WORLD, _traced_ops, prefix, env={"PYCOLL_CUDA_TRACE": "1", "PYCOLL_CUDA_SAME_DEVICE": "kernels"},
                    timeout=180)
    for dump in out:
        cuda = [e for e in dump["entries"] if e["engine"] == "cuda"]
        traced = [e for e in cuda if e.get("cta_phases")]
        # The engine keeps its last 16 traced kernels; every send, receive and all_reduce is traced.
        assert len(traced) == 16 and traced == cuda[-16:], [e["record_id"] for e in traced]
        for e in traced:
            kernels = [p for p in e["cta_phases"] if p["name"] == "kernel"]
            assert kernels and len({p["cta"] for p in kernels}) == len(kernels), e["cta_phases"][:4]
            for p in e["cta_phases"]:
                assert p["start_ns"] <= p["end_ns"]
                # On the wall clock of the op's own times, within the clock mapping's error.
                assert e["time_created_ns"] - 5_000_000 <= p["start_ns"] <= e["time_discovered_completed_ns"] + 5_000_000
    # The timeline shows them as child slices of their ops.
    res = subprocess.run([sys.executable, "-m", "pycollectives.trace", "timeline", str(tmp_path), "-o",
                          str(tmp_path / "job.json")], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    events = json.load(open(tmp_path / "job.json"))
    events = events["traceEvents"] if isinstance(events, dict) else events
    assert any(ev.get("cat") == "cta" for ev in events)


_CUDA_RECORD_COST = textwrap.dedent("""
    import json, torch
    import pycollectives._C as C
    costs = [C.flight_recorder_cuda_bench(20000) for _ in range(5)]
    entries = [e for e in json.loads(C.flight_recorder_json())["entries"]
               if e["process_group"][0] == "flight_recorder_cuda_bench"]
    print(json.dumps({"costs": costs, "states": sorted({e["state"] for e in entries}), "n": len(entries)}))
""")


def test_recording_cuda_ops_costs_the_host_little():
    """The record path on CUDA tensors (entry, pooled events, the watcher), directly: the issue's goal
    is 1 us of host time per op; the bound here leaves room for a loaded machine. Every op it
    recorded is completed, by the watcher from its events or at once."""
    import pycollectives._C as C

    assert hasattr(C, "flight_recorder_cuda_bench"), "this build has no CUDA engine, yet a GPU is visible"
    res = subprocess.run([sys.executable, "-c", _CUDA_RECORD_COST], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYCOLL_FR_BUFFER_SIZE": "2000"})
    assert res.returncode == 0, res.stdout + res.stderr
    out = json.loads(res.stdout.strip().splitlines()[-1])
    best = {k: min(c[k] for c in out["costs"]) for k in out["costs"][0]}
    print("record path on CUDA tensors, ns per op: " + ", ".join(f"{k} {v:.0f}" for k, v in best.items()))
    assert best["sync_ns"] < 5000 and best["async_ns"] < 5000, out["costs"]
    assert out["n"] == 2000 and out["states"] == ["completed"], out
