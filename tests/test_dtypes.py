"""Data-movement ops move any dtype as bytes (issue 21 item 2): float8, int16, uint16/32/64,
complex, on CPU tensors (and CUDA tensors through the same backend path). Gloo has none of the
float8 or unsigned wide types, so the reference is a plain torch computation: every rank's
input is a known function of its rank. Reductions on dtypes no engine reduces raise a TypeError
naming the dtype."""

import pytest
import torch
import torch.distributed as dist

from gpu_collectives_util import setup_device
from ranks import run_ranks

MOVE_DTYPES = ["float8_e4m3fn", "float8_e5m2", "int16", "uint16", "uint32", "uint64", "complex64"]


def _values(dtype, rank, n, salt=0):
    """n values that identify (rank, salt, position) and survive a round trip through dtype."""
    base = (torch.arange(n, dtype=torch.int64, device=torch.get_default_device()) * 7 + rank * 13 + salt * 5) % 61
    if dtype.is_complex:
        return torch.complex(base.float(), -base.float()).to(dtype)
    return base.to(torch.float32).to(dtype) if dtype.is_floating_point else base.to(dtype)


def _same(a, b):
    # float8 has no equality kernel on CPU: compare the bytes.
    return a.shape == b.shape and torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))


def _moves_any_dtype(rank, ws, name, device="cpu"):
    if device == "cuda":
        # rank r on GPU r % count: ranks share a GPU where PYCOLL_GPU_WORLD is set on fewer GPUs
        torch.set_default_device(setup_device(rank))  # every tensor below, and _values, on this rank's GPU
    dt = getattr(torch, name)
    n = 37
    # all_gather_into_tensor and the list form
    out = torch.empty(n * ws, dtype=dt)
    dist.all_gather_into_tensor(out, _values(dt, rank, n))
    assert _same(out, torch.cat([_values(dt, r, n) for r in range(ws)])), name
    outs = [torch.empty(n, dtype=dt) for _ in range(ws)]
    dist.all_gather(outs, _values(dt, rank, n, 1))
    assert all(_same(outs[r], _values(dt, r, n, 1)) for r in range(ws)), name
    # broadcast from the last rank, non-contiguous on every rank
    t = torch.empty(2 * n, dtype=dt)[::2]
    t.copy_(_values(dt, rank, n, 2))
    dist.broadcast(t, src=ws - 1)
    assert _same(t, _values(dt, ws - 1, n, 2)), name
    # uneven all_to_all_single: rank r sends r + q + 1 rows to rank q, zero rows to itself on rank 0
    send_splits = [0 if (rank == 0 and q == 0) else rank + q + 1 for q in range(ws)]
    recv_splits = [0 if (rank == 0 and q == 0) else q + rank + 1 for q in range(ws)]
    src = _values(dt, rank, sum(send_splits), 3)
    dst = torch.empty(sum(recv_splits), dtype=dt)
    dist.all_to_all_single(dst, src, recv_splits, send_splits)
    off = 0
    for q in range(ws):
        their = _values(dt, q, sum(0 if (q == 0 and p == 0) else q + p + 1 for p in range(ws)), 3)
        start = sum(0 if (q == 0 and p == 0) else q + p + 1 for p in range(rank))
        assert _same(dst[off:off + recv_splits[q]], their[start:start + recv_splits[q]]), (name, q)
        off += recv_splits[q]
    # all_to_all (lists)
    ins = [_values(dt, rank, 3, 10 + q) for q in range(ws)]
    outs = [torch.empty(3, dtype=dt) for _ in range(ws)]
    dist.all_to_all(outs, ins)
    assert all(_same(outs[q], _values(dt, q, 3, 10 + rank)) for q in range(ws)), name
    # scatter and gather with root 0
    got = torch.empty(n, dtype=dt)
    dist.scatter(got, [_values(dt, 0, n, 20 + q) for q in range(ws)] if rank == 0 else None, src=0)
    assert _same(got, _values(dt, 0, n, 20 + rank)), name
    gl = [torch.empty(n, dtype=dt) for _ in range(ws)] if rank == 0 else None
    dist.gather(_values(dt, rank, n, 30), gl, dst=0)
    if rank == 0:
        assert all(_same(gl[r], _values(dt, r, n, 30)) for r in range(ws)), name
    # send/recv around a ring
    if ws > 1:
        nxt, prv = (rank + 1) % ws, (rank - 1) % ws
        r = torch.empty(n, dtype=dt)
        reqs = [dist.isend(_values(dt, rank, n, 40), nxt), dist.irecv(r, prv)]
        for q in reqs:
            q.wait()
        assert _same(r, _values(dt, prv, n, 40)), name
    return True


@pytest.mark.parametrize("ws", [1, 2, 3])
def test_data_movement_takes_any_dtype(ws):
    for name in MOVE_DTYPES:
        assert run_ranks(ws, _moves_any_dtype, name) == [True] * ws


@pytest.mark.gpu
@pytest.mark.shares_gpus
@pytest.mark.pycoll_only
def test_data_movement_takes_any_dtype_on_cuda():
    # all_gather, broadcast and all_to_all run on the CUDA engine; scatter, gather through host memory.
    for name in MOVE_DTYPES:
        assert run_ranks(2, _moves_any_dtype, name, "cuda") == [True, True]


def _reduction_rejects(rank, ws, name):
    dt = getattr(torch, name)
    t = _values(dt, rank, 5)
    for call in (lambda: dist.all_reduce(t), lambda: dist.reduce_scatter_tensor(torch.empty(5, dtype=dt),
                                                                                 _values(dt, rank, 5 * ws))):
        with pytest.raises(TypeError) as info:
            call()
        assert "unsupported dtype" in str(info.value) and "reduction" in str(info.value), str(info.value)
    dist.barrier()  # the group is still usable after the rejected calls
    return True


def test_reductions_name_an_unsupported_dtype():
    assert run_ranks(2, _reduction_rejects, "uint32") == [True, True]


R = dist.ReduceOp
NARROW_REDUCE = {"int16": (R.SUM, R.PRODUCT, R.MIN, R.MAX, R.BAND, R.BOR, R.BXOR),
                 "float8_e4m3fn": (R.SUM, R.AVG, R.PRODUCT, R.MIN, R.MAX),
                 "float8_e5m2": (R.SUM, R.AVG, R.PRODUCT, R.MIN, R.MAX)}


def _small(dt, rank, n, salt):
    # Values in -2..2: every sum and product of up to 4 ranks is exact in both float8 formats, so
    # the reference (float32 arithmetic, one rounding) is exact too.
    g = torch.Generator().manual_seed(97 * rank + 13 * salt + n)
    return torch.randint(-2, 3, (n,), generator=g).to(torch.float32).to(dt)


def _torch_reduce(xs, op, dt, ws):
    acc = [x.float() if dt.is_floating_point else x.to(torch.int64) for x in xs]
    out = acc[0].clone()
    for a in acc[1:]:
        if op in (R.SUM, R.AVG):
            out = out + a
        elif op == R.PRODUCT:
            out = out * a
        elif op == R.MIN:
            out = torch.minimum(out, a)
        elif op == R.MAX:
            out = torch.maximum(out, a)
        elif op == R.BAND:
            out = out & a
        elif op == R.BOR:
            out = out | a
        else:
            out = out ^ a
    if op == R.AVG:
        out = out / ws
    return out.to(dt)


def _reduces_narrow_dtypes(rank, ws, name, algo):
    import pycollectives

    pycollectives.set_algo(algo)
    dt = getattr(torch, name)
    for op in NARROW_REDUCE[name]:
        for n in (0, 1, 7, 1031, 70001):
            xs = [_small(dt, r, n, 1) for r in range(ws)]
            t = xs[rank].clone()
            dist.all_reduce(t, op=op)
            assert _same(t, _torch_reduce(xs, op, dt, ws)), (name, op, n, algo)
            # reduce_scatter_tensor: rank r keeps block r of the reduction
            big = [_small(dt, r, n * ws, 2) for r in range(ws)]
            out = torch.empty(n, dtype=dt)
            dist.reduce_scatter_tensor(out, big[rank], op=op)
            assert _same(out, _torch_reduce(big, op, dt, ws)[rank * n:(rank + 1) * n]), (name, op, n, "rs", algo)
            # reduce to the last rank
            y = xs[rank].clone()
            dist.reduce(y, dst=ws - 1, op=op)
            if rank == ws - 1:
                assert _same(y, _torch_reduce(xs, op, dt, ws)), (name, op, n, "reduce", algo)
    return True


@pytest.mark.parametrize("ws", [1, 2, 3])
@pytest.mark.parametrize("algo", ["auto", "ring", "tree"])
def test_int16_and_float8_reductions(ws, algo):
    # float8 accumulates in float32 and rounds once (NCCL 2.24+ reduces float8 too).
    for name in NARROW_REDUCE:
        assert run_ranks(ws, _reduces_narrow_dtypes, name, algo) == [True] * ws
