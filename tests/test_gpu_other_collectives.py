"""The CUDA engine's collectives other than all_reduce: reduce_scatter, all_gather, broadcast,
reduce, all_to_all (even and uneven splits), send/recv and batch_isend_irecv, barrier.
"""
import torch
import torch.distributed as dist

from gpu_collectives_util import (ALGOS, DTYPES, GPU_MARKS, PG_TIMEOUT, SIZES, WORLD, R, assert_same_digests,
                                  check_all_gather_odd_offsets, check_close, digest, make_input, op_name, ops_for,
                                  reference, run_as_script, setup_device)
from ranks import run_ranks, set_algo

pytestmark = GPU_MARKS


# ---------------------------------------------------------------------------------------------
# reduce_scatter, all_gather


def _reduce_scatter(rank, world, seed):
    dev = setup_device(rank)
    for algo in ALGOS:
        set_algo(algo)
        for dtype in DTYPES:
            ops = ops_for(dtype) if algo in ("oneshot", "ring") else (R.SUM,)
            for op in ops:
                for m in (0, 1, 7, 1031, 262147):
                    key = ("rs", algo, str(dtype), op_name(op), m)
                    xs = [make_input(seed, key, q, world * m, dtype, dev, op) for q in range(world)]
                    o = torch.empty(m, dtype=dtype, device=dev)
                    dist.reduce_scatter_tensor(o, xs[rank], op=op)
                    want = reference(xs, op, dtype)[rank * m:(rank + 1) * m]
                    check_close(o, want, dtype, str(key))
        # List form, and a shard that starts at an odd offset.
        key = ("rs-list", algo)
        xs = [make_input(seed, key, q, world * 1031, torch.float32, dev) for q in range(world)]
        base = torch.zeros(1031 + 1, device=dev)
        o = base[1:]
        dist.reduce_scatter(o, list(xs[rank].chunk(world)), op=R.SUM)
        check_close(o, reference(xs, R.SUM, torch.float32)[rank * 1031:(rank + 1) * 1031], torch.float32, str(key))
    set_algo("auto")
    torch.cuda.synchronize()


def test_reduce_scatter(seed):
    run_ranks(WORLD, _reduce_scatter, seed, timeout=600, pg_timeout=PG_TIMEOUT)


def _all_gather(rank, world, seed):
    dev = setup_device(rank)
    out = []
    for algo in ALGOS:
        set_algo(algo)
        for dtype in DTYPES:
            for m in SIZES:
                key = ("ag", algo, str(dtype), m)
                xs = [make_input(seed, key, q, m, dtype, dev) for q in range(world)]
                o = torch.empty(world * m, dtype=dtype, device=dev)
                dist.all_gather_into_tensor(o, xs[rank])
                check_close(o, torch.cat(xs), dtype, str(key))
                out.append((str(key), digest(o)))
        # Odd offsets for input and output, and the list form (from a view at an odd offset too).
        check_all_gather_odd_offsets(seed, ("ag-offset", algo), rank, world, dev, (7, 1031, 65537))
        for m in (7, 1031, 65537):
            key = ("ag-list", algo, m)
            xs = [make_input(seed, key, q, m, torch.float16, dev) for q in range(world)]
            src = torch.empty(m + 1, dtype=torch.float16, device=dev)[1:]
            src.copy_(xs[rank])
            lst = [torch.empty(m, dtype=torch.float16, device=dev) for _ in range(world)]
            dist.all_gather(lst, src)
            check_close(torch.cat(lst), torch.cat(xs), torch.float16, str(key))
    set_algo("auto")
    torch.cuda.synchronize()
    return out


def test_all_gather(seed):
    assert_same_digests(run_ranks(WORLD, _all_gather, seed, timeout=600, pg_timeout=PG_TIMEOUT))


# ---------------------------------------------------------------------------------------------
# broadcast, reduce, all_to_all, send/recv, barrier


def _broadcast_reduce(rank, world, seed):
    dev = setup_device(rank)
    for root in range(world):
        for dtype in DTYPES:
            for numel in SIZES + ((16 << 20) + 5,):
                key = ("bc", root, str(dtype), numel)
                x = make_input(seed, key, root, numel, dtype, dev)
                t = x.clone() if rank == root else torch.zeros(numel, dtype=dtype, device=dev)
                dist.broadcast(t, src=root)
                check_close(t, x, dtype, str(key))
            for op in ops_for(dtype):
                for numel in (0, 7, 1031, (1 << 20) + 3):
                    key = ("reduce", root, str(dtype), op_name(op), numel)
                    xs = [make_input(seed, key, q, numel, dtype, dev, op) for q in range(world)]
                    t = xs[rank].clone()
                    dist.reduce(t, dst=root, op=op)
                    if rank == root:
                        check_close(t, reference(xs, op, dtype), dtype, str(key))
    torch.cuda.synchronize()


def test_broadcast_and_reduce(seed):
    run_ranks(WORLD, _broadcast_reduce, seed, timeout=600, pg_timeout=PG_TIMEOUT)


def _all_to_all(rank, world, seed):
    dev = setup_device(rank)
    def pattern(values):  # splits[src][dst], cycling through values (2 ranks: [[v0, v1], [v2, v3]])
        return [[values[(s * world + d) % len(values)] for d in range(world)] for s in range(world)]

    splits_cases = [
        pattern([0]),
        [[1 + s * world + d for d in range(world)] for s in range(world)],
        pattern([1031, 0, 7, 65537]),
        pattern([(1 << 20) + 3, 5, 0, (2 << 20) + 1]),
    ]
    for dtype in (torch.float32, torch.float16, torch.uint8, torch.int64):
        for splits in splits_cases:
            # splits[src][dst] = elements src sends to dst
            key = ("a2a", str(dtype), str(splits))
            xs = [make_input(seed, key, q, sum(splits[q]), dtype, dev) for q in range(world)]
            in_splits = splits[rank]
            out_splits = [splits[q][rank] for q in range(world)]
            o = torch.full((sum(out_splits),), 0, dtype=dtype, device=dev)
            dist.all_to_all_single(o, xs[rank], out_splits, in_splits)
            want = []
            for q in range(world):
                start = sum(splits[q][:rank])
                want.append(xs[q][start:start + splits[q][rank]])
            check_close(o, torch.cat(want), dtype, str(key))
        # Equal splits (no split lists).
        key = ("a2a-even", str(dtype))
        xs = [make_input(seed, key, q, world * 4097, dtype, dev) for q in range(world)]
        o = torch.empty(world * 4097, dtype=dtype, device=dev)
        dist.all_to_all_single(o, xs[rank])
        check_close(o, torch.cat([xs[q][rank * 4097:(rank + 1) * 4097] for q in range(world)]), dtype, str(key))
    torch.cuda.synchronize()


def test_all_to_all(seed):
    run_ranks(WORLD, _all_to_all, seed, timeout=600, pg_timeout=PG_TIMEOUT)


def _send_recv(rank, world, seed):
    dev = setup_device(rank)
    # Round a ring (with 2 ranks: both directions between the pair at once).
    nxt, prv = (rank + 1) % world, (rank - 1) % world
    for dtype in (torch.float32, torch.uint8, torch.bfloat16):
        for numel in (1, 1031, (1 << 20) + 3, (16 << 20) + 1):
            # Both directions at once: each rank's send must not wait for its own receive.
            key = ("p2p", str(dtype), numel)
            mine = make_input(seed, key, rank, numel, dtype, dev)
            theirs = make_input(seed, key, prv, numel, dtype, dev)
            got = torch.zeros(numel, dtype=dtype, device=dev)
            reqs = [dist.isend(mine, nxt), dist.irecv(got, prv)]
            for r in reqs:
                r.wait()
            check_close(got, theirs, dtype, str(key))
    # Several messages in a row are matched in issue order.
    msgs = [make_input(seed, ("p2p-seq", i), 0, 1000 + 977 * i, torch.float32, dev) for i in range(5)]
    if rank == 0:
        for m in msgs:
            dist.send(m, 1)
    elif rank == 1:
        for m in msgs:
            got = torch.empty_like(m)
            dist.recv(got, 0)
            check_close(got, m, torch.float32, "p2p-seq")
    # batch_isend_irecv.
    key = ("p2p-batch",)
    mine = make_input(seed, key, rank, 300001, torch.float32, dev)
    got = torch.empty(300001, device=dev)
    ops = [dist.P2POp(dist.isend, mine, nxt), dist.P2POp(dist.irecv, got, prv)]
    for r in dist.batch_isend_irecv(ops):
        r.wait()
    check_close(got, make_input(seed, key, prv, 300001, torch.float32, dev), torch.float32, "p2p-batch")
    # To itself (two pipeline stages on one rank), in one batch with a peer exchange.
    back = torch.empty(1031, device=dev)
    ops = [dist.P2POp(dist.irecv, back, rank), dist.P2POp(dist.isend, mine[:1031], rank),
           dist.P2POp(dist.isend, mine, nxt), dist.P2POp(dist.irecv, got, prv)]
    for r in dist.batch_isend_irecv(ops):
        r.wait()
    assert torch.equal(back, mine[:1031]), "p2p-self"
    torch.cuda.synchronize()


def test_send_recv(seed):
    run_ranks(WORLD, _send_recv, seed, timeout=300, pg_timeout=PG_TIMEOUT)


def _barrier(rank, world, seed):
    dev = setup_device(rank)
    for _ in range(5):
        dist.barrier()
    # A barrier after GPU work still orders it: rank 1 reads what rank 0 wrote before.
    t = torch.full((1024,), float(rank + 1), device=dev)
    dist.all_reduce(t)
    dist.barrier()
    assert torch.all(t == world * (world + 1) / 2)


def test_barrier(seed):
    run_ranks(WORLD, _barrier, seed, timeout=120, pg_timeout=PG_TIMEOUT)


if __name__ == "__main__":  # pragma: no cover - lets the device machine run it without pytest plugins
    run_as_script(globals())
