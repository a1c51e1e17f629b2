"""all_gather and reduce_scatter with one tensor per rank of different sizes (NCCL's all_gather_v and
reduce_scatter_v, which torch offers on NCCL through dist.all_gather / dist.reduce_scatter):
rank r contributes, or receives, its own number of elements. Gloo has no such form, so the
reference is a plain torch computation on every rank's input, rebuilt from the seeds.
"""
import zlib

import pytest
import torch
import torch.distributed as dist

from integration_util import DEVICES, rank_device, require_device
from ranks import run_ranks

pytestmark = pytest.mark.pycoll_only

DTYPES = [torch.float32, torch.bfloat16, torch.int32]


def _sizes(ws):
    # Uneven, one rank with nothing (when there are 3 or more), odd counts.
    return [(0 if (r == 1 and ws > 2) else 3 * r + 5) for r in range(ws)]


def _data(n, dtype, *key):
    g = torch.Generator().manual_seed(zlib.crc32(repr(key).encode()))  # the same in every rank
    return torch.randint(-50, 50, (n,), generator=g).to(dtype)


def _all_gather_v_rank(rank, ws, device, dtype):
    dev = rank_device(rank, device)
    sizes = _sizes(ws)
    mine = _data(sizes[rank], dtype, "ag", rank).to(dev)
    # Non-contiguous outputs: every other column of a wider buffer.
    bufs = [torch.full((n, 2), -7, dtype=dtype, device=dev) for n in sizes]
    outs = [b[:, 0] for b in bufs]
    for async_op in (False, True):
        work = dist.all_gather(outs, mine, async_op=async_op)
        if async_op:
            work.wait()
        for r, n in enumerate(sizes):
            assert torch.equal(outs[r].cpu(), _data(n, dtype, "ag", r)), (r, async_op)
            assert torch.all(bufs[r][:, 1] == -7)  # the other column untouched
    return True


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_all_gather_of_uneven_tensors(device, world_size, dtype):
    require_device(device, world_size)  # a GPU per rank, or ranks sharing one with PYCOLL_GPU_WORLD set
    assert run_ranks(world_size, _all_gather_v_rank, device, dtype, timeout=120) == [True] * world_size


def _reduce_scatter_v_rank(rank, ws, device, dtype, op_name):
    dev = rank_device(rank, device)
    sizes = _sizes(ws)
    ins = [_data(n, dtype, "rs", rank, dst).to(dev) for dst, n in enumerate(sizes)]  # ins[dst]: for rank dst
    out = torch.full((sizes[rank],), -7, dtype=dtype, device=dev)
    dist.reduce_scatter(out, ins, op=getattr(dist.ReduceOp, op_name))
    parts = torch.stack([_data(sizes[rank], dtype, "rs", src, rank).float() for src in range(ws)])
    want = {"SUM": parts.sum(0), "MAX": parts.max(0).values, "AVG": parts.mean(0)}[op_name]
    got = out.cpu().float()
    tol = 0.5 if dtype == torch.bfloat16 else 1e-5
    assert got.shape == want.shape and torch.allclose(got, want.to(dtype).float(), atol=tol), (got, want)
    return True


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
@pytest.mark.parametrize("op_name", ["SUM", "MAX", "AVG"])
def test_reduce_scatter_of_uneven_tensors(device, world_size, op_name):
    require_device(device, world_size)  # a GPU per rank, or ranks sharing one with PYCOLL_GPU_WORLD set
    dtypes = [torch.float32, torch.bfloat16] if op_name == "AVG" else DTYPES
    for dtype in dtypes:
        assert run_ranks(world_size, _reduce_scatter_v_rank, device, dtype, op_name, timeout=120) == [True] * world_size


def _wrong_own_size_rank(rank, ws):
    outs = [torch.empty(4), torch.empty(6)]
    try:
        dist.all_gather(outs, torch.ones(5))  # this rank's own output must take its input
    except ValueError as e:
        return str(e)
    return "no error"


def test_own_output_of_another_size_is_a_clear_error():
    out = run_ranks(2, _wrong_own_size_rank, timeout=60)
    assert "this rank's output tensor (index 0) has 4 elements but the input has 5" in out[0], out
    assert "this rank's output tensor (index 1) has 6 elements but the input has 5" in out[1], out
