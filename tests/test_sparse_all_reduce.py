"""all_reduce of sparse COO tensors (backend/sparse_all_reduce.cpp): what DDP sends for the
gradients of nn.Embedding(sparse=True). Gloo has it, NCCL does not. Checked against a plain torch
sum of every rank's tensor (integer values, so every order of adding gives the same bits), and a
DDP run with a sparse embedding against the same run on Gloo.
"""
import pytest
import torch
import torch.distributed as dist
import torch.nn as nn

from integration_util import DEVICES, compare_backends, rank_device, require_device
from ranks import run_ranks

pytestmark = pytest.mark.pycoll_only


def _sparse(rank, shape, dtype, dense_dims):
    """Rank r's tensor: 2r + 1 entries (none on rank 1 of 3 or more ranks), repeated indices
    (uncoalesced), and `dense_dims` trailing dense dimensions."""
    g = torch.Generator().manual_seed(1000 + rank)
    nnz = 0 if rank == 1 else 2 * rank + 3
    sparse_dims = len(shape) - dense_dims
    idx = torch.stack([torch.randint(0, shape[d], (nnz,), generator=g) for d in range(sparse_dims)])
    vals = torch.randint(-9, 10, (nnz,) + tuple(shape[sparse_dims:]), generator=g).to(dtype)
    return torch.sparse_coo_tensor(idx, vals, shape)


CASES = [((11,), torch.float32, 0), ((7, 5), torch.float64, 0), ((9, 4), torch.float32, 1),
         ((6, 3, 2), torch.int64, 1)]


def _sparse_rank(rank, ws, device):
    dev = rank_device(rank, device)
    out = []
    for shape, dtype, dense_dims in CASES:
        t = _sparse(rank, shape, dtype, dense_dims).to(dev)
        dist.all_reduce(t)
        want = sum(_sparse(r, shape, dtype, dense_dims).to_dense() for r in range(ws))
        assert t.is_sparse and t.is_coalesced() and t.device == dev
        assert torch.equal(t.to_dense().cpu(), want), (shape, dtype)
        out.append((t.indices().cpu(), t.values().cpu()))
    return out


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_sparse_all_reduce_sums_every_ranks_entries(device, world_size):
    require_device(device, world_size)  # a GPU per rank, or ranks sharing one with PYCOLL_GPU_WORLD set
    out = run_ranks(world_size, _sparse_rank, device, timeout=120)
    for got in out[1:]:  # the same indices and values, bit for bit, on every rank
        for (i0, v0), (i, v) in zip(out[0], got):
            assert torch.equal(i0, i) and torch.equal(v0, v)


def _bad_sparse_rank(rank, ws):
    msgs = []
    t = _sparse(rank, (5,), torch.float32, 0)
    try:
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
    except ValueError as e:
        msgs.append(str(e))
    t = _sparse(rank, (5 + rank,), torch.float32, 0)  # a different shape on each rank
    try:
        dist.all_reduce(t)
    except ValueError as e:
        msgs.append(str(e))
    return msgs


def test_sparse_all_reduce_errors_name_the_problem():
    for msgs in run_ranks(2, _bad_sparse_rank, timeout=60):
        assert len(msgs) == 2, msgs
        assert "sparse tensor is reduced with SUM only" in msgs[0]
        assert "sparse tensors differ in shape across ranks" in msgs[1]


class _SparseNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(50, 8, sparse=True)
        self.fc = nn.Linear(8, 1)

    def forward(self, idx):
        return self.fc(self.emb(idx).mean(1))


def _ddp_sparse_embedding(rank, ws, device):
    torch.manual_seed(0)
    model = nn.parallel.DistributedDataParallel(_SparseNet())
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    g = torch.Generator().manual_seed(rank)
    for _ in range(4):
        idx = torch.randint(0, 50, (6, 3), generator=g)
        opt.zero_grad()
        model(idx).pow(2).sum().backward()
        opt.step()
    return [p.detach().clone() for p in model.parameters()]


def test_ddp_with_a_sparse_embedding_matches_gloo():
    res, ref = compare_backends(_ddp_sparse_embedding, device="cpu", world_size=2)
    for got, want in zip(res, ref):
        for a, b in zip(got, want):
            torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)
    assert all(torch.equal(a, b) for a, b in zip(res[0], res[1]))  # the ranks agree
