"""Groups across hosts on CPU tensors (issue 22): ranks placed on simulated hosts with
PYCOLL_HOSTID, every op against Gloo on the same inputs, for the layouts 2x2, 2x1, 4x1, 2+1 and
interleaved host ids. The CPU engine then spans one host's ranks only, and the inter-host legs
run on Gloo sub-groups (pycollectives/hosts.py, csrc/engines/hierarchical_engine.h)."""

import os
import time
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from gpu_collectives_util import setup_device
from ranks import run_ranks

R = dist.ReduceOp
PG_TIMEOUT = timedelta(seconds=10)
LAYOUTS = {
    "2x2": ["hostA", "hostA", "hostB", "hostB"],
    "2x1": ["hostA", "hostB"],
    "4x1": ["h0", "h1", "h2", "h3"],
    "2+1": ["hostA", "hostA", "hostB"],
    "interleaved": ["hostA", "hostB", "hostA", "hostB"],
}
SIZES = (0, 1, 7, 1031, 4099)
FLOAT_OPS = (R.SUM, R.AVG, R.PRODUCT, R.MIN, R.MAX)
INT_OPS = (R.SUM, R.PRODUCT, R.MIN, R.MAX, R.BAND, R.BOR, R.BXOR)
DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.uint8, torch.int32,
          torch.int64, torch.bool)


def _input(dtype, rank, n, salt):
    g = torch.Generator().manual_seed(1000 * salt + 17 * rank + n)
    if dtype == torch.bool:
        return torch.rand(n, generator=g) > 0.5
    if dtype.is_floating_point:
        # Small integers in float: sums and products are exact in every float dtype at these sizes.
        return torch.randint(-3, 4, (n,), generator=g).to(dtype)
    lo, hi = (0, 4) if dtype == torch.uint8 else (-3, 4)
    return torch.randint(lo, hi, (n,), generator=g).to(dtype)


def _ops_for(dtype):
    if dtype == torch.bool:
        return (R.SUM, R.MIN, R.MAX)
    return FLOAT_OPS if dtype.is_floating_point else INT_OPS


def _same(a, b, dtype, op):
    if dtype.is_floating_point and op == R.AVG:
        return torch.allclose(a.double(), b.double(), atol=1e-2 if dtype in (torch.float16, torch.bfloat16) else 1e-6)
    if dtype == torch.bool:
        return torch.equal(a, b.bool())
    return torch.equal(a, b)


def _run_all(rank, ws, layout):
    gloo = dist.new_group(backend="gloo")
    checks = 0
    for dtype in DTYPES:
        for op in _ops_for(dtype):
            if op == R.PRODUCT and dtype in (torch.int8, torch.uint8):
                continue  # wraps differently per order only in overflow; keep the reference exact
            for n in SIZES:
                x = _input(dtype, rank, n, 1)
                mine, ref = x.clone(), x.clone()
                dist.all_reduce(mine, op=op)
                dist.all_reduce(ref if dtype != torch.bool else ref.to(torch.uint8), op=op, group=gloo) \
                    if dtype != torch.bool else None
                if dtype == torch.bool:
                    u = x.to(torch.uint8)
                    dist.all_reduce(u, op=R.MIN if op == R.MIN else R.MAX, group=gloo)
                    ref = u.bool()
                assert _same(mine, ref, dtype, op), (layout, "all_reduce", dtype, op, n, mine[:8], ref[:8])
                # bitwise identical on every rank
                everyone = [torch.empty_like(mine) for _ in range(ws)]
                dist.all_gather(everyone, mine, group=gloo)
                assert all(torch.equal(e, everyone[0]) for e in everyone), (layout, dtype, op, n)
                # reduce_scatter_tensor: ws blocks of n
                big = _input(dtype, rank, n * ws, 2)
                out = torch.empty(n, dtype=dtype)
                if dtype != torch.bool:
                    dist.reduce_scatter_tensor(out, big, op=op)
                    full = big.clone()
                    dist.all_reduce(full, op=op, group=gloo)
                    assert _same(out, full[rank * n:(rank + 1) * n], dtype, op), (layout, "reduce_scatter", dtype, op, n)
                checks += 1
    # int16 and float8 reductions: Gloo reduces neither, so they cross hosts as int32 / float32
    for dtype in (torch.int16, torch.float8_e4m3fn, torch.float8_e5m2):
        for op in (R.SUM, R.MAX):
            x = torch.randint(-2, 3, (1031,), generator=torch.Generator().manual_seed(5 + rank)).float()
            every = [torch.empty_like(x) for _ in range(ws)]
            dist.all_gather(every, x, group=gloo)
            ref = torch.stack(every).sum(0) if op == R.SUM else torch.stack(every).max(0).values
            t = x.to(dtype)
            dist.all_reduce(t, op=op)
            assert torch.equal(t.float(), ref), (layout, "narrow all_reduce", dtype, op)
    # data movement, any dtype
    for dtype in (torch.float32, torch.bfloat16, torch.int64, torch.float8_e4m3fn):
        n = 1031
        x = _input(torch.float32, rank, n, 3).to(dtype)
        out = torch.empty(n * ws, dtype=dtype)
        dist.all_gather_into_tensor(out, x)
        ref = [torch.empty(n, dtype=torch.float32) for _ in range(ws)]
        dist.all_gather(ref, x.float(), group=gloo)
        assert torch.equal(out.float(), torch.cat(ref)), (layout, "all_gather", dtype)
        for root in range(ws):
            b = _input(torch.float32, rank, n, 4 + root).to(dtype)
            dist.broadcast(b, src=root)
            assert torch.equal(b.float(), _input(torch.float32, root, n, 4 + root).to(dtype).float()), (layout, root)
    # reduce to every root, uneven all_to_all_single, gather, scatter, barrier, send/recv across hosts
    for root in range(ws):
        x = _input(torch.float32, rank, 99, 9)
        y, ref = x.clone(), x.clone()
        dist.reduce(y, dst=root, op=R.SUM)
        dist.reduce(ref, dst=root, op=R.SUM, group=gloo)
        if rank == root:
            assert torch.equal(y, ref), (layout, "reduce", root)
    send = [rank + q + 1 for q in range(ws)]
    recv = [q + rank + 1 for q in range(ws)]
    src = torch.arange(sum(send), dtype=torch.int64) + 1000 * rank
    dst, ref = torch.empty(sum(recv), dtype=torch.int64), torch.empty(sum(recv), dtype=torch.int64)
    dist.all_to_all_single(dst, src, recv, send)
    dist.all_to_all_single(ref, src, recv, send, group=gloo)
    assert torch.equal(dst, ref), (layout, "all_to_all")
    g = [torch.empty(5) for _ in range(ws)] if rank == ws - 1 else None
    dist.gather(torch.full((5,), float(rank)), g, dst=ws - 1)
    if rank == ws - 1:
        assert all(torch.equal(g[r], torch.full((5,), float(r))) for r in range(ws)), (layout, "gather")
    s = torch.empty(3)
    dist.scatter(s, [torch.full((3,), float(q)) for q in range(ws)] if rank == 0 else None, src=0)
    assert torch.equal(s, torch.full((3,), float(rank))), (layout, "scatter")
    dist.barrier()
    if ws > 1:
        nxt, prv = (rank + 1) % ws, (rank - 1) % ws
        r = torch.empty(4097)
        for w in [dist.isend(torch.full((4097,), float(rank)), nxt), dist.irecv(r, prv)]:
            w.wait()
        assert torch.equal(r, torch.full((4097,), float(prv))), (layout, "send/recv")
    # a subgroup of the group's even ranks
    evens = dist.new_group(list(range(0, ws, 2)))
    if rank % 2 == 0:
        t = torch.full((10,), float(rank + 1))
        dist.all_reduce(t, group=evens)
        assert torch.equal(t, torch.full((10,), float(sum(r + 1 for r in range(0, ws, 2))))), (layout, "subgroup")
    return checks


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_every_op_across_simulated_hosts(layout):
    ids = LAYOUTS[layout]
    out = run_ranks(len(ids), _run_all, layout, rank_env=[{"PYCOLL_HOSTID": h} for h in ids], timeout=600)
    assert out[0] > 0 and len(set(out)) == 1, out


def _which_path(rank, ws):
    t = torch.ones(1 << 12)
    dist.all_reduce(t)
    assert torch.equal(t, torch.full((1 << 12,), float(ws)))
    with open(os.environ["PYCOLL_TEST_LOG"]) as fh:
        return [line.split("algo=")[1].split()[0] for line in fh if "allreduce algo=" in line]


@pytest.mark.parametrize("layout,expected", [("2x2", "hierarchical"), ("2+1", "flat"), ("4x1", "flat")])
def test_debug_log_names_the_path(layout, expected):
    ids = LAYOUTS[layout]
    out = run_ranks(len(ids), _which_path, rank_env=[{"PYCOLL_HOSTID": h} for h in ids],
                    env={"PYCOLL_DEBUG": "INFO"})
    assert all(algos and algos[-1] == expected for algos in out), out


def _both_all_reduce_forms(rank, ws):
    # Up to 1 MiB the leader form (host reduce, the hosts' first ranks on Gloo, host broadcast),
    # above it the three phases (host reduce_scatter, every rail on Gloo, host all_gather); sizes
    # that two ranks per host do not divide, and 12 MiB that they do, against Gloo.
    gloo = dist.new_group(backend="gloo")
    for n in (1031, (1 << 19) + 3, (3 << 20) + 5, 3 << 20):
        for dtype in (torch.float32, torch.int32, torch.bfloat16) if n < (1 << 20) or n % 2 else (torch.float32,):
            for op in (R.SUM, R.MAX) + ((R.AVG,) if dtype.is_floating_point else ()):
                x = _input(dtype, rank, n, 3)
                mine, ref = x.clone(), x.clone()
                dist.all_reduce(mine, op=op)
                dist.all_reduce(ref, op=op, group=gloo)
                assert _same(mine, ref, dtype, op), (n, dtype, op)
    with open(os.environ["PYCOLL_TEST_LOG"]) as fh:
        plans = [line.split(" plan=")[1].split(":")[0] for line in fh if "allreduce algo=hierarchical" in line]
    return plans


@pytest.mark.parametrize("layout", ["2x2", "interleaved"])
def test_all_reduce_leader_form_then_three_phases(layout):
    ids = LAYOUTS[layout]
    out = run_ranks(len(ids), _both_all_reduce_forms, rank_env=[{"PYCOLL_HOSTID": h} for h in ids],
                    env={"PYCOLL_DEBUG": "INFO"}, timeout=300)
    for plans in out:
        assert plans == ["leader"] * 8 + ["three phases"] * 19, plans


def _reductions_in_pieces(rank, ws):
    """Hierarchical all_reduces and reduce_scatters in pieces: sizes that neither the ranks per
    host nor the pieces divide, dtypes that cross hosts converted (int16 as int32, bool as uint8),
    in place, against every rank's input reduced here; returns each op's plan."""
    gloo = dist.new_group(backend="gloo")

    def reduced(x, op):
        every = [torch.empty(x.numel(), dtype=torch.float64) for _ in range(ws)]
        dist.all_gather(every, x.double(), group=gloo)
        every = torch.stack(every)
        return {R.SUM: every.sum(0), R.AVG: every.mean(0), R.MAX: every.max(0).values,
                R.MIN: every.min(0).values}[op].to(x.dtype)

    cases = ((torch.float32, (1 << 19) + 3, (R.SUM, R.AVG)), (torch.int16, (3 << 20) + 5, (R.SUM, R.MAX)),
             (torch.bool, (5 << 20) + 1, (R.MAX, R.MIN)), (torch.float32, 3 << 20, (R.SUM,)),
             (torch.bfloat16, (3 << 20) + 5, (R.MAX,)))
    for dtype, n, ops in cases:
        for op in ops:
            x = _input(dtype, rank, n, 5)
            ref = reduced(x, op)
            dist.all_reduce(x, op=op)
            assert torch.equal(x, ref), ("all_reduce", dtype, n, op)
    # reduce_scatter: blocks of n per rank (the input ws * n)
    for dtype, n, op, in_place in ((torch.float32, (1 << 19) + 3, R.SUM, False),
                                   (torch.float32, (1 << 19) + 3, R.AVG, True),
                                   (torch.int16, (1 << 17) + 1, R.MAX, False)):
        x = _input(dtype, rank, ws * n, 6)
        ref = reduced(x, op)[rank * n:(rank + 1) * n]
        out = x[rank * n:(rank + 1) * n] if in_place else torch.empty(n, dtype=dtype)
        dist.reduce_scatter_tensor(out, x, op=op)
        assert torch.equal(out, ref), ("reduce_scatter", dtype, n, op, in_place)
    with open(os.environ["PYCOLL_TEST_LOG"]) as fh:
        lines = [line for line in fh if "algo=hierarchical" in line]
    plans = lambda op: [line.partition(" plan=")[2].strip() for line in lines if f" {op} algo=" in line]  # noqa: E731
    return plans("allreduce"), plans("reduce_scatter")


def _pieces(plans):
    return [int(p.split(", in ")[1].split()[0]) if ", in " in p else 1 for p in plans]


_PIECES = [
    # pieces of 512 KiB from 2 MiB, at most 8
    ({"PYCOLL_LINK": "1gbit"}, [4, 4, 8, 8, 8, 8, 8, 8], [8, 8, 1]),
    ({"PYCOLL_LINK": "100mbit", "PYCOLL_HOST_PIECE_BYTES": "1M"}, [1, 1, 6, 6, 5, 5, 8, 6], [8, 8, 1]),
    ({"PYCOLL_LINK": "10gbit"}, [1] * 8, [1] * 3),  # on fast links the host's phases and Gloo compete for cores
    ({}, [1] * 8, [1] * 3),  # a link of a rate not known
    ({"PYCOLL_LINK": "1gbit", "PYCOLL_HOST_PIECE_BYTES": "0"}, [1] * 8, [1] * 3)]


@pytest.mark.parametrize("layout,env,all_reduce,reduce_scatter",
                         [("2x2", *case) for case in _PIECES] + [("interleaved", *_PIECES[0])])
def test_reductions_in_pieces_on_slow_links(layout, env, all_reduce, reduce_scatter):
    ids = LAYOUTS[layout]
    out = run_ranks(len(ids), _reductions_in_pieces, rank_env=[{"PYCOLL_HOSTID": h} for h in ids],
                    env={"PYCOLL_DEBUG": "INFO", **env}, timeout=300)
    for ar, rs in out:
        assert all(p.startswith("three phases") for p in ar), ar
        assert _pieces(ar) == all_reduce and _pieces(rs) == reduce_scatter, (ar, rs)


def _all_gather_by_rail_then_host(rank, ws):
    """all_gather of CPU tensors across hosts: along the rail, inside the host, then into rank
    order; out of place and in place (the input is this rank's block of the output), sizes 0, 1,
    odd, dtypes as bytes; the log names the hierarchical path."""
    gloo = dist.new_group(backend="gloo")
    for dtype in (torch.float32, torch.bfloat16, torch.int64, torch.uint8):
        for n in (0, 1, 7, 1031, 65537):
            x = (torch.arange(n) * 3 + rank * 1000).to(dtype)
            ref = [torch.empty(n, dtype=torch.int64) for _ in range(ws)]
            dist.all_gather(ref, x.to(torch.int64), group=gloo)
            out = torch.full((n * ws,), 7, dtype=dtype)
            dist.all_gather_into_tensor(out, x)
            assert torch.equal(out.to(torch.int64), torch.cat(ref)), ("out of place", dtype, n)
            inplace = torch.full((n * ws,), 7, dtype=dtype)
            inplace[rank * n:(rank + 1) * n] = x
            dist.all_gather_into_tensor(inplace, inplace[rank * n:(rank + 1) * n])
            assert torch.equal(inplace.to(torch.int64), torch.cat(ref)), ("in place", dtype, n)
            lst = [torch.empty(n, dtype=dtype) for _ in range(ws)]
            dist.all_gather(lst, x)
            assert torch.equal(torch.cat(lst).to(torch.int64), torch.cat(ref)), ("list", dtype, n)
    # Past the 128 MiB the engine keeps between calls (here 2 + 4 blocks of 24 MiB): its own buffer.
    x = torch.arange(6 << 20, dtype=torch.float32) + rank
    out = torch.empty(ws * x.numel())
    dist.all_gather_into_tensor(out, x)
    assert torch.equal(out.view(ws, -1), torch.stack([torch.arange(6 << 20, dtype=torch.float32) + r
                                                      for r in range(ws)])), "large"
    with open(os.environ["PYCOLL_TEST_LOG"]) as fh:
        lines = [line for line in fh if "allgather" in line and "algo=" in line]
    return (sorted({line.split("algo=")[1].split()[0] for line in lines}),
            sorted(set(_pieces(line.split(" plan=")[1] for line in lines if " pieces" in line))),
            any("into place" in line for line in lines))


@pytest.mark.parametrize("layout,expected,link", [
    ("2x2", ["hierarchical"], None), ("interleaved", ["hierarchical"], None), ("2+1", ["flat"], None),
    ("4x1", ["flat"], None), ("2x2", ["hierarchical"], "1gbit"), ("interleaved", ["hierarchical"], "1gbit")])
def test_all_gather_by_rail_then_host(layout, expected, link):
    # On a link of 1 Gbit/s, outputs from 2 MiB run in pieces of 512 KiB, at most 8: on 4 ranks,
    # 65537 int64s (4 pieces) and 6 Mi float32s (8).
    ids = LAYOUTS[layout]
    out = run_ranks(len(ids), _all_gather_by_rail_then_host, rank_env=[{"PYCOLL_HOSTID": h} for h in ids],
                    env={"PYCOLL_DEBUG": "INFO", **({"PYCOLL_LINK": link} if link else {})}, timeout=300)
    pieces = [4, 8] if link and expected == ["hierarchical"] else []
    assert all(algos == expected for algos, _, _ in out), out
    assert all(p == pieces for _, p, _ in out), out
    # Hosts of consecutive ranks gather in one piece straight into the output.
    assert all(direct == (layout == "2x2") for _, _, direct in out), out


def _cuda_across_hosts(rank, ws):
    dev = setup_device(rank)  # GPU rank % count: both ranks on one GPU where PYCOLL_GPU_WORLD is set there
    t = torch.full((1031,), float(rank + 1), device=dev)
    dist.all_reduce(t)
    assert torch.equal(t.cpu(), torch.full((1031,), float(ws * (ws + 1) // 2)))
    out = torch.empty(1031 * ws, device=dev)
    dist.all_gather_into_tensor(out, torch.full((1031,), float(rank), device=dev))
    assert torch.equal(out.cpu(), torch.arange(ws).float().repeat_interleave(1031))
    b = torch.full((7,), float(rank), device=dev)
    dist.broadcast(b, src=ws - 1)
    assert torch.equal(b.cpu(), torch.full((7,), float(ws - 1)))
    rs = torch.empty(5, device=dev)
    dist.reduce_scatter_tensor(rs, torch.arange(5 * ws, device=dev, dtype=torch.float32))
    assert torch.equal(rs.cpu(), ws * torch.arange(5 * rank, 5 * rank + 5).float())
    r = torch.empty(4097, device=dev)
    nxt, prv = (rank + 1) % ws, (rank - 1) % ws
    for w in [dist.isend(torch.full((4097,), float(rank), device=dev), nxt), dist.irecv(r, prv)]:
        w.wait()
    assert torch.equal(r.cpu(), torch.full((4097,), float(prv)))
    return True


@pytest.mark.gpu
@pytest.mark.shares_gpus
@pytest.mark.pycoll_only
def test_cuda_tensors_across_simulated_hosts():
    # Two ranks as two hosts, CUDA tensors between them on NCCL (tests/test_multihost_cuda.py has every op).
    # NCCL_HOSTID too: NCCL then sees two hosts, and accepts both ranks where they share one GPU.
    hosts = ["hostA", "hostB"]
    assert run_ranks(2, _cuda_across_hosts, rank_env=[{"PYCOLL_HOSTID": h, "NCCL_HOSTID": h} for h in hosts]) \
        == [True, True]


def _rank_dies_on_other_host(rank, ws, big):
    # Rank 3 (host B) leaves after one op; ranks on both hosts must raise, none may hang.
    n = (1 << 20) if big else 1031
    t = torch.ones(n)
    dist.all_reduce(t)
    assert torch.equal(t, torch.full((n,), float(ws)))
    if rank == ws - 1:
        os._exit(17)
    t0 = time.monotonic()
    try:
        for _ in range(3):  # the first may already fail; none may hang
            dist.all_reduce(torch.ones(n))
    except RuntimeError as e:
        took = time.monotonic() - t0
        assert took < PG_TIMEOUT.total_seconds() + 15, f"raised only after {took:.1f}s: {e}"
        return took
    raise AssertionError("all_reduce with a dead rank on another host did not raise")


@pytest.mark.parametrize("big", [False, True], ids=["small", "1MiB"])
def test_rank_killed_on_other_host_makes_every_survivor_raise(big):
    ids = LAYOUTS["2x2"]
    out = run_ranks(4, _rank_dies_on_other_host, big, rank_env=[{"PYCOLL_HOSTID": h} for h in ids],
                    pg_timeout=PG_TIMEOUT, expect_exit={3: 17}, timeout=90)
    assert all(took is not None for took in out[:3]), out


def _mismatch_across_hosts(rank, ws, case):
    # Host 0's ranks call one thing, the other host's another: every rank raises, naming both
    # calls, before any byte crosses hosts (Gloo would abort the process on different sizes).
    first_host = rank < ws // 2 if ws == 4 else rank < 2
    if case == "sizes":
        dist.all_reduce(torch.ones(1000 if first_host else 2000))
    elif case == "empty":
        dist.all_reduce(torch.ones(0 if first_host else 1000))
    elif case == "reduce_op":
        dist.all_reduce(torch.ones(100), op=R.SUM if first_host else R.MAX)
    elif case == "op":
        t = torch.ones(100)
        dist.all_reduce(t) if first_host else dist.broadcast(t, src=0)
    elif case == "broadcast_root":
        dist.broadcast(torch.ones(100), src=0 if first_host else 1)
    elif case == "all_gather":
        n = 10 if first_host else 11
        dist.all_gather_into_tensor(torch.empty(n * ws), torch.ones(n))
    elif case == "all_to_all":
        # Every rank sends 1 element to each peer, but the last rank expects 2 from rank 0.
        recv = [2 if (rank == ws - 1 and q == 0) else 1 for q in range(ws)]
        dist.all_to_all_single(torch.empty(sum(recv)), torch.ones(ws), recv, [1] * ws)
    raise AssertionError(f"{case}: a call that differs across hosts did not raise")


def _expect_mismatch(rank, ws, case):
    try:
        _mismatch_across_hosts(rank, ws, case)
    except RuntimeError as e:
        msg = str(e)
        assert "across hosts" in msg, msg
        # The group still works: the ranks compared their calls before moving any data.
        t = torch.ones(1031)
        dist.all_reduce(t)
        assert torch.equal(t, torch.full((1031,), float(ws)))
        return msg
    raise AssertionError("no error")


def test_torch_debug_detail_turns_the_check_on():
    ids = LAYOUTS["2x2"]
    out = run_ranks(4, _expect_mismatch, "sizes", rank_env=[{"PYCOLL_HOSTID": h} for h in ids],
                    env={"TORCH_DISTRIBUTED_DEBUG": "DETAIL"}, pg_timeout=PG_TIMEOUT, timeout=90)
    assert all(out), out


@pytest.mark.parametrize("layout", ["2x2", "2+1"])
@pytest.mark.parametrize("case", ["sizes", "empty", "reduce_op", "op", "broadcast_root", "all_gather", "all_to_all"])
def test_call_that_differs_across_hosts_raises(layout, case):
    ids = LAYOUTS[layout]
    out = run_ranks(len(ids), _expect_mismatch, case, rank_env=[{"PYCOLL_HOSTID": h} for h in ids],
                    env={"PYCOLL_CHECK_ACROSS_HOSTS": "1"}, pg_timeout=PG_TIMEOUT, timeout=90)
    assert all(out), out
