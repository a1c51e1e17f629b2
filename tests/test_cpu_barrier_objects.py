"""barrier (sync and async, with a late rank) and the object collectives (all_gather_object,
broadcast_object_list, gather_object) on CPU.
"""

import os
import time

import pytest
import torch
import torch.distributed as dist

from cpu_collectives_util import WORLD_SIZES, Cases
from ranks import quiet, run_ranks


# --------------------------------------------------------------------------
# barrier, object collectives


def _barrier_rank(rank, ws, seed, tmpdir):
    cases = Cases("barrier", rank, ws, seed)
    for rnd in range(3):
        late = rnd % ws
        for async_op in (False, True):
            with cases.case(round=rnd, late_rank=late, async_op=async_op):
                if rank == late:
                    time.sleep(0.4)
                open(os.path.join(tmpdir, f"{rnd}-{async_op}-{rank}"), "w").close()
                w = dist.barrier(async_op=async_op)
                if async_op:
                    w.wait()
                missing = [r for r in range(ws)
                           if not os.path.exists(os.path.join(tmpdir, f"{rnd}-{async_op}-{r}"))]
                if missing:
                    cases.fail("barrier", f"returned before ranks {missing} arrived")
    return cases.finish()


@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_barrier(world_size, seed, tmp_path):
    run_ranks(world_size, _barrier_rank, seed, str(tmp_path))


def _obj(r, salt):
    return {"rank": r, "salt": salt, "list": list(range(r * 3)), "text": "x" * (r * 1000 + 1),
            "nested": {"t": (r, None, 2.5)}, "tensor": torch.arange(r + 1, dtype=torch.int16)}


def _same_obj(a, b):
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same_obj(a[k], b[k]) for k in a)
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)
                and a.dtype == b.dtype and torch.equal(a, b))
    return a == b


def _objects_rank(rank, ws, seed):
    quiet()
    cases = Cases("object collectives", rank, ws, seed)
    with cases.case(op="all_gather_object"):
        out = [None] * ws
        dist.all_gather_object(out, _obj(rank, seed))
        for r in range(ws):
            cases.expect(_same_obj(out[r], _obj(r, seed)), f"object from rank {r}")
    for root in range(ws):
        with cases.case(op="broadcast_object_list", root=root):
            want = [_obj(root, seed), f"root {root}", 12345, None]
            lst = list(want) if rank == root else [None, "junk", 0, 1]
            dist.broadcast_object_list(lst, src=root)
            cases.expect(len(lst) == 4 and all(_same_obj(x, y) for x, y in zip(lst, want)),
                         "broadcast list")
        with cases.case(op="gather_object", root=root):
            out = [None] * ws if rank == root else None
            dist.gather_object(_obj(rank, seed + root), out, dst=root)
            if rank == root:
                for r in range(ws):
                    cases.expect(_same_obj(out[r], _obj(r, seed + root)), f"object from rank {r}")
    return cases.finish()


@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_object_collectives(world_size, seed):
    run_ranks(world_size, _objects_rank, seed)
