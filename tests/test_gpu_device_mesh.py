"""init_process_group(device_id=...) on the CUDA engine: the engine is made at init (eager
connection), so a send between two ranks can be a group's first CUDA op while the other ranks issue
none; and DeviceMesh, which then makes its groups with split_group, runs collectives on each mesh
dimension.
"""
import os
import tempfile

import torch
import torch.distributed as dist

from gpu_collectives_util import GPU_MARKS, PG_TIMEOUT, WORLD, run_as_script, setup_device
from ranks import run_ranks

pytestmark = GPU_MARKS


def _mesh_rank(rank, world, store_dir):
    dev = setup_device(rank)
    store = dist.FileStore(os.path.join(store_dir, "store"), world)
    dist.init_process_group("pycoll", store=store, rank=rank, world_size=world, timeout=PG_TIMEOUT, device_id=dev)
    # Without the engine made at init, rank 0's send would wait for the middle ranks' first CUDA op,
    # and they only wait on a CPU barrier: a timeout.
    t = torch.full((1 << 20,), 7.0, device=dev) if rank == 0 else torch.zeros(1 << 20, device=dev)
    if rank == 0:
        dist.send(t, world - 1)
    elif rank == world - 1:
        dist.recv(t, 0)
        assert torch.all(t == 7.0).item()
    torch.cuda.synchronize()
    dist.barrier(group=dist.new_group(backend="gloo"))
    # A new_group without the last rank: with a device bound, torch asks that rank's backend for a
    # "no-color split" (NCCL's collective ncclCommSplit); pycoll's groups are made by members only.
    sub = dist.new_group(list(range(world - 1)))
    if rank < world - 1:
        y = torch.ones(33, device=dev)
        dist.all_reduce(y, group=sub)
        assert torch.all(y == world - 1).item()

    from torch.distributed.device_mesh import init_device_mesh

    shape = (2, world // 2) if world % 2 == 0 and world >= 4 else (1, world)
    mesh = init_device_mesh("cuda", shape, mesh_dim_names=("replicate", "shard"))
    sums = {}
    for name in ("replicate", "shard"):
        group = mesh.get_group(name)
        ranks = dist.get_process_group_ranks(group)
        x = torch.full((4099,), float(rank + 1), device=dev)
        dist.all_reduce(x, group=group)
        want = float(sum(r + 1 for r in ranks))
        assert torch.all(x == want).item(), (name, ranks, x[:3].tolist(), want)
        sums[name] = want
    torch.cuda.synchronize()
    return sums


def test_device_id_engine_at_init_and_device_mesh(seed):
    with tempfile.TemporaryDirectory(prefix="pycoll-mesh-") as store_dir:
        run_ranks(WORLD, _mesh_rank, store_dir, init=None, timeout=180)


if __name__ == "__main__":
    run_as_script(globals())
