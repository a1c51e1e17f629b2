"""What the ranks of tests/test_cluster.py run inside pycoll-cluster (torchrun's environment).

    python tests/cluster_worker.py MODE OUT.json

collectives  every collective on pycoll against a torch reference computed here; then the 16 MiB
             all_reduce, pycoll's hierarchical form against Gloo's flat ring on the same link
compression  compression_bench's CPU model (MLP 3 x 2048) under DDP on pycoll: no hook, PowerSGD r=4
crash        rank 1 kills itself with SIGKILL after the group is made; the others wait in a collective
cuda         every collective of `collectives` on CUDA tensors (rank on GPU LOCAL_RANK % count; ranks of
             a host that share a GPU run the CUDA engine's kernels there), then all_reduce in the
             hierarchical and the flat form
Rank 0 writes what it measured to OUT.json.
"""
import json
import os
import signal
import socket
import statistics
import sys
import time

import torch
import torch.distributed as dist

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

import pycollectives  # noqa: E402  (registers "pycoll")


def value(rank, n, salt=0):
    return torch.arange(n, dtype=torch.float32) * (rank + 1) + salt + rank


def collectives(rank, world):
    R = dist.ReduceOp
    checked = []
    for n in (1, 1031, 65536):
        x = value(rank, n)
        dist.all_reduce(x)
        assert torch.equal(x, sum(value(r, n) for r in range(world))), ("all_reduce", n)
        x = value(rank, n)
        dist.all_reduce(x, op=R.MAX)
        assert torch.equal(x, value(world - 1, n)), ("all_reduce max", n)
        out = torch.empty(n)
        dist.reduce_scatter_tensor(out, torch.cat([value(rank, n, salt=b) for b in range(world)]))
        assert torch.equal(out, sum(value(r, n, salt=rank) for r in range(world))), ("reduce_scatter", n)
        out = torch.empty(world * n)
        dist.all_gather_into_tensor(out, value(rank, n))
        assert torch.equal(out, torch.cat([value(r, n) for r in range(world)])), ("all_gather", n)
        parts = [torch.empty(n) for _ in range(world)]
        dist.all_gather(parts, value(rank, n))
        assert all(torch.equal(parts[r], value(r, n)) for r in range(world)), ("all_gather list", n)
        x = value(rank, n)
        dist.broadcast(x, src=world - 1)
        assert torch.equal(x, value(world - 1, n)), ("broadcast", n)
        x = value(rank, n)
        dist.reduce(x, dst=1)
        if rank == 1:
            assert torch.equal(x, sum(value(r, n) for r in range(world))), ("reduce", n)
        out = torch.empty(world * n)
        dist.all_to_all_single(out, torch.cat([value(rank, n, salt=d) for d in range(world)]))
        assert torch.equal(out, torch.cat([value(s, n, salt=rank) for s in range(world)])), ("all_to_all", n)
        gathered = [torch.empty(n) for _ in range(world)] if rank == 0 else None
        dist.gather(value(rank, n), gathered, dst=0)
        if rank == 0:
            assert all(torch.equal(gathered[r], value(r, n)) for r in range(world)), ("gather", n)
        out = torch.empty(n)
        dist.scatter(out, [value(0, n, salt=d) for d in range(world)] if rank == 0 else None, src=0)
        assert torch.equal(out, value(0, n, salt=rank)), ("scatter", n)
        dist.barrier()
        checked.append(n)
    ops = ["all_reduce", "reduce_scatter", "all_gather", "broadcast", "reduce", "all_to_all", "gather", "scatter",
           "barrier"]
    return {"ops": ops, "sizes": checked}


def timed(fn, group, iters):
    dist.barrier(group=group)
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    t = torch.tensor([(time.perf_counter() - t0) / iters], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    return float(t)


def hierarchy_vs_gloo(rank, world, nbytes=16 << 20, rounds=3):
    gloo = dist.new_group(backend="gloo")
    x = torch.ones(nbytes // 4)
    pycollectives.set_algo("hierarchical")
    pyc = lambda: dist.all_reduce(x)  # noqa: E731
    flat = lambda: dist.all_reduce(x, group=gloo)  # noqa: E731
    pyc(), flat()  # warm: connections, buffers
    times = {"pycoll_hierarchical": [], "gloo_flat": []}
    for _ in range(rounds):
        times["pycoll_hierarchical"].append(timed(pyc, gloo, 2))
        times["gloo_flat"].append(timed(flat, gloo, 2))
    pycollectives.set_algo(None)
    med = {k: statistics.median(v) for k, v in times.items()}
    return {"bytes": nbytes, "times_s": times, "median_s": med,
            "speedup": med["gloo_flat"] / med["pycoll_hierarchical"]}


def cuda_setup():
    """Before the group is made: this rank's GPU, and the kernels where a host's ranks share one."""
    local = int(os.environ["LOCAL_RANK"])
    dev = torch.device("cuda", local % torch.cuda.device_count())
    torch.cuda.set_device(dev)
    if int(os.environ["LOCAL_WORLD_SIZE"]) > torch.cuda.device_count():
        os.environ.setdefault("PYCOLL_CUDA_SAME_DEVICE", "kernels")
    return dev


def cuda_collectives(rank, world, dev):
    with torch.device(dev):
        result = collectives(rank, world)
        forms = {}
        for form in ("hierarchical", "flat"):
            pycollectives.set_algo(form)
            for n in (1031, 1 << 18):
                x = value(rank, n)
                dist.all_reduce(x)
                assert torch.equal(x, sum(value(r, n) for r in range(world))), (form, "all_reduce", n)
                x = value(rank, n)
                dist.all_reduce(x, op=dist.ReduceOp.MIN)
                assert torch.equal(x, value(0, n)), (form, "all_reduce min", n)
            forms[form] = "ok"
        pycollectives.set_algo(None)
        torch.cuda.synchronize()
    result["forms"] = forms
    result["device"] = str(dev)
    return result


def compression(rank, world, steps):
    import argparse
    sys.path.insert(0, os.path.join(os.path.dirname(HERE), "benchmarks"))
    from compression_bench import train

    args = argparse.Namespace(width=2048, depth=3, batch=8, rank=4, lr=0.05, bucket_mb=25.0, steps=steps, warmup=3,
                              seed=0, gpu_rank=4)
    rows = {}
    for method in ("none", "powersgd"):
        r = train(method, None, args, rank, world, torch.device("cpu"))
        rows[method] = {"step_ms_median": statistics.median(r["step_ms"]), "loss0": r["loss0"], "loss": r["loss"],
                        "params": r["params"]}
    rows["speedup"] = rows["none"]["step_ms_median"] / rows["powersgd"]["step_ms_median"]
    return rows


def main():
    mode, out = sys.argv[1], sys.argv[2]
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dev = cuda_setup() if mode == "cuda" else None
    dist.init_process_group("pycoll", init_method="env://")
    result = {"hostname": socket.gethostname(), "link": os.environ.get("PYCOLL_LINK"),
              "link_measured_bps": float(os.environ.get("PYCOLL_LINK_MEASURED", 0))}
    if mode == "collectives":
        result["collectives"] = collectives(rank, world)
        result["hierarchy"] = hierarchy_vs_gloo(rank, world)
    elif mode == "cuda":
        result["cuda"] = cuda_collectives(rank, world, dev)
        result["nccl_hostid"] = os.environ.get("NCCL_HOSTID")
    elif mode == "compression":
        torch.set_num_threads(1)
        result["compression"] = compression(rank, world, int(os.environ.get("CLUSTER_TEST_STEPS", "6")))
    elif mode == "crash":
        dist.barrier()
        if rank == 1:
            os.kill(os.getpid(), signal.SIGKILL)
        x = torch.ones(4)
        dist.all_reduce(x)
        time.sleep(120)
    hostnames = [None] * world
    dist.all_gather_object(hostnames, result["hostname"])
    result["hostnames"] = hostnames
    if rank == 0:
        with open(out, "w") as fh:
            json.dump(result, fh, indent=1)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
