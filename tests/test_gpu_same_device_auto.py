"""PYCOLL_CUDA_SAME_DEVICE=auto (the default) with every rank on one GPU: all_reduce, reduce_scatter,
all_gather and broadcast take the events path from PYCOLL_CUDA_SAME_DEVICE_STAGED_BELOW_KIB (the
op's output bytes; an uneven reduce_scatter's largest input) up and stage through host memory below it; reduce, all_to_all, sends and
receives and schedule programs always stage (no kernel of the CUDA engine runs). Every op against a
torch reference, and which engine ran it read from this rank's flight recorder; asynchronous ops
that alternate between the two engines around compute on the current stream, and take effect in
issue order without a wait between them; a staged op's Future is complete when handed out
(callbacks that issue collectives run in one order on every rank); the measured switch
(the setting left at -1) is the same on every rank.

Run with PYCOLL_GPU_WORLD=2 and 4 on one GPU: python3 -m pytest -q tests/test_gpu_same_device_auto.py
"""
import json

import torch
import torch.distributed as dist

from gpu_collectives_util import (GPU_MARKS, WORLD, R, assert_same_digests, check_close, digest, make_input,
                                  reference, run_as_script, run_gpu0, seeded_matrices)

pytestmark = GPU_MARKS

BELOW_KIB = 64
AUTO = {"PYCOLL_CUDA_SAME_DEVICE": "auto", "PYCOLL_CUDA_SAME_DEVICE_STAGED_BELOW_KIB": str(BELOW_KIB)}
MEASURED = {"PYCOLL_CUDA_SAME_DEVICE": "auto"}
EVENTS_FROM = BELOW_KIB * 1024


def _entries():
    from pycollectives import _C

    return json.loads(_C.flight_recorder_json())["entries"]


def _engine_of_last():
    e = _entries()[-1]
    return e["engine"]


def _expect(name, out_bytes, took):
    want = "cuda" if out_bytes >= EVENTS_FROM else "staged"
    assert took == want, f"{name}: {out_bytes} output bytes ran on {took!r}, expected {want!r}"


def _four_ops(rank, world, dev, seed):
    out = []
    f32, bf16 = torch.float32, torch.bfloat16
    # all_reduce: just below the switch, at it, above it (several elements past), and empty.
    for dtype in (f32, bf16):
        es = torch.tensor([], dtype=dtype).element_size()
        at = EVENTS_FROM // es
        for numel, op in ((0, R.SUM), (1, R.MAX), (at - 1, R.SUM), (at, R.AVG), (4 * at + 3, R.SUM)):
            key = ("auto-ar", str(dtype), numel, str(op))
            xs = [make_input(seed, key, q, numel, dtype, dev, op) for q in range(world)]
            t = xs[rank].clone()
            dist.all_reduce(t, op=op)
            check_close(t, reference(xs, op, dtype), dtype, str(key))
            _expect(str(key), numel * es, _engine_of_last())
            out.append((str(key), digest(t)))
    # reduce_scatter: the output (m elements) decides.
    for m in (EVENTS_FROM // 4 - 1, EVENTS_FROM // 4):
        key = ("auto-rs", m)
        xs = [make_input(seed, key, q, world * m, f32, dev) for q in range(world)]
        o = torch.empty(m, dtype=f32, device=dev)
        dist.reduce_scatter_tensor(o, xs[rank])
        check_close(o, reference(xs, R.SUM, f32)[rank * m:(rank + 1) * m], f32, str(key))
        _expect(str(key), m * 4, _engine_of_last())
    # A list of uneven inputs (rank q gets the sum of inputs[q]): this rank's output is below the
    # switch on rank 0 and above it on the last rank; the largest input, alike everywhere, decides.
    sizes = [EVENTS_FROM // 4 - 100 + 200 * q // max(world - 1, 1) for q in range(world)]
    key = ("auto-rsv",)
    lists = [[make_input(seed, key + (q, j), q, sizes[j], f32, dev) for j in range(world)] for q in range(world)]
    o = torch.empty(sizes[rank], dtype=f32, device=dev)
    dist.reduce_scatter(o, lists[rank])
    check_close(o, reference([lists[q][rank] for q in range(world)], R.SUM, f32), f32, str(key))
    _expect(str(key), max(sizes) * 4, _engine_of_last())
    # all_gather: the whole output, alike on every rank; also a list of uneven outputs.
    hi = -(-EVENTS_FROM // (4 * world))
    for m in (hi - 1, hi):
        key = ("auto-ag", m)
        xs = [make_input(seed, key, q, m, f32, dev) for q in range(world)]
        o = torch.empty(world * m, dtype=f32, device=dev)
        dist.all_gather_into_tensor(o, xs[rank])
        check_close(o, torch.cat(xs), f32, str(key))
        _expect(str(key), world * m * 4, _engine_of_last())
    sizes = [hi + 5 * q for q in range(world)]  # rank q contributes sizes[q] elements
    key = ("auto-agv",)
    xs = [make_input(seed, key, q, sizes[q], f32, dev) for q in range(world)]
    outs = [torch.empty(n, dtype=f32, device=dev) for n in sizes]
    dist.all_gather(outs, xs[rank])
    for q in range(world):
        check_close(outs[q], xs[q], f32, f"{key} from rank {q}")
    _expect(str(key), sum(sizes) * 4, _engine_of_last())
    # broadcast from the last rank: the tensor's bytes (the root's and the others' alike).
    root = world - 1
    for m in (EVENTS_FROM // 4 - 1, EVENTS_FROM // 4):
        key = ("auto-bc", m)
        want = make_input(seed, key, root, m, f32, dev)
        t = want.clone() if rank == root else torch.zeros(m, device=dev)
        dist.broadcast(t, src=root)
        check_close(t, want, f32, str(key))
        _expect(str(key), m * 4, _engine_of_last())
    torch.cuda.synchronize()
    return out


def test_the_four_ops_switch_at_the_set_size(seed):
    assert_same_digests(run_gpu0(_four_ops, seed, env=AUTO, timeout=600))


def _other_ops_stage(rank, world, dev, seed):
    n = 4 * EVENTS_FROM  # well above the switch: they stage anyway
    numel = n // 4
    # reduce
    key = ("auto-reduce",)
    xs = [make_input(seed, key, q, numel, torch.float32, dev) for q in range(world)]
    t = xs[rank].clone()
    dist.reduce(t, dst=0)
    if rank == 0:
        check_close(t, reference(xs, R.SUM, torch.float32), torch.float32, str(key))
    assert _engine_of_last() == "staged", _entries()[-1]
    # all_to_all
    per = numel // world
    key = ("auto-a2a",)
    xs = [make_input(seed, key, q, per * world, torch.float32, dev) for q in range(world)]
    o = torch.empty(per * world, device=dev)
    dist.all_to_all_single(o, xs[rank])
    want = torch.cat([xs[q][rank * per:(rank + 1) * per] for q in range(world)])
    check_close(o, want, torch.float32, str(key))
    assert _engine_of_last() == "staged", _entries()[-1]
    # sends and receives around a ring, through host memory
    key = ("auto-p2p",)
    xs = [make_input(seed, key, q, numel, torch.float32, dev) for q in range(world)]
    got = torch.empty(numel, device=dev)
    reqs = dist.batch_isend_irecv([dist.P2POp(dist.isend, xs[rank], (rank + 1) % world),
                                   dist.P2POp(dist.irecv, got, (rank - 1) % world)])
    for r in reqs:
        r.wait()
    check_close(got, xs[(rank - 1) % world], torch.float32, str(key))
    p2p = [e for e in _entries() if e["is_p2p"]]
    assert p2p and all(e["engine"] != "cuda" for e in p2p), p2p
    # a schedule program, above the switch: the CPU engine runs it on the staged copies
    import pycollectives

    pycollectives.set_algo("ring_all_reduce")
    try:
        key = ("auto-sched",)
        xs = [make_input(seed, key, q, numel, torch.float32, dev) for q in range(world)]
        t = xs[rank].clone()
        dist.all_reduce(t)
        check_close(t, reference(xs, R.SUM, torch.float32), torch.float32, str(key))
        last = _entries()[-1]
        assert last["engine"] == "staged" and last["algorithm"] == "schedule", last
    finally:
        pycollectives.set_algo("auto")
    torch.cuda.synchronize()


def test_other_ops_and_schedule_programs_stage(seed):
    run_gpu0(_other_ops_stage, seed, env=AUTO, timeout=300)


def _async_across_the_switch(rank, world, dev, seed):
    mats = seeded_matrices(seed, world, 256, dev)
    small, large = 1000, EVENTS_FROM // 4 * 3 + 1  # staged, events
    for it in range(3):
        torch.cuda._sleep(20_000_000)  # the input is produced late on the current stream
        x = (mats[rank] @ mats[rank]).flatten()
        works, outs = [], []
        for j in range(8):
            n = small if j % 2 == 0 else large
            y = x.repeat(n // x.numel() + 1)[:n] + j
            works.append(dist.all_reduce(y, async_op=True))
            outs.append(y)
        for w in works:
            w.wait()
        want = sum((m @ m).flatten() for m in mats)
        for j, y in enumerate(outs):
            n = y.numel()
            w = want.repeat(n // want.numel() + 1)[:n] + world * j
            torch.testing.assert_close(y * 2, 2 * w, rtol=1e-4, atol=1e-3, msg=lambda m: f"iteration {it}, op {j}: {m}")
        engines = [e["engine"] for e in _entries()[-8:]]
        assert engines == ["staged", "cuda"] * 4, engines
    # Issue order holds across the two engines without a wait in between, as on NCCL's one stream:
    # the all_gather (events path) reads x after the asynchronous all_reduce (staged) wrote it.
    n = EVENTS_FROM // 4 - 1
    for it in range(3):
        torch.cuda._sleep(20_000_000)
        x = torch.full((n,), float(rank + 1 + it), device=dev)
        dist.all_reduce(x, async_op=True)
        out = torch.empty(world * n, device=dev)
        dist.all_gather_into_tensor(out, x, async_op=True).wait()
        want = float(sum(q + 1 + it for q in range(world)))
        assert torch.all(out == want), f"iteration {it}: the all_gather read x before the all_reduce wrote it"
        assert [e["engine"] for e in _entries()[-2:]] == ["staged", "cuda"], _entries()[-2:]
    # And the other way: the staged all_reduce writes x only after the asynchronous all_gather (events
    # path, on the group's stream) read it.
    for it in range(3):
        torch.cuda._sleep(20_000_000)
        x = torch.full((n,), float(rank + 1 + it), device=dev)
        out = torch.empty(world * n, device=dev)
        work = dist.all_gather_into_tensor(out, x, async_op=True)
        dist.all_reduce(x)
        work.wait()
        want = torch.arange(1, world + 1, device=dev, dtype=torch.float32).add(it).repeat_interleave(n)
        assert torch.equal(out, want), f"iteration {it}: the all_reduce wrote x before the all_gather read it"
        assert torch.all(x == float(sum(q + 1 + it for q in range(world)))), f"iteration {it}: all_reduce wrong"
        assert [e["engine"] for e in _entries()[-2:]] == ["cuda", "staged"], _entries()[-2:]


def test_async_ops_alternating_engines(seed):
    run_gpu0(_async_across_the_switch, seed, env=AUTO, timeout=300)


def _callbacks_that_issue_collectives(rank, world, dev, seed):
    # A staged op's Future is complete when handed out, as an NCCL op's is: a callback that issues
    # the next collective (torch's PowerSGD hook does) runs at once, so every rank issues the
    # group's ops in one order; the result is read after the op on the stream.
    small, large = 1000, EVENTS_FROM // 4 * 3 + 1  # staged, events
    s = float(sum(q + 1 for q in range(world)))
    for it in range(4):
        torch.cuda._sleep(20_000_000)  # the inputs are produced late on the current stream
        a = torch.full((small,), float(rank + 1 + it), device=dev)
        fut = dist.all_reduce(a, async_op=True).get_future()
        assert fut.done(), "a staged op's Future is complete when handed out"

        def again(f):
            b = f.value()[0] * 2
            dist.all_reduce(b)  # issued from the callback, before the all_reduce below
            return b

        chained = fut.then(again)
        c = torch.full((large,), float(rank + 1), device=dev)
        w = dist.all_reduce(c, async_op=True)
        got = chained.wait()
        want = 2 * world * (s + world * it)
        assert torch.all(got == want), f"iteration {it}: {got[:4].tolist()} != {want}"
        w.wait()
        assert torch.all(c == s), f"iteration {it}: the events-path all_reduce"
        took = [(e["engine"], e["input_sizes"]) for e in _entries()[-3:]]
        assert took == [("staged", [[small]]), ("staged", [[small]]), ("cuda", [[large]])], took
        # Read through the Future alone: the current stream waits for the op.
        torch.cuda._sleep(20_000_000)
        d = torch.full((small,), float(rank + 1), device=dev)
        dist.all_reduce(d, async_op=True).get_future().wait()
        assert torch.all(d == s), f"iteration {it}: read before the staged op wrote it"


def test_futures_of_staged_ops_are_complete_when_handed_out(seed):
    run_gpu0(_callbacks_that_issue_collectives, seed, env=AUTO, timeout=300)


def _measured_switch(rank, world, dev):
    took = []
    for numel in (1 << 17, 1 << 18):  # 512 KiB, 1 MiB of float32
        t = torch.full((numel,), float(rank + 1), device=dev)
        dist.all_reduce(t)
        assert torch.all(t == world * (world + 1) / 2), numel
        took.append(_engine_of_last())
    # Without the MPS daemon a handoff costs a context switch: 1 MiB and up take the events path;
    # with it every size does.
    assert took in (["staged", "cuda"], ["cuda", "cuda"]), took
    return took


def test_the_measured_switch_is_alike_on_every_rank():
    res = run_gpu0(_measured_switch, env=MEASURED, timeout=300)
    assert all(r == res[0] for r in res), res
    print(f"engines at 512 KiB and 1 MiB: {res[0]}")


if __name__ == "__main__":  # pragma: no cover - lets the device machine run it without pytest plugins
    run_as_script(globals())
