"""Shared pieces of the pycollectives examples: argument parsing, the models
(a GPT-style decoder and a small CIFAR-10 CNN), synthetic or on-disk data,
the launcher (torchrun or self-launch with torch.multiprocessing.spawn), the
step timer, and the report (``--compare``: the same training on a second
backend in the same launch, then both step times and their ratio).

An example defines ``train(args, run) -> dict`` and calls
``launch(train, args)``.  ``run`` (a :class:`Run`) carries the rank, world
size, device and the process group of the backend being measured; ``train``
must pass ``run.group`` to everything that communicates (DDP's
``process_group=``, a DeviceMesh, pipeline stages), so that the same code
runs once per backend.  It returns ``{"losses": [...], "param_norm": x,
"ms_per_step": y, ...}`` with losses already averaged over ranks.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import math
import os
import socket
import statistics
import sys
import time
import zlib
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

# --------------------------------------------------------------------------
# arguments

# GPU default: 12 layers, width 1024, 16 heads, vocab 8192, 1024 tokens:
# about 169 M parameters (the GPT that docs/compression.md measures DDP with).
GPT_GPU = dict(layers=12, dim=1024, heads=16, seq=1024, vocab=8192, batch=8)
GPT_CPU = dict(layers=2, dim=64, heads=4, seq=64, vocab=256, batch=4)


def gpu_count() -> int:
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def base_parser(description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description,
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--device", choices=["cpu", "cuda"], default=None,
                   help="default: cuda when a GPU is visible, else cpu")
    p.add_argument("--backend", default="pycoll", help="backend of the measured run")
    p.add_argument("--compare", default="none", choices=["none", "nccl", "gloo", "pycoll"],
                   help="also run the same steps on this backend and print both step times")
    p.add_argument("--nproc", type=int, default=None,
                   help="ranks to spawn when not under torchrun (default: GPU count, or 2 on CPU)")
    p.add_argument("--steps", type=int, default=None, help="optimizer steps (default 30 GPU, 10 CPU)")
    p.add_argument("--warmup", type=int, default=None,
                   help="steps left out of the step time (default 5 GPU, 2 CPU)")
    p.add_argument("--batch", type=int, default=None, help="per-rank micro-batch size")
    p.add_argument("--lr", type=float, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--data", default=None, help="data on disk (else synthetic data)")
    p.add_argument("--threads", type=int, default=None,
                   help="CPU threads per rank (default: cores / ranks)")
    p.add_argument("--result-line", action="store_true",
                   help="rank 0 prints 'RESULT {json}' per backend (used by the tests)")
    p.add_argument("--rounds", type=int, default=None,
                   help="with --compare: train on every backend this many times, alternating which goes "
                        "first (the first run of a process is often slower), and report each backend's "
                        "median step time (default 2 on GPU, 1 on CPU)")
    p.add_argument("--profile", default=None, metavar="DIR",
                   help="run each backend under torch.profiler: rank 0 prints the kernels and ops that "
                        "took the most time, and every rank writes DIR/<backend>-rank<r>.json "
                        "(chrome://tracing, Perfetto)")
    return p


def add_gpt_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("model (defaults: about 169 M parameters on GPU, tiny on CPU)")
    for k in ("layers", "dim", "heads", "seq", "vocab"):
        g.add_argument(f"--{k}", type=int, default=None,
                       help=f"GPU default {GPT_GPU[k]}, CPU default {GPT_CPU[k]}")
    g.add_argument("--amp", default=None, action=argparse.BooleanOptionalAction,
                   help="bf16 autocast (default: on for cuda, off for cpu)")


def finish_args(args: argparse.Namespace, gpt: bool = False) -> argparse.Namespace:
    """Fill the device-dependent defaults."""
    if args.device is None:
        args.device = "cuda" if gpu_count() > 0 else "cpu"
    if args.device == "cuda" and gpu_count() == 0:
        sys.exit("--device cuda: no GPU visible")
    on_gpu = args.device == "cuda"
    if args.compare == "nccl" and not on_gpu:
        sys.exit("--compare nccl needs --device cuda (use --compare gloo on CPU)")
    if args.nproc is None:
        args.nproc = gpu_count() if on_gpu else 2
    # Rank r runs on GPU r % (GPUs visible): more ranks than GPUs share them, which NCCL refuses.
    local_ranks = int(os.environ.get("LOCAL_WORLD_SIZE", args.nproc))
    if on_gpu and local_ranks > gpu_count() and "nccl" in (args.backend, args.compare):
        sys.exit(f"{local_ranks} ranks on {gpu_count()} GPU(s) share GPUs, which NCCL refuses (\"Duplicate GPU "
                 "detected\"): use --compare gloo, or as many ranks as GPUs")
    if args.steps is None:
        args.steps = 30 if on_gpu else 10
    if args.warmup is None:
        args.warmup = 5 if on_gpu else 2
    args.warmup = min(args.warmup, max(args.steps - 1, 0))
    if gpt:
        defaults = GPT_GPU if on_gpu else GPT_CPU
        for k, v in defaults.items():
            if getattr(args, k, None) is None:
                setattr(args, k, v)
        if args.amp is None:
            args.amp = on_gpu
        if getattr(args, "lr", None) is None:
            args.lr = 3e-4 if on_gpu else 1e-3
        if args.dim % args.heads:
            sys.exit(f"--dim {args.dim} is not a multiple of --heads {args.heads}")
    if args.compare in ("none", args.backend):
        args.compare = None
    if args.rounds is None:
        args.rounds = 2 if on_gpu and args.compare else 1
    if args.rounds < 1:
        sys.exit("--rounds must be at least 1")
    return args


# --------------------------------------------------------------------------
# launching


@dataclass
class Run:
    rank: int
    world_size: int
    local_rank: int  # on CUDA the index of this rank's GPU (LOCAL_RANK % GPUs: ranks may share one)
    device: torch.device
    backend: str
    group: dist.ProcessGroup

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def log(self, *msg) -> None:
        if self.is_main:
            print(f"[{self.backend}]", *msg, flush=True)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(train, args) -> None:
    """Under torchrun (RANK set): run this process's rank.  Otherwise spawn
    ``args.nproc`` ranks with torch.multiprocessing.spawn."""
    if "RANK" in os.environ:
        _rank_main(int(os.environ.get("LOCAL_RANK", 0)), train, args, spawned=False)
        return
    import torch.multiprocessing as mp

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ["MASTER_PORT"] = str(_free_port())
    os.environ["WORLD_SIZE"] = str(args.nproc)
    mp.spawn(_rank_main, args=(train, args, True), nprocs=args.nproc, join=True)


def _import_backend(name: str) -> None:
    if name == "pycoll":
        try:
            import pycollectives  # noqa: F401  (registers "pycoll")
        except ImportError as e:
            sys.exit(f"backend pycoll: cannot import pycollectives ({e}); build it with "
                     "`pip install --no-build-isolation -e .` or put the repository on PYTHONPATH")


def _rank_main(local_rank: int, train, args, spawned: bool) -> None:
    if spawned:
        os.environ["RANK"] = str(local_rank)
        os.environ["LOCAL_RANK"] = str(local_rank)
    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    if args.device == "cuda":
        # Rank r on GPU r % (GPUs visible). Ranks that share a GPU: pycoll orders their large collectives
        # with CUDA IPC events and stages the rest through host memory (PYCOLL_CUDA_SAME_DEVICE, docs/using-gpus.md).
        local_rank = local_rank % torch.cuda.device_count()
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
        local = int(os.environ.get("LOCAL_WORLD_SIZE", world))
        torch.set_num_threads(args.threads or max(1, (os.cpu_count() or 1) // local))
    for name in {args.backend, args.compare} - {None}:
        _import_backend(name)
    dist.init_process_group(args.backend, rank=rank, world_size=world,
                            timeout=datetime.timedelta(minutes=10))
    groups = {args.backend: dist.group.WORLD}
    if args.compare:
        # Every rank creates every group, in the same order.
        groups[args.compare] = dist.new_group(backend=args.compare)
    runs = {name: [] for name in groups}
    try:
        for i in range(args.rounds):
            # Alternate the order (A B, B A, ...): a process's first run pays for warm-up that
            # the warm-up steps do not cover (allocator growth, lazy kernel loading).
            order = list(groups) if i % 2 == 0 else list(reversed(groups))
            for name in order:
                group = groups[name]
                run = Run(rank, world, local_rank, device, name, group)
                torch.manual_seed(args.seed)
                with _profiled(args, f"{name}-round{i}" if args.rounds > 1 else name, rank, device):
                    runs[name].append(train(args, run))
                # device_ids: NCCL otherwise guesses the device (and warns).
                dist.barrier(group=group,
                             device_ids=[local_rank] if device.type == "cuda" else None)
                if device.type == "cuda":
                    torch.cuda.empty_cache()
        if rank == 0:
            report(args, world, {name: _median_run(rs) for name, rs in runs.items()})
    finally:
        dist.destroy_process_group()


def _median_run(results: list) -> dict:
    """One backend's result over the rounds: the first round's values (losses and the rest are
    the same every round), with the median step time and every round's."""
    out = dict(results[0], ms_per_step=statistics.median(r["ms_per_step"] for r in results))
    if len(results) > 1:
        out["ms_per_step_rounds"] = [r["ms_per_step"] for r in results]
    return out


@contextlib.contextmanager
def _profiled(args, backend: str, rank: int, device: torch.device):
    """--profile: the whole run of one backend under torch.profiler (warm-up steps included)."""
    if not args.profile:
        yield
        return
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        yield
    os.makedirs(args.profile, exist_ok=True)
    prof.export_chrome_trace(os.path.join(args.profile, f"{backend}-rank{rank}.json"))
    if rank == 0:
        key = "self_cuda_time_total" if device.type == "cuda" else "self_cpu_time_total"
        print(f"[{backend}] rank 0, whole run, by {key}:\n"
              f"{prof.key_averages().table(sort_by=key, row_limit=25, max_name_column_width=60)}", flush=True)


def report(args, world: int, results: dict) -> None:
    names = list(results)
    for name in names:
        r = results[name]
        rounds = r.get("ms_per_step_rounds")
        each = f", median of {len(rounds)} runs: {' / '.join(f'{t:.2f}' for t in rounds)}" if rounds else ""
        line = (f"{name}: {r['ms_per_step']:.2f} ms/step ({args.warmup} warm-up steps excluded, "
                f"{world} ranks, {args.device}{each}), final loss {r['losses'][-1]:.4f}")
        for k, v in r.items():
            if k not in ("losses", "ms_per_step", "param_norm", "ms_per_step_rounds"):
                line += f", {k.replace('_', ' ')} {v:.4g}" if isinstance(v, float) else f", {k} {v}"
        print(line, flush=True)
        if args.result_line:
            print("RESULT " + json.dumps(dict(r, backend=name, world_size=world)), flush=True)
    if len(names) == 2:
        a, b = (results[n]["ms_per_step"] for n in names)
        print(f"{names[0]} / {names[1]} step time: {a / b:.3f} "
              f"({names[0]} {'faster' if a < b else 'slower'} by {abs(b - a) / max(a, b) * 100:.1f}%); "
              f"final loss difference {abs(results[names[0]]['losses'][-1] - results[names[1]]['losses'][-1]):.2e}",
              flush=True)


# --------------------------------------------------------------------------
# timing and reductions


class StepTimer:
    """Mean wall time of the steps after the first `warmup`: the clock starts
    at the beginning of step `warmup` and stops after the last step, with one
    device sync at each end and none in between (pause()/resume() leave out
    work between steps, such as an evaluation)."""

    def __init__(self, device: torch.device, warmup: int):
        self.device, self.warmup = device, warmup
        self.t0 = None
        self.total = 0.0
        self.timed = 0

    def _sync(self):
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def step(self, i: int) -> None:
        """Call at the beginning of step i (0-based)."""
        if i == self.warmup:
            self._sync()
            self.t0 = time.perf_counter()
        if i >= self.warmup:
            self.timed += 1

    def pause(self) -> None:
        if self.t0 is not None:
            self._sync()
            self.total += time.perf_counter() - self.t0
            self.t0 = None

    def resume(self) -> None:
        if self.timed:
            self._sync()
            self.t0 = time.perf_counter()

    def ms_per_step(self, run: "Run") -> float:
        """The slowest rank's mean step time (ms); call once after the loop."""
        self.pause()
        local = self.total * 1e3 / self.timed if self.timed else float("nan")
        t = torch.tensor([local], dtype=torch.float64, device=_reduce_device(run))
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=run.group)
        return float(t.item())


def _reduce_device(run: "Run") -> torch.device:
    return torch.device("cpu") if dist.get_backend(run.group) == "gloo" else run.device


def mean_over_ranks(values, run: Run) -> list:
    """Average a list of per-step scalar tensors (or floats) over the ranks."""
    t = torch.stack([torch.as_tensor(v).detach().float().reshape(()).cpu() for v in values])
    t = t.to(_reduce_device(run))
    dist.all_reduce(t, group=run.group)
    return (t / run.world_size).tolist()


def sum_over_ranks(x: float, run: Run) -> float:
    t = torch.tensor([x], dtype=torch.float64, device=_reduce_device(run))
    dist.all_reduce(t, group=run.group)
    return float(t.item())


def param_norm(params) -> float:
    """L2 norm of a list of (full, unsharded) parameters."""
    return math.sqrt(sum(float(p.detach().double().pow(2).sum()) for p in params))


def autocast(args, device: torch.device):
    if getattr(args, "amp", False):
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


# --------------------------------------------------------------------------
# models


class Block(nn.Module):
    """Pre-LayerNorm transformer block: causal self-attention, then a 4x MLP."""

    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.ln2 = nn.LayerNorm(dim)
        self.fc = nn.Linear(dim, 4 * dim)
        self.out = nn.Linear(4 * dim, dim)

    def attend(self, x: torch.Tensor) -> torch.Tensor:
        """x plus the block's causal self-attention (the first residual half)."""
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return x + self.proj(y.transpose(1, 2).reshape(b, t, c))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.attend(x)
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class GPT(nn.Module):
    """Token + position embeddings, `layers` blocks, final LayerNorm, an
    untied output head.  Parameters: about 12 layers dim^2 + 2 vocab dim."""

    def __init__(self, layers: int, dim: int, heads: int, seq: int, vocab: int):
        super().__init__()
        self.tok = nn.Embedding(vocab, dim)
        self.pos = nn.Embedding(seq, dim)
        self.blocks = nn.ModuleList(Block(dim, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)
        self.apply(_init_weights)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        h = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        for blk in self.blocks:
            h = blk(h)
        return self.head(self.ln_f(h))


class GPTStage(nn.Module):
    """Blocks [first, last) of a GPT as one pipeline stage; the first stage
    also embeds, the last also normalises and projects to the vocabulary."""

    def __init__(self, model: GPT, first: int, last: int):
        super().__init__()
        self.is_first, self.is_last = first == 0, last == len(model.blocks)
        if self.is_first:
            self.tok, self.pos = model.tok, model.pos
        self.blocks = nn.ModuleList(model.blocks[first:last])
        if self.is_last:
            self.ln_f, self.head = model.ln_f, model.head

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.is_first:
            x = self.tok(x) + self.pos(torch.arange(x.shape[1], device=x.device))
        for blk in self.blocks:
            x = blk(x)
        if self.is_last:
            x = self.head(self.ln_f(x))
        return x


def _init_weights(m: nn.Module) -> None:
    if isinstance(m, (nn.Linear, nn.Embedding)):
        nn.init.normal_(m.weight, std=0.02)
        if getattr(m, "bias", None) is not None:
            nn.init.zeros_(m.bias)


def gpt_from_args(args) -> GPT:
    return GPT(args.layers, args.dim, args.heads, args.seq, args.vocab)


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())


class CNN(nn.Module):
    """Three conv-BN-ReLU stages (width w, 2w, 4w) for 3x32x32 images, 10 classes."""

    def __init__(self, width: int = 32, classes: int = 10):
        super().__init__()

        def stage(cin, cout):
            return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1, bias=False),
                                 nn.BatchNorm2d(cout), nn.ReLU(inplace=True))

        self.features = nn.Sequential(stage(3, width), stage(width, 2 * width), nn.MaxPool2d(2),
                                      stage(2 * width, 4 * width), nn.MaxPool2d(2),
                                      nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.head = nn.Linear(4 * width, classes)

    def forward(self, x):
        return self.head(self.features(x))


def count_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


# --------------------------------------------------------------------------
# data


def generator(*key) -> torch.Generator:
    return torch.Generator().manual_seed(zlib.crc32(repr(key).encode()))


def token_batches(args, rank: int, count: int, device, micro: int = 1):
    """`count` steps x `micro` micro-batches of (input, target) token tensors
    for this rank, made before the timed loop.  From --data (a flat uint16
    token file, nanoGPT's .bin format) when given, else synthetic sequences a
    model can learn: arithmetic progressions modulo the vocabulary with a
    random start and stride per sequence, 10% of the tokens replaced by noise."""
    b, t, v = args.batch, args.seq, args.vocab
    tokens = None
    if args.data:
        import numpy as np

        tokens = np.memmap(args.data, dtype=np.uint16, mode="r")
    out = []
    for step in range(count):
        mbs = []
        for m in range(micro):
            g = generator(args.seed, "tokens", rank, step, m)
            if tokens is not None:
                starts = torch.randint(0, len(tokens) - t - 1, (b,), generator=g).tolist()
                seq = torch.stack([torch.from_numpy(tokens[s:s + t + 1].astype("int64"))
                                   for s in starts]).clamp_(max=v - 1)
            else:
                start = torch.randint(0, v, (b, 1), generator=g)
                stride = torch.randint(1, 8, (b, 1), generator=g)
                seq = (start + stride * torch.arange(t + 1)) % v
                noise = torch.rand(b, t + 1, generator=g) < 0.1
                seq = torch.where(noise, torch.randint(0, v, (b, t + 1), generator=g), seq)
            mbs.append((seq[:, :-1].to(device), seq[:, 1:].to(device)))
        out.append(mbs)
    return out


def cifar10(args, train: bool, samples: int):
    """(images, labels) of CIFAR-10 from --data (the python version,
    cifar-10-batches-py) when given, else a synthetic CIFAR-10-shaped set:
    ten fixed smooth random class patterns (colour blobs) plus pixel noise,
    which a CNN learns to tell apart within an epoch or two."""
    if args.data:
        import pickle

        import numpy as np

        names = [f"data_batch_{i}" for i in range(1, 6)] if train else ["test_batch"]
        xs, ys = [], []
        for n in names:
            with open(os.path.join(args.data, n), "rb") as f:
                d = pickle.load(f, encoding="bytes")
            xs.append(np.asarray(d[b"data"], dtype=np.uint8).reshape(-1, 3, 32, 32))
            ys.extend(d[b"labels"])
        x = torch.from_numpy(np.concatenate(xs)).float().div_(255)
        mean = torch.tensor([0.4914, 0.4822, 0.4465]).view(1, 3, 1, 1)
        std = torch.tensor([0.2470, 0.2435, 0.2616]).view(1, 3, 1, 1)
        return (x - mean) / std, torch.tensor(ys)
    coarse = torch.randn(10, 3, 4, 4, generator=generator(args.seed, "patterns"))
    patterns = F.interpolate(coarse, size=32, mode="bilinear", align_corners=False)
    g = generator(args.seed, "cifar", train)
    y = torch.randint(0, 10, (samples,), generator=g)
    x = 0.75 * patterns[y] + torch.randn(samples, 3, 32, 32, generator=g)
    return x, y
