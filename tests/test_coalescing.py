"""Coalescing blocks (startCoalescing .. endCoalescing) on CPU tensors: the group supports them, so
torch's batch_isend_irecv brackets its ops with them and gets one Work for the batch; the ops of
CPU tensors run when issued, and the Work is done when all of them are. PYCOLL_COALESCE_P2P=0
turns support off (one Work per op, as torch issues them). Checked against plain torch values
built from the same seed on every rank, for world sizes 1 to 4; _coalescing_manager with a device
around all_reduce and torch's abort of its groups inside a block are covered too."""
import pytest
import torch
import torch.distributed as dist

from ranks import quiet, run_ranks


def _value(seed, src, dst, i, n, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed * 7919 + src * 131 + dst * 17 + i)
    return torch.randn(n, generator=g).to(dtype)


def _every_peer_batch(rank, world, seed, coalescing):
    """One batch_isend_irecv with a send to and a receive from every rank (itself included), of
    uneven sizes (0 included), into non-contiguous receive tensors; then the same twice more, with
    the Work waited through get_future() once."""
    quiet()
    backend = dist.group.WORLD._get_backend(torch.device("cpu"))
    assert backend.supports_coalescing == coalescing

    def size(src, dst, i):
        return ((src * 5 + dst * 3 + i) % 7) * 1031

    for i in range(3):
        ops, outs = [], {}
        for p in range(world):
            ops.append(dist.P2POp(dist.isend, _value(seed, rank, p, i, size(rank, p, i)), p))
            # A receive into every other element of a larger tensor (non-contiguous).
            outs[p] = torch.full((2 * size(p, rank, i),), -1.0)[::2]
            ops.append(dist.P2POp(dist.irecv, outs[p], p))
        works = dist.batch_isend_irecv(ops)
        assert len(works) == (1 if coalescing else len(ops)), len(works)
        if i == 2:
            for w in works:
                w.get_future().wait()
        for w in works:
            w.wait()
            assert w.is_completed()
        for p in range(world):
            torch.testing.assert_close(outs[p], _value(seed, p, rank, i, size(p, rank, i)), rtol=0, atol=0,
                                       msg=f"rank {rank} from {p}, round {i}")
    return True


@pytest.mark.parametrize("world", (1, 2, 3, 4))
def test_batch_isend_irecv_is_one_work(world, seed):
    assert run_ranks(world, _every_peer_batch, seed, True, timeout=120) == [True] * world


def test_batch_isend_irecv_without_coalescing(seed):
    assert run_ranks(3, _every_peer_batch, seed, False, timeout=120, env={"PYCOLL_COALESCE_P2P": "0"}) == [True] * 3


def _odd_ranks_coalesce(rank, world, seed):
    return _every_peer_batch(rank, world, seed, rank % 2 == 1)


def test_ranks_may_differ_in_coalescing(seed):
    rank_env = [{"PYCOLL_COALESCE_P2P": str(r % 2)} for r in range(3)]
    assert run_ranks(3, _odd_ranks_coalesce, seed, timeout=120, rank_env=rank_env) == [True] * 3


def _manager_with_device(rank, world, seed):
    """torch's _coalescing_manager with a device: all_reduce calls inside run as one coalesced
    all_reduce, and the block's Work (what cm.wait() waits on) covers it."""
    quiet()
    from torch.distributed.distributed_c10d import _coalescing_manager

    ts = [torch.full((n,), float(rank + 1)) for n in (1, 1000, 33333)]
    with _coalescing_manager(dist.group.WORLD, torch.device("cpu"), async_ops=True) as cm:
        for t in ts:
            dist.all_reduce(t)
    assert len(cm.works) == 1 and cm.works[0] is not None
    cm.wait()
    want = float(world * (world + 1) // 2)
    for t in ts:
        assert torch.all(t == want), (t[:3], want)
    # A block with nothing in it (torch aborts its groups inside one) gives no Work.
    with _coalescing_manager(dist.group.WORLD, torch.device("cpu")):
        pass
    return True


@pytest.mark.parametrize("world", (2, 4))
def test_coalescing_manager_with_a_device(world, seed):
    assert run_ranks(world, _manager_with_device, seed, timeout=120) == [True] * world


def _nested_block_raises(rank, world, seed):
    quiet()
    pg = dist.group.WORLD
    dev = torch.device("cpu")
    pg._start_coalescing(dev)
    with pytest.raises(RuntimeError, match="already has an open coalescing block"):
        pg._start_coalescing(dev)
    assert pg._end_coalescing(dev) is None
    with pytest.raises(RuntimeError, match="endCoalescing without startCoalescing"):
        pg._end_coalescing(dev)
    # The group still works.
    t = torch.ones(3)
    dist.all_reduce(t)
    assert torch.all(t == world)
    return True


def test_a_second_block_or_an_unopened_end_raises(seed):
    assert run_ranks(2, _nested_block_raises, seed, timeout=120) == [True, True]
