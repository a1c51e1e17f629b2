"""Shared pieces of the GPU tests of the CUDA engine (test_gpu_*.py), through torch.distributed
with backend "pycoll".

Two ranks (PYCOLL_GPU_WORLD=N for N), rank r on GPU r % (GPUs visible). With one GPU per rank by
default; a set PYCOLL_GPU_WORLD also runs them where fewer GPUs are visible, several ranks sharing
a GPU, and then makes the ranks run the CUDA engine's kernels there
(PYCOLL_CUDA_SAME_DEVICE=kernels, unless the environment or a test sets it), not the staged path.
Without a GPU they skip. Each test spawns the ranks once and loops over its cases inside them.
Every rank builds every rank's input from the same seed, so each rank computes the reference itself
(float64 for floating types, int64 with the dtype's wrap-around for integers, logical ops for
bool). Each rank returns a digest of every result; the parent checks that the ranks agree bit for
bit (the engine's results must be identical on every rank, for every algorithm).
"""
import datetime
import functools
import hashlib
import os
import sys
import tempfile
import time

import pytest
import torch
import torch.distributed as dist

from ranks import run_ranks, shm_mapped

# Every test_gpu_*.py file's module-level marks: `pytestmark = GPU_MARKS`. shares_gpus: tests/conftest.py
# runs these where fewer GPUs than ranks are visible when PYCOLL_GPU_WORLD is set.
GPU_MARKS = [
    pytest.mark.gpu,
    pytest.mark.pycoll_only,
    pytest.mark.shares_gpus,
]

# PYCOLL_GPU_WORLD=4 (or 8) runs the same suite with more ranks; on fewer GPUs they share them.
WORLD = int(os.environ.get("PYCOLL_GPU_WORLD", "2"))
GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0
# Several ranks on one GPU only when asked for (PYCOLL_GPU_WORLD given): kernels of different processes
# on one GPU time-slice unless the MPS daemon runs, so such a run is slow.
SHARE_GPUS = GPUS >= 1 and "PYCOLL_GPU_WORLD" in os.environ
SAME_DEVICE_SETTING = "PYCOLL_CUDA_SAME_DEVICE"
if SHARE_GPUS:
    # Before any rank starts (the ranks inherit it): ranks that share a GPU run the engine's kernels.
    # A test that wants the staged path passes env={SAME_DEVICE_SETTING: "staged"} to run_ranks.
    os.environ.setdefault(SAME_DEVICE_SETTING, "kernels")


def gpus_missing(world):
    """Why `world` ranks cannot run here, or None: they need a GPU each unless SHARE_GPUS."""
    if GPUS == 0:
        return "needs CUDA GPUs, none visible"
    if GPUS >= world or SHARE_GPUS:
        return None
    return (f"needs {world} CUDA GPUs, {GPUS} visible (PYCOLL_GPU_WORLD={world} runs {world} ranks on "
            f"{GPUS}, rank r on GPU r % {GPUS})")


def shares_gpus(world):
    """True when `world` ranks here put two or more on one GPU (NCCL refuses such a group)."""
    return world > GPUS


def skip_if_sharing(world, why):
    """Mark of a gpu test that cannot run with ranks sharing a GPU: it skips, naming `why`, where
    `world` ranks would share the GPUs visible here (tests/conftest.py runs the shares_gpus tests on
    one GPU when PYCOLL_GPU_WORLD is set)."""
    return pytest.mark.skipif(GPUS >= 1 and shares_gpus(world),
                              reason=f"{world} ranks would share {GPUS} GPU(s): {why}")


GPU_MARKS.append(pytest.mark.skipif(gpus_missing(WORLD) is not None, reason=gpus_missing(WORLD) or ""))
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


def op_name(op):
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


def check_all_gather_odd_offsets(seed, key, rank, world, dev, sizes):
    """all_gather_into_tensor from and into views at odd offsets (float16), against the inputs; the
    words before the output view stay untouched."""
    for m in sizes:
        k = (key, m)
        xs = [make_input(seed, k, q, m, torch.float16, dev) for q in range(world)]
        src = torch.empty(m + 1, dtype=torch.float16, device=dev)[1:]
        src.copy_(xs[rank])
        dst = torch.zeros(world * m + 3, dtype=torch.float16, device=dev)
        dist.all_gather_into_tensor(dst[3:], src)
        check_close(dst[3:], torch.cat(xs), torch.float16, str(k))
        assert torch.equal(dst[:3], torch.zeros(3, dtype=torch.float16, device=dev)), k


def check_sync_op_on_side_stream(rank, world, dev, what):
    """A synchronous all_reduce issued with a side stream as the current stream runs there: after the
    work queued on it before, before the work queued after."""
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        v = torch.empty(1 << 20, device=dev)
        torch.cuda._sleep(20_000_000)
        v.fill_(float(rank + 1))
        dist.all_reduce(v)
        u = v * 2
    side.synchronize()
    assert torch.all(u == world * (world + 1)), f"{what}: sync collective not ordered on the current stream"


def digest(t):
    t = t.contiguous()
    if t.numel() == 0:
        return "empty"
    return hashlib.sha1(t.view(-1).view(torch.uint8).cpu().numpy().tobytes()).hexdigest()


def gpu_of(rank):
    """The GPU index of `rank`: r % (GPUs visible), as a user with fewer GPUs than ranks binds them."""
    return rank % torch.cuda.device_count()


def setup_device(rank):
    """Binds this rank to its GPU (gpu_of) and returns the device. Where ranks share GPUs and the
    environment does not say otherwise, the group's engine runs its kernels there (read when the
    engine is made: at the group's first CUDA op, or at init with device_id)."""
    if SHARE_GPUS:
        os.environ.setdefault(SAME_DEVICE_SETTING, "kernels")
    dev = torch.device("cuda", gpu_of(rank))
    torch.cuda.set_device(dev)
    return dev


def _bound_rank(rank, world, store_path, pg_timeout, fn, args):
    dev = setup_device(rank)
    store = dist.FileStore(store_path, world)
    dist.init_process_group("pycoll", store=store, rank=rank, world_size=world, timeout=pg_timeout, device_id=dev)
    return fn(rank, world, *args)


def run_bound(world, fn, *args, pg_timeout=PG_TIMEOUT, **kwargs):
    """run_ranks with every rank's group bound to its GPU at init (init_process_group(device_id=
    gpu_of(rank))): ranks.py's bind_cuda binds cuda:rank, which does not exist where ranks share GPUs."""
    with tempfile.TemporaryDirectory(prefix="pycoll-bound-") as d:
        return run_ranks(world, _bound_rank, os.path.join(d, "store"), pg_timeout, fn, args, init=None, **kwargs)


def seeded_matrices(seed, world, n, dev):
    """One n x n random matrix per rank, alike on every rank (each rank computes the others' too)."""
    g = torch.Generator(device=dev)
    mats = []
    for q in range(world):
        g.manual_seed(seed * 101 + q)
        mats.append(torch.randn(n, n, generator=g, device=dev))
    return mats


def _on_gpu0(rank, world, store_path, pg_timeout, fn, args):
    """Every rank on cuda:0, the group bound to it at init (its CUDA engine is made there)."""
    dev = torch.device("cuda", 0)
    torch.cuda.set_device(dev)
    store = dist.FileStore(store_path, world)
    dist.init_process_group("pycoll", store=store, rank=rank, world_size=world, timeout=pg_timeout, device_id=dev)
    dist.all_reduce(torch.zeros(1, device=dev))
    torch.cuda.synchronize()
    # The path maps its counters' segment (/dev/shm/pycoll-sd-*, unlinked once every rank has it).
    assert any("pycoll-sd-" in p for p in shm_mapped()), (
        f"rank {rank}: no same-device events segment mapped: the group did not take the events path "
        f"({sorted(shm_mapped())})")
    return fn(rank, world, dev, *args)


def run_gpu0(fn, *args, env, pg_timeout=PG_TIMEOUT, **kwargs):
    """run_ranks with every rank on cuda:0 and the events path required (PYCOLL_CUDA_SAME_DEVICE=events
    or auto in `env`): fn(rank, world, device, *args)."""
    with tempfile.TemporaryDirectory(prefix="pycoll-sd-test-") as d:
        return run_ranks(WORLD, _on_gpu0, os.path.join(d, "store"), pg_timeout, fn, args, init=None, env=env,
                         **kwargs)


def assert_same_digests(results):
    r0 = results[0]
    for q, rq in enumerate(results[1:], 1):
        assert len(r0) == len(rq)
        diff = [a[0] for a, b in zip(r0, rq) if a != b]
        assert not diff, f"ranks 0 and {q} disagree bitwise on {len(diff)} cases, e.g. {diff[:5]}"


def large_sum(seed, key, rank, world, numel, dtype, dev):
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


def reduce_at_offset(seed, key, rank, world, numel, offset, dtype, op, dev):
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


def check_broadcast_and_all_gather(rank, world, dev, i, bcast_numel, gather_numel):
    """A broadcast from rank i % world and an all_gather, checked: other collectives on the same
    channels between the calls a test interleaves them with."""
    b = torch.full((bcast_numel,), float(rank), device=dev)
    dist.broadcast(b, src=i % world)
    assert torch.all(b == float(i % world)), i
    g = torch.empty(world * gather_numel, device=dev)
    dist.all_gather_into_tensor(g, torch.full((gather_numel,), float(rank), device=dev))
    assert torch.equal(g, torch.arange(world, device=dev).float().repeat_interleave(gather_numel)), i


def check_graph_replays(rank, world, xs, before_capture=None):
    """One all_reduce per tensor of `xs` captured in a CUDA graph (after a warm-up on a side
    stream, then `before_capture()` where given), replayed four times with fresh inputs: every
    element must be the sum over ranks."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for x in xs:
            dist.all_reduce(x)
    torch.cuda.current_stream().wait_stream(s)
    if before_capture is not None:
        before_capture()
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


def mismatch_message(g, dev, name, t0):
    """The error a mismatched call left on group `g`: the kernel reports on the device and the host
    raises at one of the group's next calls (a rank that only sent learns of it one call later,
    when its peer reads the stale message). It must come well before the group's timeout."""
    for _ in range(3):
        try:
            dist.all_reduce(torch.ones(4, device=dev), group=g)
            torch.cuda.synchronize()
        except RuntimeError as e:  # DistBackendError
            message = str(e)
            break
    else:
        raise AssertionError(f"{name}: mismatched call went unnoticed")
    took = time.monotonic() - t0
    assert took < PG_TIMEOUT.total_seconds() / 2, f"{name}: detected only after {took:.1f} s (a timeout?)"
    return message


def run_as_script(module_globals):
    """`python3 tests/test_gpu_<x>.py [test names]`: runs that file's tests (all by default) without
    pytest, so that the device machine can run them without pytest plugins."""
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    sys.path.insert(0, repo)
    os.environ["PYTHONPATH"] = repo + os.pathsep + os.environ.get("PYTHONPATH", "")
    s = int(os.environ.get("PYCOLL_TEST_SEED", "1234"))
    names = sys.argv[1:] or sorted(n for n in module_globals if n.startswith("test_"))
    for n in names:
        print(n, flush=True)
        module_globals[n](s)
    print("all passed")
