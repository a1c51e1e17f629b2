"""One rank of a job launched by torchrun on two simulated hosts (tests/test_multihost_torchrun.py):
the README's multi-host command, run for real. Checks the ops against plain torch computations and
prints one line the test reads."""
import os
import sys

import torch
import torch.distributed as dist

import pycollectives  # noqa: F401  (registers "pycoll")


def main():
    # --cuda: CUDA tensors, one GPU per local rank of this agent's CUDA_VISIBLE_DEVICES.
    on_gpu = "--cuda" in sys.argv
    dev = torch.device("cuda", int(os.environ["LOCAL_RANK"])) if on_gpu else torch.device("cpu")
    if on_gpu:
        torch.cuda.set_device(dev)
        dist.init_process_group("pycoll", device_id=dev)
    else:
        dist.init_process_group("pycoll")
    rank, ws = dist.get_rank(), dist.get_world_size()
    for n in (0, 1, 7, 1031, 1 << 16, (1 << 20) + 3):
        t = torch.full((n,), float(rank + 1), device=dev)
        dist.all_reduce(t)
        assert torch.equal(t.cpu(), torch.full((n,), float(ws * (ws + 1) // 2))), ("all_reduce", n)
        out = torch.empty(n * ws, device=dev)
        dist.all_gather_into_tensor(out, torch.full((n,), float(rank), device=dev))
        assert torch.equal(out.cpu(), torch.arange(ws).float().repeat_interleave(n)), ("all_gather", n)
        rs = torch.empty(n, device=dev)
        dist.reduce_scatter_tensor(rs, torch.arange(n * ws, dtype=torch.float32, device=dev))
        assert torch.equal(rs.cpu(), ws * torch.arange(n * rank, n * rank + n).float()), ("reduce_scatter", n)
    b = torch.full((5,), float(rank), device=dev)
    dist.broadcast(b, src=ws - 1)
    assert torch.equal(b.cpu(), torch.full((5,), float(ws - 1)))
    nxt, prv = (rank + 1) % ws, (rank - 1) % ws
    r = torch.empty(4097, device=dev)
    for w in [dist.isend(torch.full((4097,), float(rank), device=dev), nxt), dist.irecv(r, prv)]:
        w.wait()
    assert torch.equal(r.cpu(), torch.full((4097,), float(prv)))
    dist.barrier()
    print(f"multihost-job rank {rank}/{ws} host {os.environ.get('PYCOLL_HOSTID')} "
          f"local {os.environ.get('LOCAL_RANK')}: ok", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
