"""PYCOLL_CUDA_SAME_DEVICE=events: every rank of the group on one GPU (cuda:0, whatever the GPUs
visible), the path that orders the ranks' streams with CUDA IPC events and host counters instead of
kernels that wait on each other (cuda/same_device_path.h). all_reduce, reduce_scatter, all_gather
and broadcast against torch references, with the default staging buffer and with a small one
(PYCOLL_CUDA_SAME_DEVICE_STAGING_KIB) so that messages take many rounds; asynchronous ops around
compute on the current stream; a peer that exits early makes the others raise within the timeout;
capturing a CUDA graph is refused with a message that names the setting to use.

Run with PYCOLL_GPU_WORLD=2 and 4 on one GPU: python3 -m pytest -q tests/test_gpu_same_device_events.py
"""
import datetime
import os
import time

import torch
import torch.distributed as dist

from gpu_collectives_util import (DTYPES, GPU_MARKS, SIZES, WORLD, R, assert_same_digests,
                                  check_all_gather_odd_offsets, check_close, check_sync_op_on_side_stream, digest,
                                  make_input, op_name, ops_for, reference, run_as_script, run_gpu0,
                                  seeded_matrices)

pytestmark = GPU_MARKS

EVENTS = {"PYCOLL_CUDA_SAME_DEVICE": "events"}
STAGING_KIB = 64  # small: a 1 MiB message takes 16 rounds
SMALL = dict(EVENTS, PYCOLL_CUDA_SAME_DEVICE_STAGING_KIB=str(STAGING_KIB))
# Exercised with the default staging (64 MiB: one round up to 64 MiB) and with the small one.
STAGINGS = (EVENTS, SMALL)
EXIT_TIMEOUT = datetime.timedelta(seconds=10)


def _staging_elems(dtype):
    """Elements of `dtype` in the small staging buffer (one round of all_reduce)."""
    return STAGING_KIB * 1024 // torch.tensor([], dtype=dtype).element_size()


def _sizes(dtype):
    small = os.environ.get("PYCOLL_CUDA_SAME_DEVICE_STAGING_KIB") is not None
    # Just above one round of the small staging buffer: a last round of 3 elements.
    return SIZES + ((_staging_elems(dtype) + 3,) if small else ())


# ---------------------------------------------------------------------------------------------
# all_reduce


def _all_reduce(rank, world, dev, seed):
    out = []
    for dtype in DTYPES:
        for op in ops_for(dtype):
            for numel in _sizes(dtype):
                key = ("sd-ar", str(dtype), op_name(op), numel)
                xs = [make_input(seed, key, q, numel, dtype, dev, op) for q in range(world)]
                t = xs[rank].clone()
                dist.all_reduce(t, op=op)
                check_close(t, reference(xs, op, dtype), dtype, str(key))
                out.append((str(key), digest(t)))
    # In place at an odd offset inside a larger allocation: nothing outside the view is written.
    for numel in (7, 1031, (1 << 16) + 5):
        key = ("sd-ar-offset", numel)
        xs = [make_input(seed, key, q, numel, torch.float16, dev) for q in range(world)]
        base = torch.zeros(numel + 4, dtype=torch.float16, device=dev)
        base[1:numel + 1].copy_(xs[rank])
        dist.all_reduce(base[1:numel + 1], op=R.SUM)
        check_close(base[1:numel + 1], reference(xs, R.SUM, torch.float16), torch.float16, str(key))
        assert not base[0].item() and not base[numel + 1:].any(), key
        out.append((str(key), digest(base)))
    torch.cuda.synchronize()
    return out


def test_all_reduce_every_dtype_op_size(seed):
    for env in STAGINGS:
        assert_same_digests(run_gpu0(_all_reduce, seed, env=env, timeout=900))


# ---------------------------------------------------------------------------------------------
# reduce_scatter, all_gather, broadcast


def _reduce_scatter(rank, world, dev, seed):
    out = []
    for dtype in DTYPES:
        for op in ops_for(dtype):
            for m in (0, 1, 7, 1031, 262147):
                key = ("sd-rs", str(dtype), op_name(op), m)
                xs = [make_input(seed, key, q, world * m, dtype, dev, op) for q in range(world)]
                o = torch.empty(m, dtype=dtype, device=dev)
                dist.reduce_scatter_tensor(o, xs[rank], op=op)
                check_close(o, reference(xs, op, dtype)[rank * m:(rank + 1) * m], dtype, str(key))
                out.append((str(key), digest(o)))
    torch.cuda.synchronize()
    return out


def test_reduce_scatter(seed):
    for env in STAGINGS:
        run_gpu0(_reduce_scatter, seed, env=env, timeout=900)


def _all_gather(rank, world, dev, seed):
    out = []
    for dtype in DTYPES:
        for m in _sizes(dtype):
            key = ("sd-ag", str(dtype), m)
            xs = [make_input(seed, key, q, m, dtype, dev) for q in range(world)]
            o = torch.empty(world * m, dtype=dtype, device=dev)
            dist.all_gather_into_tensor(o, xs[rank])
            check_close(o, torch.cat(xs), dtype, str(key))
            out.append((str(key), digest(o)))
    # Odd offsets for input and output.
    check_all_gather_odd_offsets(seed, "sd-ag-offset", rank, world, dev, (7, 65537))
    torch.cuda.synchronize()
    return out


def test_all_gather(seed):
    for env in STAGINGS:
        assert_same_digests(run_gpu0(_all_gather, seed, env=env, timeout=600))


def _broadcast(rank, world, dev, seed):
    for dtype in (torch.float32, torch.float16, torch.int8, torch.int64, torch.bool):
        for m in _sizes(dtype):
            for root in range(world):
                key = ("sd-bc", str(dtype), m, root)
                want = make_input(seed, key, root, m, dtype, dev)
                t = want.clone() if rank == root else make_input(seed, key + ("mine",), rank, m, dtype, dev)
                dist.broadcast(t, src=root)
                check_close(t, want, dtype, str(key))
    torch.cuda.synchronize()


def test_broadcast(seed):
    for env in STAGINGS:
        run_gpu0(_broadcast, seed, env=env, timeout=600)


# ---------------------------------------------------------------------------------------------
# asynchronous ops and compute on the current stream


def _async_with_compute(rank, world, dev, seed):
    mats = seeded_matrices(seed, world, 512, dev)
    for it in range(3):
        # The input is produced late on the current stream: the collective must wait for it.
        torch.cuda._sleep(20_000_000)
        x = mats[rank] @ mats[rank]
        works, outs = [], []
        for j in range(8):  # several rounds queued before any wait
            y = x + j
            works.append(dist.all_reduce(y, async_op=True))
            outs.append(y)
        gathered = torch.empty(world * 4099, device=dev)
        works.append(dist.all_gather_into_tensor(gathered, torch.full((4099,), float(rank + it), device=dev),
                                                 async_op=True))
        for w in works:
            w.wait()  # the current stream waits, the host does not
        z = [o * 2 for o in outs]  # runs on the current stream after the collectives
        want = sum(m @ m for m in mats)
        for j in range(8):
            torch.testing.assert_close(z[j], 2 * (want + world * j), rtol=1e-4, atol=1e-3,
                                       msg=lambda m: f"iteration {it}, op {j}: {m}")
        want_g = (torch.arange(world, device=dev, dtype=torch.float32) + it).repeat_interleave(4099)
        assert torch.equal(gathered, want_g), f"iteration {it}: all_gather wrong"
    # A side stream as the current stream: a synchronous op is ordered on it.
    check_sync_op_on_side_stream(rank, world, dev, "events path")


def test_async_with_compute(seed):
    for env in STAGINGS:
        run_gpu0(_async_with_compute, seed, env=env, timeout=300)


# ---------------------------------------------------------------------------------------------
# errors


def _peer_exits(rank, world, dev):
    t = torch.ones(1 << 16, device=dev)
    dist.all_reduce(t)
    torch.cuda.synchronize()
    if rank == world - 1:
        os._exit(3)
    t0 = time.monotonic()
    try:
        while time.monotonic() - t0 < EXIT_TIMEOUT.total_seconds() + 20:
            dist.all_reduce(t)
            torch.cuda.synchronize()
    except RuntimeError as e:
        took = time.monotonic() - t0
        msg = str(e)
        assert took < EXIT_TIMEOUT.total_seconds(), f"raised only after {took:.1f}s: {msg}"
        assert "exited" in msg or "timed out" in msg or "was aborted or left the group" in msg, msg
        assert (torch.ones(1000, device=dev) * 2).sum().item() == 2000  # the GPU is usable
        return took
    raise AssertionError("all_reduce kept completing after a peer exited")


def test_peer_exits_early_raises_within_timeout(seed):
    res = run_gpu0(_peer_exits, env=EVENTS, pg_timeout=EXIT_TIMEOUT, timeout=120, destroy=False,
                   expect_exit={WORLD - 1: 3})
    print(f"survivors raised after {[r for r in res if r is not None]} s")


def _capture_refused(rank, world, dev):
    x = torch.ones(4099, device=dev)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        dist.all_reduce(x)  # warm-up outside the graph
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    err = None
    try:
        with torch.cuda.graph(g):
            dist.all_reduce(x)
    except Exception as e:  # noqa: BLE001 - the refusal may come wrapped by the backend or torch
        err = e
    assert err is not None, "capturing a collective of ranks sharing one GPU was not refused"
    msgs = [str(err), str(err.__context__ or "")]
    assert any("PYCOLL_CUDA_SAME_DEVICE=kernels" in m for m in msgs), msgs
    torch.cuda.synchronize()
    # Refused, not broken: the group still works.
    x.fill_(float(rank + 1))
    dist.all_reduce(x)
    torch.cuda.synchronize()
    assert torch.all(x == world * (world + 1) / 2), x[0].item()


def test_graph_capture_refused(seed):
    run_gpu0(_capture_refused, env=EVENTS, timeout=120)


if __name__ == "__main__":  # pragma: no cover - lets the device machine run it without pytest plugins
    run_as_script(globals())
