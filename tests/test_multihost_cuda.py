"""CUDA tensors in groups across simulated hosts (issue 22): our CUDA engine inside each host and
NCCL between hosts. Each simulated host has its own PYCOLL_HOSTID and NCCL_HOSTID, so NCCL too
talks between the halves through its network transport, as between real hosts. Every op is
checked against Gloo on CPU copies of the same inputs, and bitwise alike on every rank.

Rank r uses GPU r % count. Where ranks share a GPU (PYCOLL_GPU_WORLD set on fewer GPUs than ranks,
tests/gpu_collectives_util.py), the CUDA engine of a simulated host runs its kernels on it
(PYCOLL_CUDA_SAME_DEVICE=kernels), and every rank gets an NCCL_HOSTID of its own: NCCL refuses two
ranks on one GPU of one host ("Duplicate GPU detected"), and sees each rank as a host of its own."""

import os

import pytest
import torch
import torch.distributed as dist

import pycollectives

from gpu_collectives_util import gpus_missing, setup_device, shares_gpus
from ranks import run_ranks
from test_multihost import SIZES, _input, _ops_for, _same

R = dist.ReduceOp
LAYOUTS = {
    "2x1": ["hostA", "hostB"],
    "2x2": ["hostA", "hostA", "hostB", "hostB"],
    "4x1": ["h0", "h1", "h2", "h3"],
}
# CUDA kernels reduce these; int16 and float8 go through host memory (checked once below).
DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int8, torch.uint8, torch.int32,
          torch.int64, torch.bool)


def _gloo_all_reduce(x, op, gloo):
    if x.dtype == torch.bool:
        u = x.to(torch.uint8)
        dist.all_reduce(u, op=R.MIN if op == R.MIN else R.MAX, group=gloo)
        return u.bool()
    y = x.clone()
    dist.all_reduce(y, op=op, group=gloo)
    return y


def _check_same_everywhere(t, gloo, what):
    everyone = [torch.empty_like(t) for _ in range(dist.get_world_size())]
    dist.all_gather(everyone, t, group=gloo)
    assert all(torch.equal(e, everyone[0]) for e in everyone), what


def _host_env(ids):
    """Each rank's PYCOLL_HOSTID and NCCL_HOSTID for the simulated hosts `ids` (one per rank)."""
    alone = shares_gpus(len(ids))  # NCCL: one host per rank, so that no two of its ranks share a GPU
    return [{"PYCOLL_HOSTID": h, "NCCL_HOSTID": f"{h}-rank{r}" if alone else h} for r, h in enumerate(ids)]


def _skip_without_gpus(ids):
    why = gpus_missing(len(ids))
    if why:
        pytest.skip(why)


def _every_op(rank, ws, layout):
    dev = setup_device(rank)
    gloo = dist.new_group(backend="gloo")
    checks = 0
    for dtype in DTYPES:
        print("pycoll-test: all_reduce", dtype, flush=True)
        for op in _ops_for(dtype):
            if op == R.PRODUCT and dtype in (torch.int8, torch.uint8):
                continue
            for n in SIZES + ((1 << 20) + 3,) if dtype == torch.float32 else SIZES:
                x = _input(dtype, rank, n, 1)
                mine = x.to(dev)
                dist.all_reduce(mine, op=op)
                got = mine.cpu()
                assert _same(got, _gloo_all_reduce(x, op, gloo), dtype, op), (layout, "all_reduce", dtype, op, n)
                _check_same_everywhere(got, gloo, (layout, dtype, op, n))
                if dtype != torch.bool:
                    big = _input(dtype, rank, n * ws, 2)
                    out = torch.empty(n, dtype=dtype, device=dev)
                    dist.reduce_scatter_tensor(out, big.to(dev), op=op)
                    full = _gloo_all_reduce(big, op, gloo)
                    assert _same(out.cpu(), full[rank * n:(rank + 1) * n], dtype, op), \
                        (layout, "reduce_scatter", dtype, op, n)
                checks += 1
    print("pycoll-test: non-contiguous, narrow dtypes, data movement", flush=True)
    # Non-contiguous input, AVG of a size no rank count divides.
    x = _input(torch.float32, rank, 2 * 1031, 5)
    t = x.to(dev)[::2]
    dist.all_reduce(t, op=R.AVG)
    assert _same(t.cpu(), _gloo_all_reduce(x[::2].contiguous(), R.AVG, gloo), torch.float32, R.AVG), layout
    # int16 / float8: through host memory (our CUDA kernels do not reduce them).
    for dtype in (torch.int16, torch.float8_e4m3fn):
        x = torch.randint(-2, 3, (1031,), generator=torch.Generator().manual_seed(5 + rank)).float()
        t = x.to(dtype).to(dev)
        dist.all_reduce(t)
        assert torch.equal(t.float().cpu(), _gloo_all_reduce(x, R.SUM, gloo)), (layout, dtype)
    # Data movement (any dtype), reduce, all_to_all, gather, scatter.
    for dtype in (torch.float32, torch.bfloat16, torch.int64, torch.float8_e4m3fn):
        x = _input(torch.float32, rank, 1031, 3).to(dtype)
        out = torch.empty(1031 * ws, dtype=dtype, device=dev)
        dist.all_gather_into_tensor(out, x.to(dev))
        ref = [torch.empty(1031) for _ in range(ws)]
        dist.all_gather(ref, x.float(), group=gloo)
        assert torch.equal(out.float().cpu(), torch.cat(ref)), (layout, "all_gather", dtype)
        for root in range(ws):
            b = _input(torch.float32, rank, 1031, 4 + root).to(dtype).to(dev)
            dist.broadcast(b, src=root)
            assert torch.equal(b.float().cpu(), _input(torch.float32, root, 1031, 4 + root).to(dtype).float())
    # all_gather in the hierarchical form at every size (auto takes it from 512 KiB of output).
    pycollectives.set_algo("hierarchical")
    for dtype in (torch.float32, torch.bfloat16, torch.uint8):
        for n in (0, 1, 1031, (1 << 20) + 3):
            x = _input(torch.float32, rank, n, 5).to(dtype)
            out = torch.full((n * ws,), 7, dtype=dtype, device=dev)
            dist.all_gather_into_tensor(out, x.to(dev))
            ref = [torch.empty(n) for _ in range(ws)]
            dist.all_gather(ref, x.float(), group=gloo)
            assert torch.equal(out.float().cpu(), torch.cat(ref)), (layout, "hierarchical all_gather", dtype, n)
            inplace = torch.full((n * ws,), 7, dtype=dtype, device=dev)
            inplace[rank * n:(rank + 1) * n] = x.to(dev)
            dist.all_gather_into_tensor(inplace, inplace[rank * n:(rank + 1) * n])
            assert torch.equal(inplace.float().cpu(), torch.cat(ref)), (layout, "in place", dtype, n)
    pycollectives.set_algo(None)
    print("pycoll-test: reduce, all_to_all, gather, scatter, send/recv", flush=True)
    for root in range(ws):
        x = _input(torch.float32, rank, 99, 9)
        y = x.to(dev)
        dist.reduce(y, dst=root, op=R.SUM)
        want = _gloo_all_reduce(x, R.SUM, gloo)  # a collective: every rank calls it
        if rank == root:
            assert torch.equal(y.cpu(), want), (layout, "reduce", root)
    send = [rank + q + 1 for q in range(ws)]
    recv = [q + rank + 1 for q in range(ws)]
    src = torch.arange(sum(send), dtype=torch.int64) + 1000 * rank
    dst, ref = torch.empty(sum(recv), dtype=torch.int64, device=dev), torch.empty(sum(recv), dtype=torch.int64)
    dist.all_to_all_single(dst, src.to(dev), recv, send)
    dist.all_to_all_single(ref, src, recv, send, group=gloo)
    assert torch.equal(dst.cpu(), ref), (layout, "all_to_all")
    g = [torch.empty(5, device=dev) for _ in range(ws)] if rank == ws - 1 else None
    dist.gather(torch.full((5,), float(rank), device=dev), g, dst=ws - 1)
    if rank == ws - 1:
        assert all(torch.equal(g[r].cpu(), torch.full((5,), float(r))) for r in range(ws)), (layout, "gather")
    s = torch.empty(3, device=dev)
    dist.scatter(s, [torch.full((3,), float(q), device=dev) for q in range(ws)] if rank == 0 else None, src=0)
    assert torch.equal(s.cpu(), torch.full((3,), float(rank))), (layout, "scatter")
    # Point-to-point around the ring: to a peer on this host (CUDA engine) and on the other (NCCL).
    nxt, prv = (rank + 1) % ws, (rank - 1) % ws
    r = torch.empty(4097, device=dev)
    for w in [dist.isend(torch.full((4097,), float(rank), device=dev), nxt), dist.irecv(r, prv)]:
        w.wait()
    assert torch.equal(r.cpu(), torch.full((4097,), float(prv))), (layout, "send/recv")
    dist.barrier()
    torch.cuda.synchronize()
    with open(os.environ["PYCOLL_TEST_LOG"], errors="replace") as fh:
        log = fh.read()
    paths = {line.split("algo=")[1].split()[0] for line in log.splitlines() if "allreduce algo=" in line}
    gathers = {line.split("algo=")[1].split()[0] for line in log.splitlines() if "allgather algo=" in line}
    assert gathers == ({"flat", "hierarchical"} if layout == "2x2" else {"flat"}), (layout, gathers)
    nccl_net = sorted({line.split(" via ")[1].split()[0] for line in log.splitlines() if " via NET/" in line})
    return checks, sorted(paths), nccl_net


@pytest.mark.gpu
@pytest.mark.shares_gpus
@pytest.mark.pycoll_only
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_cuda_every_op_across_simulated_hosts(layout):
    ids = LAYOUTS[layout]
    _skip_without_gpus(ids)
    out = run_ranks(len(ids), _every_op, layout, timeout=150, rank_env=_host_env(ids),
                    env={"PYCOLL_DEBUG": "INFO", "NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT"})
    assert out[0][0] > 0 and len({o[0] for o in out}) == 1, out
    expected = "hierarchical" if layout == "2x2" else "flat"
    assert all(expected in paths for _, paths, _ in out), out
    # NCCL between the simulated hosts went over its network transport (printed for the record).
    print(layout, "NCCL transports between hosts:", sorted({t for _, _, net in out for t in net}))


def _graph_capture(rank, ws, layout):
    """all_reduce, all_gather and reduce_scatter of CUDA tensors across hosts captured in one CUDA
    graph (NCCL allows capture): replayed with new inputs, each replay's results exact."""
    dev = setup_device(rank)
    plans = []
    for n in (1031, 1 << 18):  # below and above the built-in flat-to-hierarchical size on CUDA
        ar = torch.zeros(n, device=dev)
        ag_in, ag_out = torch.zeros(n, device=dev), torch.empty(n * ws, device=dev)
        rs_in, rs_out = torch.zeros(n * ws, device=dev), torch.empty(n, device=dev)

        def ops():
            dist.all_reduce(ar)
            dist.all_gather_into_tensor(ag_out, ag_in)
            dist.reduce_scatter_tensor(rs_out, rs_in)

        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            ops()  # warm-up outside the graph: engines and NCCL communicators exist before capture
        torch.cuda.current_stream().wait_stream(s)
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            ops()
        for i in range(3):
            ar.fill_(float(rank + 1 + i))
            ag_in.copy_(torch.arange(n, device=dev, dtype=torch.float32) + 1000 * rank + i)
            rs_in.copy_(torch.arange(n * ws, device=dev, dtype=torch.float32) * (rank + 1) + i)
            g.replay()
            torch.cuda.synchronize()
            assert torch.all(ar == ws * (ws + 1) / 2 + ws * i), (layout, n, i, "all_reduce", ar[:4])
            want_ag = torch.cat([torch.arange(n, dtype=torch.float32) + 1000 * r + i for r in range(ws)])
            assert torch.equal(ag_out.cpu(), want_ag), (layout, n, i, "all_gather")
            want_rs = torch.arange(n * rank, n * rank + n, dtype=torch.float64) * (ws * (ws + 1) / 2) + ws * i
            assert torch.equal(rs_out.cpu().double(), want_rs), (layout, n, i, "reduce_scatter")
        del g
    with open(os.environ["PYCOLL_TEST_LOG"], errors="replace") as fh:
        return sorted({line.split("algo=")[1].split()[0] for line in fh if "allreduce algo=" in line})


@pytest.mark.gpu
@pytest.mark.shares_gpus
@pytest.mark.pycoll_only
@pytest.mark.parametrize("layout", ["2x1", "2x2"])
def test_cuda_graph_capture_across_simulated_hosts(layout):
    ids = LAYOUTS[layout]
    _skip_without_gpus(ids)
    out = run_ranks(len(ids), _graph_capture, layout, timeout=150, rank_env=_host_env(ids),
                    env={"PYCOLL_DEBUG": "INFO"})
    # 2 x 2: the small all_reduce ran flat on NCCL, the large one hierarchical, both captured.
    assert all(paths == (["flat", "hierarchical"] if layout == "2x2" else ["flat"]) for paths in out), out


def _cuda_mismatch(rank, ws, case):
    """Host 0's ranks call one thing, host 1's another, on CUDA tensors with the check on: every
    rank raises naming both calls before anything is enqueued on NCCL, and the group still works."""
    dev = setup_device(rank)
    first_host = rank < ws // 2
    try:
        if case == "sizes":
            dist.all_reduce(torch.ones(1000 if first_host else 2000, device=dev))
        elif case == "op":
            t = torch.ones(100, device=dev)
            dist.all_reduce(t) if first_host else dist.broadcast(t, src=0)
        elif case == "reduce_op":
            dist.all_reduce(torch.ones(100, device=dev), op=R.SUM if first_host else R.MAX)
        elif case == "all_gather":
            n = 10 if first_host else 11
            dist.all_gather_into_tensor(torch.empty(n * ws, device=dev), torch.ones(n, device=dev))
        elif case == "reduce_scatter":
            n = 1 << 16 if first_host else (1 << 16) + 1
            dist.reduce_scatter_tensor(torch.empty(n, device=dev), torch.ones(n * ws, device=dev))
    except RuntimeError as e:
        msg = str(e)
        assert "called different collectives across hosts" in msg, msg
        t = torch.ones(1031, device=dev)
        dist.all_reduce(t)
        assert torch.equal(t.cpu(), torch.full((1031,), float(ws)))
        return msg
    raise AssertionError(f"{case}: a call that differs across hosts did not raise")


@pytest.mark.gpu
@pytest.mark.shares_gpus
@pytest.mark.pycoll_only
@pytest.mark.parametrize("layout", ["2x1", "2x2"])
@pytest.mark.parametrize("case", ["sizes", "op", "reduce_op", "all_gather", "reduce_scatter"])
def test_cuda_call_that_differs_across_hosts_raises(layout, case):
    ids = LAYOUTS[layout]
    _skip_without_gpus(ids)
    out = run_ranks(len(ids), _cuda_mismatch, case, timeout=120, rank_env=_host_env(ids),
                    env={"PYCOLL_CHECK_ACROSS_HOSTS": "1"})
    assert all(out), out
