"""Shared pieces of the framework-integration tests (test_integration_*.py).

Every integration test trains the same deterministic model twice -- once on
the backend under test ($PYCOLL_TEST_BACKEND, "pycoll" by default) and once
on the reference backend (Gloo for CPU tensors, NCCL for CUDA tensors) -- and
compares what comes back.  Where ranks share a GPU (PYCOLL_GPU_WORLD on fewer
GPUs than ranks, rank r on GPU r % count: tests/gpu_collectives_util.py), NCCL
refuses the group ("Duplicate GPU detected"), and the reference is Gloo: on
CUDA tensors where the test's collectives are ones Gloo serves on CUDA
(all_reduce, broadcast, all_gather), else on CPU copies of the same inputs
(`reference`).  `compare_backends` does the two runs with
`ranks.run_ranks`; the helpers below build the tiny models and the
per-rank data from the session seed, so that every rank (and the parent) can
regenerate any rank's batch.

Start-up cost: DistributedDataParallel, FSDP2, ZeRO, pipelining and DCP all
import torch._dynamo on first use (about 3-4 s per process on the CI box).
`ranks.py` preloads only torch and torch.distributed in its forkserver, so
`preload_frameworks()` (called when this module is imported, i.e. at pytest
collection, before any rank starts) adds those modules to the forkserver's
preload list: each rank then starts with them already imported.
"""

import io
import math
import os
import zlib

import pytest
import torch

import ranks
from gpu_collectives_util import gpus_missing, setup_device, shares_gpus
from ranks import run_ranks

FRAMEWORK_MODULES = [
    "torch",
    "torch.distributed",
    "torch._dynamo",
    "torch.nn.parallel",
    "torch.distributed.algorithms.ddp_comm_hooks",
    "torch.distributed.optim",
    "torch.distributed.fsdp",
    "torch.distributed.tensor",
    "torch.distributed.pipelining",
    "torch.distributed.checkpoint",
]


def preload_frameworks():
    """Have ranks.py's forkserver import the frameworks once, not every rank.
    A no-op when the server is already running or the start method is not
    forkserver (then every rank pays the import)."""
    method = os.environ.get("PYCOLL_TEST_START_METHOD", "forkserver")
    if method != "forkserver":
        return
    ctx = ranks._context(None)
    ctx.set_forkserver_preload(FRAMEWORK_MODULES)


preload_frameworks()


# --------------------------------------------------------------------------
# running the same thing on two backends

REF_BACKEND = {"cpu": "gloo", "cuda": "nccl"}

# The cuda param runs with ranks sharing one GPU too (shares_gpus): a test whose logic needs a GPU
# per rank marks itself with gpu_collectives_util.skip_if_sharing.
DEVICES = [
    pytest.param("cpu", id="cpu"),
    pytest.param("cuda", id="cuda", marks=[pytest.mark.gpu, pytest.mark.shares_gpus]),
]


def require_device(device, world_size=2):
    """Skip unless the backend under test can serve `device` tensors on `world_size` ranks here:
    a GPU per rank, or fewer GPUs that the ranks share where PYCOLL_GPU_WORLD is set."""
    if device != "cuda":
        return
    # (A pycollectives built without its CUDA engine still serves CUDA
    # tensors, staged through host memory: no skip for that.)
    why = gpus_missing(world_size)
    if why:
        pytest.skip(why)


def reference(device, world_size=2, gloo_on_cuda=True):
    """(backend, device) of the reference run of a test of `device` tensors on `world_size` ranks:
    Gloo on the CPU, NCCL on CUDA. Where the ranks share a GPU, NCCL refuses them ("Duplicate GPU
    detected"): then Gloo, on CUDA tensors when `gloo_on_cuda` (the test's collectives are ones
    Gloo serves on CUDA: all_reduce, broadcast, all_gather), else on CPU copies of the inputs."""
    if device == "cuda" and shares_gpus(world_size):
        return "gloo", ("cuda" if gloo_on_cuda else "cpu")
    return REF_BACKEND[device], device


def _packed(rank, ws, fn, *args):
    # Tensors cannot travel back through run_ranks' pipe as they are: torch's
    # multiprocessing reducers share their storage by file descriptor, which
    # is gone once the rank exits.  Send torch.save bytes instead.
    buf = io.BytesIO()
    torch.save(fn(rank, ws, *args), buf)
    return buf.getvalue()


def run_tensors(world_size, fn, *args, **kw):
    """run_ranks for functions that return tensors (possibly nested)."""
    out = run_ranks(world_size, _packed, fn, *args, **kw)
    return [None if b is None else torch.load(io.BytesIO(b), weights_only=False) for b in out]


def compare_backends(fn, *args, device="cpu", world_size=2, timeout=180, gloo_on_cuda=True, **kw):
    """Run ``fn(rank, ws, device, *args)`` on the backend under test and on the
    reference backend for `device` (`reference`: where ranks share a GPU, Gloo,
    on the CPU unless `gloo_on_cuda`); return (results, reference_results), each
    the list of the ranks' return values (tensors come back on the CPU)."""
    require_device(device, world_size)
    res = run_tensors(world_size, fn, device, *args, timeout=timeout, **kw)
    ref_backend, ref_device = reference(device, world_size, gloo_on_cuda)
    ref = run_tensors(world_size, fn, ref_device, *args, timeout=timeout,
                      backend=ref_backend, **kw)
    return res, ref


def rank_device(rank, device):
    """The torch.device a rank uses (cuda:<rank % GPUs> for "cuda": ranks share GPUs where there
    are fewer GPUs than ranks, and then run pycoll's CUDA kernels there unless
    PYCOLL_CUDA_SAME_DEVICE says otherwise: gpu_collectives_util.setup_device)."""
    if device == "cuda":
        return setup_device(rank)
    return torch.device("cpu")


def deterministic(device):
    torch.use_deterministic_algorithms(True, warn_only=True)
    if device == "cuda":
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.backends.cudnn.deterministic = True
        torch.backends.cudnn.benchmark = False
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False


def gen(seed, *key):
    """A CPU generator seeded from the session seed and a key (rank, step...)."""
    g = torch.Generator()
    g.manual_seed(zlib.crc32(repr((seed,) + tuple(key)).encode()))
    return g


def randn(shape, seed, *key, device="cpu", dtype=torch.float32):
    return torch.randn(shape, generator=gen(seed, *key)).to(device=device, dtype=dtype)


def to_cpu(obj):
    """Detach and move every tensor of a nested structure to the CPU."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().to("cpu").clone()
    if isinstance(obj, dict):
        return {k: to_cpu(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(to_cpu(v) for v in obj)
    return obj


def assert_close(actual, expected, rtol=1e-5, atol=1e-6, what="", exact=False):
    """torch.testing.assert_close over nested dicts/lists/tuples of tensors
    and numbers, naming the path of the first mismatch."""
    if isinstance(expected, dict):
        assert isinstance(actual, dict), f"{what}: {type(actual)} vs dict"
        assert actual.keys() == expected.keys(), f"{what}: keys {actual.keys()} vs {expected.keys()}"
        for k in expected:
            assert_close(actual[k], expected[k], rtol, atol, f"{what}.{k}", exact)
        return
    if isinstance(expected, (list, tuple)):
        assert isinstance(actual, (list, tuple)) and len(actual) == len(expected), (
            f"{what}: {actual!r:.200} vs {expected!r:.200}")
        for i, (a, e) in enumerate(zip(actual, expected)):
            assert_close(a, e, rtol, atol, f"{what}[{i}]", exact)
        return
    if expected is None or isinstance(expected, (str, bool, bytes)):
        assert actual == expected, f"{what}: {actual!r} != {expected!r}"
        return
    a = torch.as_tensor(actual)
    e = torch.as_tensor(expected)
    if exact:
        assert a.dtype == e.dtype and a.shape == e.shape and torch.equal(a, e), (
            f"{what}: not bitwise equal; max |diff| = "
            f"{(a.double() - e.double()).abs().max().item() if a.numel() else 0}")
        return
    torch.testing.assert_close(a, e, rtol=rtol, atol=atol, msg=lambda m: f"{what}: {m}")


def assert_replicas_equal(per_rank, key="params", what="params"):
    """Every rank's entry `key` is bitwise equal to rank 0's."""
    for r in range(1, len(per_rank)):
        assert_close(per_rank[r][key], per_rank[0][key], what=f"rank {r} vs rank 0 {what}",
                     exact=True)


# --------------------------------------------------------------------------
# tiny models


class MLP(torch.nn.Module):
    def __init__(self, d_in=16, hidden=32, d_out=4):
        super().__init__()
        self.fc1 = torch.nn.Linear(d_in, hidden)
        self.fc2 = torch.nn.Linear(hidden, hidden)
        self.fc3 = torch.nn.Linear(hidden, d_out)

    def forward(self, x):
        return self.fc3(torch.relu(self.fc2(torch.relu(self.fc1(x)))))


class TinyGPT(torch.nn.Module):
    """A two-block pre-LN transformer LM, small enough for 2 CPU cores."""

    def __init__(self, vocab=64, dim=32, heads=2, layers=2, seq=16):
        super().__init__()
        self.tok = torch.nn.Embedding(vocab, dim)
        self.pos = torch.nn.Embedding(seq, dim)
        self.blocks = torch.nn.ModuleList(
            torch.nn.TransformerEncoderLayer(dim, heads, 4 * dim, dropout=0.0, batch_first=True,
                                             norm_first=True)
            for _ in range(layers))
        self.norm = torch.nn.LayerNorm(dim)
        self.head = torch.nn.Linear(dim, vocab, bias=False)
        self.register_buffer("mask", torch.nn.Transformer.generate_square_subsequent_mask(seq),
                             persistent=False)

    def forward(self, idx):
        t = idx.shape[1]
        h = self.tok(idx) + self.pos(torch.arange(t, device=idx.device))
        for b in self.blocks:
            h = b(h, src_mask=self.mask[:t, :t], is_causal=True)
        return self.head(self.norm(h))


def lm_loss(logits, targets):
    return torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())


def lm_batch(seed, key, batch, seq, vocab, device="cpu"):
    g = gen(seed, *key)
    x = torch.randint(0, vocab, (batch, seq + 1), generator=g)
    return x[:, :-1].to(device), x[:, 1:].to(device)


def nan_free(values):
    return all(math.isfinite(v) for v in values)
