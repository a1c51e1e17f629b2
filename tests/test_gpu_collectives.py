"""GPU tests of the CUDA engine, through torch.distributed with backend "pycoll".

Two ranks, one GPU each (PYCOLL_GPU_WORLD=N for N; skipped when fewer GPUs are visible). Each test spawns the ranks
once and loops over its cases inside them. Every rank builds every rank's input from the same
seed, so each rank computes the reference itself (float64 for floating types, int64 with the
dtype's wrap-around for integers, logical ops for bool). Each rank returns a digest of every
result; the parent checks that the ranks agree bit for bit (the engine's results must be
identical on every rank, for every algorithm).
"""
import datetime
import functools
import hashlib
import os
import time

import pytest
import torch
import torch.distributed as dist

from ranks import run_ranks, set_algo

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.pycoll_only,
]

# One rank per GPU; PYCOLL_GPU_WORLD=4 (or 8) runs the same suite on more GPUs.
WORLD = int(os.environ.get("PYCOLL_GPU_WORLD", "2"))
pytestmark.append(pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.device_count() < WORLD, reason=f"needs {WORLD} CUDA GPUs"))
# Bounds every spin-wait of the engine's kernels (and Store waits): a protocol bug then fails the
# test with the engine's device error instead of hanging for the default 30 minutes.
PG_TIMEOUT = datetime.timedelta(seconds=60)
ALGOS = ("oneshot", "twoshot", "ring", "tree", "auto")
SIZES = (0, 1, 7, 1031, (1 << 20) + 3)
FLOATS = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
INTS = (torch.int8, torch.uint8, torch.int32, torch.int64)
DTYPES = FLOATS + INTS + (torch.bool,)
R = dist.ReduceOp
FLOAT_OPS = (R.SUM, R.AVG, R.PRODUCT, R.MIN, R.MAX)
INT_OPS = (R.SUM, R.PRODUCT, R.MIN, R.MAX, R.BAND, R.BOR, R.BXOR)
BOOL_OPS = (R.SUM, R.PRODUCT, R.MIN, R.MAX, R.BAND, R.BOR, R.BXOR)
TOL = {
    torch.float32: (1e-5, 1e-5),
    torch.float64: (1e-12, 1e-12),
    torch.float16: (2e-3, 2e-3),
    torch.bfloat16: (1.6e-2, 1.6e-2),
}


def ops_for(dtype):
    if dtype in FLOATS:
        return FLOAT_OPS
    if dtype == torch.bool:
        return BOOL_OPS
    return INT_OPS


def _name(op):
    for k in ("SUM", "AVG", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR"):
        if op == getattr(R, k):
            return k
    return str(op)


# ---------------------------------------------------------------------------------------------
# inputs, references, digests (run inside the ranks)


def make_input(seed, key, rank, numel, dtype, device, op=None):
    """Rank `rank`'s input of case `key` (the same on every process)."""
    g = torch.Generator(device=device)
    h = int.from_bytes(hashlib.sha1(repr(key).encode()).digest()[:7], "little")  # same in every process
    g.manual_seed((seed * 1000003 + h * 31 + rank) % (2**62))
    if dtype in FLOATS:
        x = torch.randn(numel, generator=g, device=device, dtype=torch.float32)
        if op == R.PRODUCT:
            x = 1.0 + 0.25 * x
        return x.to(dtype)
    if dtype == torch.bool:
        return torch.randint(0, 2, (numel,), generator=g, device=device).bool()
    lo, hi = {torch.int8: (-8, 8), torch.uint8: (0, 16), torch.int32: (-1000, 1000), torch.int64: (-1000, 1000)}[dtype]
    return torch.randint(lo, hi, (numel,), generator=g, device=device, dtype=torch.int64).to(dtype)


def reference(xs, op, dtype):
    """Reduction of the ranks' inputs `xs` in float64 / int64 / bool."""
    n = len(xs)
    if dtype == torch.bool:
        s = torch.stack(xs)
        if op in (R.SUM, R.MAX, R.BOR):
            return s.any(0)
        if op in (R.PRODUCT, R.MIN, R.BAND):
            return s.all(0)
        return functools.reduce(torch.logical_xor, xs)
    if dtype in FLOATS:
        s = torch.stack([x.double() for x in xs])
        if op == R.SUM:
            return s.sum(0)
        if op == R.AVG:
            return s.sum(0) / n
        if op == R.PRODUCT:
            return s.prod(0)
        if op == R.MIN:
            return s.min(0).values
        if op == R.MAX:
            return s.max(0).values
        raise ValueError(op)
    s = torch.stack([x.long() for x in xs])
    if op == R.SUM:
        return s.sum(0).to(dtype)  # wraps like the engine
    if op == R.PRODUCT:
        return s.prod(0).to(dtype)
    if op == R.MIN:
        return s.min(0).values.to(dtype)
    if op == R.MAX:
        return s.max(0).values.to(dtype)
    fn = {R.BAND: torch.bitwise_and, R.BOR: torch.bitwise_or, R.BXOR: torch.bitwise_xor}[op]
    return functools.reduce(fn, [x.long() for x in xs]).to(dtype)


def check_close(got, want, dtype, what):
    if got.numel() == 0 and want.numel() == 0:
        return
    if dtype in FLOATS:
        # Ring and tree store partial sums in the tensor's dtype between hops (as NCCL does):
        # up to world - 1 roundings, so the bound grows with the number of ranks.
        rtol, atol = (x * max(1, WORLD - 1) for x in TOL[dtype])
        torch.testing.assert_close(got.double(), want.double(), rtol=rtol, atol=atol, msg=lambda m: f"{what}: {m}")
    else:
        if not torch.equal(got.cpu(), want.to(got.dtype).cpu()):
            bad = (got.cpu() != want.to(got.dtype).cpu()).nonzero()[:5].flatten().tolist()
            raise AssertionError(f"{what}: mismatch at indices {bad}")


def digest(t):
    t = t.contiguous()
    if t.numel() == 0:
        return "empty"
    return hashlib.sha1(t.view(-1).view(torch.uint8).cpu().numpy().tobytes()).hexdigest()


def _setup(rank):
    torch.cuda.set_device(rank)
    return torch.device("cuda", rank)


def _assert_same_digests(results):
    r0 = results[0]
    for q, rq in enumerate(results[1:], 1):
        assert len(r0) == len(rq)
        diff = [a[0] for a, b in zip(r0, rq) if a != b]
        assert not diff, f"ranks 0 and {q} disagree bitwise on {len(diff)} cases, e.g. {diff[:5]}"


# ---------------------------------------------------------------------------------------------
# all_reduce


def _all_reduce_matrix(rank, world, seed):
    dev = _setup(rank)
    out = []
    for algo in ALGOS:
        set_algo(algo)
        for dtype in DTYPES:
            for op in ops_for(dtype):
                for numel in SIZES:
                    key = ("ar", algo, str(dtype), _name(op), numel)
                    xs = [make_input(seed, key, q, numel, dtype, dev, op) for q in range(world)]
                    t = xs[rank].clone()
                    dist.all_reduce(t, op=op)
                    check_close(t, reference(xs, op, dtype), dtype, str(key))
                    out.append((str(key), digest(t)))
    set_algo("auto")
    torch.cuda.synchronize()
    return out


def test_all_reduce_every_dtype_op_algo_size(seed):
    _assert_same_digests(run_ranks(WORLD, _all_reduce_matrix, seed, timeout=600, pg_timeout=PG_TIMEOUT))


def _large_sum(seed, key, rank, world, numel, dtype, dev):
    """One large all_reduce (sum) checked against the reference; frees its tensors after."""
    xs = [make_input(seed, key, q, numel, dtype, dev) for q in range(world)]
    t = xs[rank].clone()
    dist.all_reduce(t)
    check_close(t, reference(xs, R.SUM, dtype), dtype, str(key))
    result = (str(key), digest(t))
    del xs, t
    if dev.type == "cuda":
        torch.cuda.empty_cache()
    return result


def _all_reduce_large(rank, world, seed):
    dev = _setup(rank)
    out = []
    cases = [(64 << 20, torch.float32), (64 << 20, torch.bfloat16), (256 << 20, torch.float32)]
    for nbytes, dtype in cases:
        numel = nbytes // torch.tensor([], dtype=dtype).element_size()
        for algo in ALGOS:
            set_algo(algo)
            out.append(_large_sum(seed, ("ar-large", algo, str(dtype), numel), rank, world, numel, dtype, dev))
    set_algo("auto")
    return out


def test_all_reduce_large(seed):
    _assert_same_digests(run_ranks(WORLD, _all_reduce_large, seed, timeout=600, pg_timeout=PG_TIMEOUT))


def _all_reduce_layouts(rank, world, seed):
    """Tensors at odd element offsets inside an allocation, and non-contiguous ones."""
    dev = _setup(rank)
    out = []
    for algo in ALGOS:
        set_algo(algo)
        for dtype in (torch.float32, torch.float16, torch.bfloat16, torch.int8, torch.int64, torch.bool):
            for numel in (1, 7, 1031, 300007):
                for offset in (1, 3):
                    key = ("ar-offset", algo, str(dtype), numel, offset)
                    xs = [make_input(seed, key, q, numel, dtype, dev) for q in range(world)]
                    base = make_input(seed, key + ("base",), rank, numel + offset + 5, dtype, dev)
                    guard = base.clone()
                    t = base[offset:offset + numel]
                    t.copy_(xs[rank])
                    dist.all_reduce(t, op=R.MAX)
                    check_close(t, reference(xs, R.MAX, dtype), dtype, str(key))
                    # Nothing outside the view was touched.
                    assert torch.equal(base[:offset], guard[:offset]), key
                    assert torch.equal(base[offset + numel:], guard[offset + numel:]), key
                    out.append((str(key), digest(t)))
            # Non-contiguous: every other element of a 2-column view.
            key = ("ar-strided", algo, str(dtype))
            xs = [make_input(seed, key, q, 2 * 4099, dtype, dev) for q in range(world)]
            t = xs[rank].clone().view(4099, 2)[:, 0]
            try:
                dist.all_reduce(t, op=R.MAX)
            except (RuntimeError, ValueError):
                pass  # rejecting non-contiguous input is acceptable; corrupting it is not
            else:
                want = reference([x.view(4099, 2)[:, 0] for x in xs], R.MAX, dtype)
                check_close(t, want, dtype, str(key))
                out.append((str(key), digest(t)))
    set_algo("auto")
    torch.cuda.synchronize()
    return out


def test_all_reduce_odd_offsets_and_strides(seed):
    _assert_same_digests(run_ranks(WORLD, _all_reduce_layouts, seed, timeout=600, pg_timeout=PG_TIMEOUT))


def _reduce_at_offset(seed, key, rank, world, numel, offset, dtype, op, dev):
    """all_reduce of a view at element `offset` inside a zeroed allocation with guard elements on
    both sides: checks the result and that nothing outside the view was written; returns the
    (key, digest) row the parent compares across ranks."""
    xs = [make_input(seed, key, q, numel, dtype, dev, op) for q in range(world)]
    base = torch.zeros(numel + offset + 3, dtype=dtype, device=dev)
    t = base[offset:offset + numel]
    t.copy_(xs[rank])
    dist.all_reduce(t, op=op)
    check_close(t, reference(xs, op, dtype), dtype, str(key))
    assert not base[:offset].any() and not base[offset + numel:].any(), key
    return (str(key), digest(t))


def _check_broadcast_and_all_gather(rank, world, dev, i, bcast_numel, gather_numel):
    """A broadcast from rank i % world and an all_gather, checked: other collectives on the same
    channels between the calls a test interleaves them with."""
    b = torch.full((bcast_numel,), float(rank), device=dev)
    dist.broadcast(b, src=i % world)
    assert torch.all(b == float(i % world)), i
    g = torch.empty(world * gather_numel, device=dev)
    dist.all_gather_into_tensor(g, torch.full((gather_numel,), float(rank), device=dev))
    assert torch.equal(g, torch.arange(world, device=dev).float().repeat_interleave(gather_numel)), i


def _check_graph_replays(rank, world, xs):
    """One all_reduce per tensor of `xs` captured in a CUDA graph (after a warm-up on a side
    stream), replayed four times with fresh inputs: every element must be the sum over ranks."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for x in xs:
            dist.all_reduce(x)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for x in xs:
            dist.all_reduce(x)
    for i in range(4):
        for x in xs:
            x.fill_(float(rank * 10 + i))
        graph.replay()
        torch.cuda.synchronize()
        want = sum(q * 10 + i for q in range(world))
        for x in xs:
            assert torch.all(x == want), f"replay {i}: {x.numel()} elements gave {x[0].item()}, want {want}"


def _all_reduce_ll(rank, world, seed):
    """The LL protocol (one-shot up to PYCOLL_CUDA_LL_MAX_KIB, here its 1 MiB maximum): messages
    that end inside a 16 KiB CTA region or a line, odd offsets, every dtype; LL calls interleaved
    with channel-protocol collectives (per-CTA epochs, the stale-message check must not fire);
    CUDA graph replays (the epochs live on the device)."""
    dev = _setup(rank)
    out = []
    set_algo("oneshot")
    region = 16 << 10
    byte_sizes = (8, 24, region - 8, region, region + 2, 3 * region + 9, 100003, (1 << 20) - 6, 1 << 20)
    for dtype in DTYPES:
        es = torch.tensor([], dtype=dtype).element_size()
        for op in ops_for(dtype)[:4]:
            for nbytes in byte_sizes:
                numel = max(1, nbytes // es)
                for offset in (0, 1):
                    key = ("ar-ll", str(dtype), _name(op), numel, offset)
                    out.append(_reduce_at_offset(seed, key, rank, world, numel, offset, dtype, op, dev))
    # Interleaved with the channel protocol: large one-shot, two-shot, broadcast, all_gather.
    for i in range(4):
        for numel in (5, 4099, 70001):
            x = torch.full((numel,), float(rank + i), device=dev)
            dist.all_reduce(x)
            assert torch.all(x == sum(q + i for q in range(world))), (i, numel)
        big = torch.full(((4 << 20) // 4 + 1,), float(rank), device=dev)
        set_algo("twoshot" if i % 2 else "oneshot")
        dist.all_reduce(big)
        set_algo("oneshot")
        assert torch.all(big == sum(range(world))), i
        _check_broadcast_and_all_gather(rank, world, dev, i, 1000 + i, 3)
    # Graph replays: several LL sizes and a channel-protocol call in one graph.
    xs = [torch.zeros(n, device=dev) for n in (3, 4099, 200000)]
    big = torch.zeros((4 << 20) // 4, device=dev)
    _check_graph_replays(rank, world, xs + [big])
    set_algo("auto")
    torch.cuda.synchronize()
    return out


def test_all_reduce_ll_protocol(seed):
    _assert_same_digests(run_ranks(WORLD, _all_reduce_ll, seed, timeout=600, pg_timeout=PG_TIMEOUT,
                                   env={"PYCOLL_CUDA_LL_MAX_KIB": "1024"}))


def _all_reduce_ll128(rank, world, seed):
    """The LL128 two-shot (kernels/ll128_two_shot.cuh; PYCOLL_CUDA_LL128_MAX_KIB, here 64 MiB on
    every world size, and PYCOLL_CUDA_LL128_BLOCKS=5 so that CTA ranges end at odd lines): every
    dtype and op in place at odd offsets, sizes from 1 element (the last ranks own no line and send
    an ack) through lines and CTA rows that end mid-word; the largest message the region holds and
    one just above it (the channel two-shot then); calls interleaved with channel-protocol and LL
    collectives; CUDA graph replays (the epochs live on the device)."""
    dev = _setup(rank)
    out = []
    set_algo("twoshot")
    line = 120
    byte_sizes = (8, 24, line - 8, line, world * line + 16, 64 * line * world * 5 + 40, 100003, (1 << 20) + 6,
                  (5 << 20) + 24)
    for dtype in DTYPES:
        es = torch.tensor([], dtype=dtype).element_size()
        for op in ops_for(dtype)[:4] + ((R.AVG,) if dtype in FLOATS else ()):
            for nbytes in byte_sizes:
                numel = max(1, nbytes // es)
                offset = (numel + len(str(op))) % 3
                key = ("ar-ll128", str(dtype), _name(op), numel, offset)
                out.append(_reduce_at_offset(seed, key, rank, world, numel, offset, dtype, op, dev))
    # The region's largest message and one element more (channel two-shot); bf16 rounds once.
    for dtype in (torch.float32, torch.bfloat16):
        numel = (64 << 20) // torch.tensor([], dtype=dtype).element_size()
        for n in (numel, numel + 1):
            out.append(_large_sum(seed, ("ar-ll128-large", str(dtype), n), rank, world, n, dtype, dev))
    # Interleaved with the channel protocol (ring, one-shot) and LL: per-CTA epochs and the
    # stale-message check must not fire.
    for i in range(6):
        for algo, numel in (("twoshot", 70001), ("ring", 4099), ("twoshot", (3 << 20) + 1), ("oneshot", 5),
                            ("oneshot", (2 << 20) + 3)):
            set_algo(algo)
            x = torch.full((numel,), float(rank + i), device=dev)
            dist.all_reduce(x)
            assert torch.all(x == sum(q + i for q in range(world))), (i, algo, numel)
        set_algo("twoshot")
        _check_broadcast_and_all_gather(rank, world, dev, i, 1000 + i, 3)
    _check_ll128_grid_changes(rank, world, dev)
    set_algo("twoshot")
    _check_graph_replays(rank, world, [torch.zeros(n, device=dev) for n in (3, 4099, 300007, (4 << 20) + 1)])
    set_algo("auto")
    torch.cuda.synchronize()
    return out


def _check_ll128_grid_changes(rank, world, dev):
    """Two-shot calls whose CTA count grows and shrinks with the size (a row of 64 lines per CTA:
    about 7600 / 7700 / 11600 / 20000 float32 elements on two ranks give 1 / 2 / 3 / 5 CTAs), each
    with values no earlier call had: which CTA owns a line changes, and a line an earlier call left
    must never pass for this call's (the review's stale-flag case: wrong sums, no error)."""
    set_algo("twoshot")
    sizes = [n * world // 2 for n in (7600, 7700, 11600, 20000, 7600, 20000, 7700, 11600, 7600, 7700)]
    for i, numel in enumerate(sizes):
        x = torch.arange(numel, device=dev, dtype=torch.float32) + float(1000 * i + rank)
        dist.all_reduce(x)
        want = torch.arange(numel, device=dev, dtype=torch.float32) * world + sum(1000 * i + q for q in range(world))
        assert torch.equal(x, want), (i, numel, (x != want).nonzero()[:4].flatten().tolist())


def test_all_reduce_ll128_protocol(seed):
    env = {"PYCOLL_CUDA_LL128_MAX_KIB": str(64 << 10), "PYCOLL_CUDA_LL128_BLOCKS": "5"}
    _assert_same_digests(run_ranks(WORLD, _all_reduce_ll128, seed, timeout=600, pg_timeout=PG_TIMEOUT, env=env))


def _all_reduce_ll128_grid(rank, world, seed):
    """The LL128 two-shot with its default CTA count (up to 128) at the sizes it serves by default,
    in place at an odd offset."""
    dev = _setup(rank)
    set_algo("twoshot")
    out = []
    for dtype in (torch.float32, torch.float16, torch.int32):
        for nbytes in ((4 << 20) + 8, (16 << 20) - 24, 40 << 20):
            numel = nbytes // torch.tensor([], dtype=dtype).element_size()
            out.append(_reduce_at_offset(seed, ("ar-ll128-grid", str(dtype), numel), rank, world, numel, 1, dtype,
                                         R.SUM, dev))
    _check_ll128_grid_changes(rank, world, dev)
    set_algo("auto")
    return out


def test_all_reduce_ll128_full_grid(seed):
    env = {"PYCOLL_CUDA_LL128_MAX_KIB": str(64 << 10)}
    _assert_same_digests(run_ranks(WORLD, _all_reduce_ll128_grid, seed, timeout=600, pg_timeout=PG_TIMEOUT, env=env))


def _all_reduce_split(rank, world, seed):
    """The split one-shot (pushing and reducing CTAs apart, kernels/one_shot.cuh; two ranks only),
    forced for every one-shot call of the channel protocol (PYCOLL_CUDA_SPLIT_MIN_KIB=0, LL off)
    with 16 KiB chunks,
    so that a channel carries many chunks: every dtype, in place (the reducer must not overwrite
    input its own pusher has not sent yet), odd offsets, sizes from 1 element to
    64 MiB; interleaved with two-shot, broadcast and all_gather on the same channels (the split
    kernel uses each channel's two directions from two CTAs); CUDA graph replays. With two ranks,
    the kernel's timeline (PYCOLL_CUDA_TRACE) shows that the split kernel ran: 2C CTAs, pushers
    and reducers with the same chunk counts, stamps in order."""
    dev = _setup(rank)
    out = []
    set_algo("oneshot")
    if world == 2:
        import pycollectives
        E = pycollectives._C.trace_events()
        x = torch.full(((3 << 20) // 4 + 5,), float(rank), device=dev)
        dist.all_reduce(x)
        assert torch.all(x == 1.0)
        rows = dist.group.WORLD._get_backend(dev).cuda_trace()
        ctas = [rows[c * E:(c + 1) * E] for c in range(len(rows) // E)]
        live = [r for r in ctas if r[0] != 0]
        C = len(live) // 2
        assert C >= 1 and len(live) == 2 * C and all(r[0] != 0 for r in ctas[:2 * C]), len(live)
        claimed = os.environ.get("PYCOLL_CUDA_SPLIT_CLAIMED", "1") == "1"
        for b in range(C):
            push, red = ctas[b], ctas[C + b]
            if not claimed:  # a channel's two CTAs handle its fixed range
                assert push[E - 1] == red[E - 1] >= 1, (b, push[E - 1], red[E - 1])
            for r in (push, red):
                k = min(r[E - 1], (E - 4) // 2)  # stamps beyond the row are not kept
                stamps = [r[0]] + [r[2 + i] for i in range(2 * k)] + [r[1]]
                assert stamps == sorted(stamps) and stamps[-1] - stamps[0] < 10**9, (b, stamps)
        if claimed:  # every chunk pushed once and reduced once (16 KiB chunks)
            nchunks = -(-x.numel() * 4 // (16 << 10))
            assert sum(ctas[b][E - 1] for b in range(C)) == nchunks, [ctas[b][E - 1] for b in range(C)]
            assert sum(ctas[C + b][E - 1] for b in range(C)) == nchunks, [ctas[C + b][E - 1] for b in range(C)]
    for dtype in DTYPES:
        for op in ops_for(dtype)[:4]:
            for numel in (1, 7, 1031, 300007, (1 << 20) + 3):  # in place, as dist.all_reduce always is
                for offset in (0, 1):
                    key = ("ar-split", str(dtype), _name(op), numel, offset)
                    out.append(_reduce_at_offset(seed, key, rank, world, numel, offset, dtype, op, dev))
    for dtype in (torch.float32, torch.bfloat16):
        numel = (64 << 20) // torch.tensor([], dtype=dtype).element_size() + 5
        out.append(_large_sum(seed, ("ar-split-large", str(dtype), numel), rank, world, numel, dtype, dev))
    for i in range(4):
        big = torch.full(((4 << 20) // 4 + 1,), float(rank + i), device=dev)
        set_algo("twoshot" if i % 2 else "oneshot")
        dist.all_reduce(big)
        assert torch.all(big == sum(q + i for q in range(world))), i
        set_algo("oneshot")
        x = torch.full((70001,), float(rank), device=dev)
        dist.all_reduce(x)
        assert torch.all(x == sum(range(world))), i
        _check_broadcast_and_all_gather(rank, world, dev, i, 100000 + i, 5000)
    xs = [torch.zeros(n, device=dev) for n in (3, 200000, (8 << 20) // 4)]
    _check_graph_replays(rank, world, xs)
    set_algo("auto")
    torch.cuda.synchronize()
    return out


@pytest.mark.parametrize("claimed", ["1", "0"])
def test_all_reduce_split_one_shot(seed, claimed):
    env = {"PYCOLL_CUDA_SPLIT_MIN_KIB": "0", "PYCOLL_CUDA_SPLIT_CHUNK_KIB": "16", "PYCOLL_CUDA_LL_MAX_KIB": "0",
           "PYCOLL_CUDA_TRACE": "1", "PYCOLL_CUDA_SPLIT_CLAIMED": claimed}
    _assert_same_digests(run_ranks(WORLD, _all_reduce_split, seed, timeout=600, pg_timeout=PG_TIMEOUT, env=env))


def _two_shot_waves(rank, world, seed):
    """Two-shot all_reduce with waves forced on (PYCOLL_CUDA_TWO_SHOT_WAVES=1, every world size)
    and an odd CTA cap (7: three leader/follower pairs and one CTA without a partner), in place,
    every float dtype and op, sizes from 1 element (most CTAs idle) to 5 MiB + 3 elements;
    interleaved with static split one-shot calls (two ranks) that share the wave counters; graph
    replays."""
    dev = _setup(rank)
    out = []
    if os.environ.get("PYCOLL_CUDA_TRACE") == "1":
        # The waves happen: in every call, each leader CTA b stamps when it posted its wave
        # (event E-2, after issuing its first scatter), and its follower H + b stamps when it saw
        # that post, then takes its first step; neither stamp exists without waves.
        import pycollectives
        E = pycollectives._C.trace_events()
        set_algo("twoshot")
        for i in range(4):
            x = torch.full(((16 << 20) // 4 + 3,), float(rank + i), device=dev)
            dist.all_reduce(x)
            assert torch.all(x == sum(q + i for q in range(world))), i
            rows = dist.group.WORLD._get_backend(dev).cuda_trace()
            ctas = [rows[c * E:(c + 1) * E] for c in range(len(rows) // E)]
            live = sum(1 for r in ctas if r[0] != 0)
            H = live // 2
            assert H >= 1 and all(r[0] != 0 for r in ctas[:live]), live
            for b in range(H):
                lead, follow = ctas[b], ctas[H + b]
                posted, seen = lead[E - 2], follow[E - 2]
                assert lead[2] != 0 and posted >= lead[2], (i, b, lead[2], posted)
                assert seen >= posted > 0 and follow[2] >= seen, (i, b, posted, seen, follow[2])
            assert all(r[E - 2] == 0 for r in ctas[2 * H:]), "a CTA without a partner took part in a wave"
    for i, dtype in enumerate(FLOATS + (torch.int32,)):
        for op in ops_for(dtype)[:3]:
            for numel in (1, 1031, 300007, (5 << 20) // 4 + 3):
                set_algo("twoshot")
                key = ("ar-waves", str(dtype), _name(op), numel)
                out.append(_reduce_at_offset(seed, key, rank, world, numel, i % 2, dtype, op, dev))
                set_algo("oneshot")  # split on two ranks (PYCOLL_CUDA_SPLIT_MIN_KIB=0)
                x = torch.full((70001,), float(rank + 1), device=dev)
                dist.all_reduce(x)
                assert torch.all(x == sum(q + 1 for q in range(world))), (dtype, numel)
    set_algo("twoshot")
    _check_graph_replays(rank, world, [torch.zeros(n, device=dev) for n in (5, 300007)])
    set_algo("auto")
    torch.cuda.synchronize()
    return out


def test_two_shot_waves(seed):
    env = {"PYCOLL_CUDA_TWO_SHOT_WAVES": "1", "PYCOLL_CUDA_MAX_BLOCKS": "7", "PYCOLL_CUDA_SPLIT_MIN_KIB": "0",
           "PYCOLL_CUDA_SPLIT_CLAIMED": "0", "PYCOLL_CUDA_LL_MAX_KIB": "0", "PYCOLL_CUDA_TRACE": "1",
           "PYCOLL_CUDA_LL128_MAX_KIB": "0"}
    _assert_same_digests(run_ranks(WORLD, _two_shot_waves, seed, timeout=600, pg_timeout=PG_TIMEOUT, env=env))


# ---------------------------------------------------------------------------------------------
# reduce_scatter, all_gather


def _reduce_scatter(rank, world, seed):
    dev = _setup(rank)
    for algo in ALGOS:
        set_algo(algo)
        for dtype in DTYPES:
            ops = ops_for(dtype) if algo in ("oneshot", "ring") else (R.SUM,)
            for op in ops:
                for m in (0, 1, 7, 1031, 262147):
                    key = ("rs", algo, str(dtype), _name(op), m)
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
    dev = _setup(rank)
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
        # Odd offsets for input and output, and the list form.
        for m in (7, 1031, 65537):
            key = ("ag-offset", algo, m)
            xs = [make_input(seed, key, q, m, torch.float16, dev) for q in range(world)]
            src = torch.empty(m + 1, dtype=torch.float16, device=dev)[1:]
            src.copy_(xs[rank])
            dst = torch.zeros(world * m + 3, dtype=torch.float16, device=dev)
            dist.all_gather_into_tensor(dst[3:], src)
            check_close(dst[3:], torch.cat(xs), torch.float16, str(key))
            assert torch.equal(dst[:3], torch.zeros(3, dtype=torch.float16, device=dev))
            lst = [torch.empty(m, dtype=torch.float16, device=dev) for _ in range(world)]
            dist.all_gather(lst, src)
            check_close(torch.cat(lst), torch.cat(xs), torch.float16, str(key) + "-list")
    set_algo("auto")
    torch.cuda.synchronize()
    return out


def test_all_gather(seed):
    _assert_same_digests(run_ranks(WORLD, _all_gather, seed, timeout=600, pg_timeout=PG_TIMEOUT))


# ---------------------------------------------------------------------------------------------
# broadcast, reduce, all_to_all, send/recv, barrier


def _broadcast_reduce(rank, world, seed):
    dev = _setup(rank)
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
                    key = ("reduce", root, str(dtype), _name(op), numel)
                    xs = [make_input(seed, key, q, numel, dtype, dev, op) for q in range(world)]
                    t = xs[rank].clone()
                    dist.reduce(t, dst=root, op=op)
                    if rank == root:
                        check_close(t, reference(xs, op, dtype), dtype, str(key))
    torch.cuda.synchronize()


def test_broadcast_and_reduce(seed):
    run_ranks(WORLD, _broadcast_reduce, seed, timeout=600, pg_timeout=PG_TIMEOUT)


def _all_to_all(rank, world, seed):
    dev = _setup(rank)
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
    dev = _setup(rank)
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
    _setup(rank)
    for _ in range(5):
        dist.barrier()
    # A barrier after GPU work still orders it: rank 1 reads what rank 0 wrote before.
    dev = torch.device("cuda", rank)
    t = torch.full((1024,), float(rank + 1), device=dev)
    dist.all_reduce(t)
    dist.barrier()
    assert torch.all(t == world * (world + 1) / 2)


def test_barrier(seed):
    run_ranks(WORLD, _barrier, seed, timeout=120, pg_timeout=PG_TIMEOUT)


# ---------------------------------------------------------------------------------------------
# stream semantics, tensor lifetime, CUDA graphs


def _streams(rank, world, seed):
    dev = _setup(rank)
    for algo in ("oneshot", "twoshot", "ring", "tree"):
        set_algo(algo)
        # The input is produced late on the current stream: the collective must wait for it.
        x = torch.empty(1 << 20, device=dev)
        torch.cuda._sleep(20_000_000)  # about 10 ms of GPU time before the fill
        x.fill_(float(rank + 1))
        work = dist.all_reduce(x, async_op=True)
        work.wait()  # makes the current stream wait, no host sync
        y = x * 2  # runs on the current stream after the collective
        assert torch.all(y == world * (world + 1)), f"{algo}: stream ordering broken"

        # A tensor freed right after an async collective must not be handed out again before the
        # collective is done with it (recordStream on the communication stream).
        torch.cuda._sleep(20_000_000)
        z = torch.ones(1 << 22, device=dev)
        work = dist.all_reduce(z, async_op=True)
        del z
        w = torch.full((1 << 22,), 7.0, device=dev)  # would reuse z's block if it were free
        work.wait()
        torch.cuda.synchronize()
        assert torch.all(w == 7.0), f"{algo}: freed tensor reused while the collective used it"

        # A synchronous collective runs on the caller's current stream (here a side stream):
        # ordered after work queued there, and before work queued there after it.
        side = torch.cuda.Stream()
        with torch.cuda.stream(side):
            v = torch.empty(1 << 20, device=dev)
            torch.cuda._sleep(20_000_000)
            v.fill_(float(rank + 1))
            dist.all_reduce(v)
            u = v * 2
        side.synchronize()
        assert torch.all(u == world * (world + 1)), f"{algo}: sync collective not ordered on the current stream"

        # The Work of a synchronous op still completes its Future (made on demand) and reports
        # completion.
        opts = dist.AllreduceOptions()
        opts.asyncOp = False
        q = torch.full((1031,), float(rank + 1), device=dev)
        work = dist.group.WORLD.allreduce([q], opts)
        got = work.get_future().wait()[0]
        assert torch.all(got == world * (world + 1) / 2), f"{algo}: sync op's Future holds a wrong value"
        torch.cuda.synchronize()
        assert work.is_completed(), f"{algo}: sync op not completed after synchronize"

        # Collectives issued from two streams (FSDP2 all-gathers on one, reduce-scatters on
        # another) still run in issue order on every rank: rank 0 delays stream a, so without
        # ordering its all_gather on stream b would run before its all_reduce, unlike rank 1's.
        a, b = torch.cuda.Stream(), torch.cuda.Stream()
        xa = torch.full((4099,), float(rank + 1), device=dev)
        xb = torch.full((1000,), float(rank + 1), device=dev)
        gb = torch.empty(world * 1000, device=dev)
        a.wait_stream(torch.cuda.current_stream())
        b.wait_stream(torch.cuda.current_stream())
        for _ in range(3):
            with torch.cuda.stream(a):
                if rank == 0:
                    torch.cuda._sleep(20_000_000)
                dist.all_reduce(xa)
            with torch.cuda.stream(b):
                dist.all_gather_into_tensor(gb, xb, async_op=(rank % 2 == 1))
        torch.cuda.synchronize()
        s_ranks = world * (world + 1) / 2
        assert torch.all(xa == world * world * s_ranks), f"{algo}: two-stream all_reduce gave {xa[0].item()}"
        want_gb = torch.arange(1, world + 1, device=dev, dtype=torch.float32).repeat_interleave(1000)
        assert torch.equal(gb, want_gb), f"{algo}: two-stream all_gather wrong"
    set_algo("auto")


def test_stream_semantics(seed):
    run_ranks(WORLD, _streams, seed, timeout=300, pg_timeout=PG_TIMEOUT)


def _graphs(rank, world, seed):
    dev = _setup(rank)
    for algo in ("oneshot", "twoshot"):
        set_algo(algo)
        x = torch.zeros(4099, device=dev)
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            dist.all_reduce(x)  # warm-up outside the graph (creates the engine)
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            dist.all_reduce(x)
        for i in range(3):
            x.fill_(float(rank + 1 + i))
            g.replay()
            torch.cuda.synchronize()
            want = world * (world + 1) / 2 + world * i  # sum over ranks of rank + 1 + i
            assert torch.all(x == want), f"{algo}: replay {i} gave {x[0].item()}, want {want}"
    set_algo("auto")


def test_cuda_graph_replay(seed):
    run_ranks(WORLD, _graphs, seed, timeout=300, pg_timeout=PG_TIMEOUT)


# ---------------------------------------------------------------------------------------------
# bad input


def _bad_input(rank, world, seed):
    dev = _setup(rank)
    other = torch.device("cuda", (rank + 1) % world)
    checks = []

    def expect_error(fn, what):
        try:
            fn()
        except (RuntimeError, ValueError, TypeError):
            checks.append(what)
            return
        raise AssertionError(f"{what}: no error raised")

    t = torch.ones(16, device=dev)
    # A tensor on another rank's GPU, once the group is bound to this rank's (by its first op).
    dist.all_reduce(t.clone())
    expect_error(lambda: dist.all_reduce(torch.ones(16, device=other)), "wrong device")
    # all_gather output of the wrong size / dtype.
    expect_error(lambda: dist.all_gather_into_tensor(torch.empty((world + 1) * 16, device=dev), t), "all_gather size")
    expect_error(lambda: dist.all_gather_into_tensor(torch.empty(2 * 16, device=dev, dtype=torch.float16), t),
                 "all_gather dtype")
    # reduce_scatter input of the wrong size.
    expect_error(lambda: dist.reduce_scatter_tensor(torch.empty(16, device=dev), torch.ones(31, device=dev)),
                 "reduce_scatter size")
    # Bitwise op on floats.
    expect_error(lambda: dist.all_reduce(t.clone(), op=R.BAND), "bitwise on float")
    # The group still works afterwards.
    x = torch.full((33,), float(rank + 1), device=dev)
    dist.all_reduce(x)
    assert torch.all(x == world * (world + 1) / 2)
    return checks


def test_bad_input_raises(seed):
    run_ranks(WORLD, _bad_input, seed, timeout=120, pg_timeout=PG_TIMEOUT)


def _mismatch(rank, world, seed):
    """Ranks that call a collective with different sizes or roots get an error naming both calls
    (the check word every message carries), not garbage and not a timeout. Each case breaks its
    group for good, so each gets a fresh one."""
    dev = _setup(rank)
    last = world - 1
    cases = {
        "all_reduce": lambda: dist.all_reduce(torch.ones(16 if rank < last else 48, device=dev), group=g),
        "reduce_scatter": lambda: dist.reduce_scatter_tensor(
            torch.empty(8 if rank < last else 9, device=dev),
            torch.ones(world * (8 if rank < last else 9), device=dev), group=g),
        "all_gather": lambda: dist.all_gather_into_tensor(
            torch.empty(world * (5 if rank < last else 6), device=dev),
            torch.ones(5 if rank < last else 6, device=dev), group=g),
        "broadcast": lambda: dist.broadcast(torch.ones(64, device=dev), src=0 if rank < last else 1, group=g),
        # Same call, different algorithms (set_algo on some ranks only): the plan is in the word.
        "algorithm": lambda: _with_algo("twoshot" if rank < last else "ring",
                                        lambda: dist.all_reduce(torch.ones(1 << 16, device=dev), group=g)),
        # Two-shot of different sizes (LL128 on two ranks: the header's check word differs).
        "two-shot size": lambda: _with_algo("twoshot", lambda: dist.all_reduce(
            torch.ones((1 << 16) + (0 if rank < last else 64), device=dev), group=g)),
    }
    messages = {}
    for name, call in cases.items():
        g = dist.new_group(list(range(world)), timeout=PG_TIMEOUT)
        dist.all_reduce(torch.ones(4, device=dev), group=g)  # the group works
        t0 = time.monotonic()
        call()
        torch.cuda.synchronize()
        # The kernel reports on the device; the host raises at the group's next call. A rank
        # that only sent (two ranks that both think they are the broadcast root) learns of it
        # one call later, when its peer reads the stale message.
        for _ in range(3):
            try:
                dist.all_reduce(torch.ones(4, device=dev), group=g)
                torch.cuda.synchronize()
            except RuntimeError as e:  # DistBackendError
                messages[name] = str(e)
                break
        else:
            raise AssertionError(f"{name}: mismatched call went unnoticed")
        took = time.monotonic() - t0
        assert took < PG_TIMEOUT.total_seconds() / 2, f"{name}: detected only after {took:.1f} s (a timeout?)"
    return messages


def _with_algo(name, call):
    set_algo(name)
    try:
        call()
    finally:
        set_algo("auto")


def test_mismatched_calls_raise(seed):
    results = run_ranks(WORLD, _mismatch, seed, timeout=300, pg_timeout=PG_TIMEOUT)
    for name in ("all_reduce", "reduce_scatter", "all_gather", "broadcast", "algorithm", "two-shot size"):
        texts = [r[name] for r in results]
        assert any("called different collectives" in t for t in texts), f"{name}: {texts}"
        assert all("unusable" in t for t in texts), f"{name}: {texts}"
    texts = [r["algorithm"] for r in results]
    assert any("two-shot" in t and "ring" in t for t in texts), texts


def _error_of_first_call(group, dev, what):
    """The text of the error a 1 MiB all_reduce on `group` raises; `what` names what went unnoticed."""
    try:
        dist.all_reduce(torch.ones(1 << 20, device=dev), group=group)
        torch.cuda.synchronize()
    except RuntimeError as e:
        return str(e)
    raise AssertionError(f"{what} went unnoticed")


def _settings_differ(rank, world, seed):
    """A group whose ranks start their CUDA engines with different launch settings (here
    PYCOLL_CUDA_MAX_BLOCKS on the last rank) fails on every rank at its first CUDA collective,
    naming the setting and each rank's value, instead of running kernels that do not fit
    together. Other groups keep working."""
    dev = _setup(rank)
    last = world - 1
    os.environ["PYCOLL_CUDA_MAX_BLOCKS"] = "32" if rank == last else "64"
    g = dist.new_group(list(range(world)), timeout=PG_TIMEOUT)
    t0 = time.monotonic()
    text = _error_of_first_call(g, dev, "different PYCOLL_CUDA_MAX_BLOCKS")
    assert time.monotonic() - t0 < PG_TIMEOUT.total_seconds() / 2
    del os.environ["PYCOLL_CUDA_MAX_BLOCKS"]
    # Same for a calibration (PYCOLL_COST_MODEL) that only the last rank loaded: its `auto` would
    # choose other kernels than the other ranks'.
    import pycollectives
    if rank == last:
        pycollectives._C.set_cuda_choices("all_reduce", world, [(1 << 20, "ring")], 1 << 30)
    g2 = dist.new_group(list(range(world)), timeout=PG_TIMEOUT)
    text2 = _error_of_first_call(g2, dev, "a measured-choice table on one rank")
    pycollectives._C.clear_cuda_choices()
    x = torch.full((1 << 18,), float(rank + 1), device=dev)
    dist.all_reduce(x)  # the default group's engine starts now, with equal settings
    assert torch.all(x == world * (world + 1) / 2)
    torch.cuda.synchronize()
    return text, text2


def test_settings_differ_raise(seed):
    texts = run_ranks(WORLD, _settings_differ, seed, timeout=300, pg_timeout=PG_TIMEOUT)
    last = WORLD - 1
    for t, t2 in texts:
        assert "different settings" in t and "PYCOLL_CUDA_MAX_BLOCKS: rank 0 has 64" in t, t
        assert f"rank {last} has 32" in t, t
        assert "measured auto choices (PYCOLL_COST_MODEL): rank 0 has none" in t2, t2
        assert f"rank {last} has allreduce x{WORLD}: 1048576=ring" in t2, t2


if __name__ == "__main__":  # pragma: no cover - lets the device machine run it without pytest plugins
    import sys

    _repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    sys.path.insert(0, _repo)
    os.environ["PYTHONPATH"] = _repo + os.pathsep + os.environ.get("PYTHONPATH", "")
    s = int(os.environ.get("PYCOLL_TEST_SEED", "1234"))
    names = sys.argv[1:] or [n for n in dir() if n.startswith("test_")]
    for n in names:
        print(n, flush=True)
        globals()[n](s)
    print("all passed")
