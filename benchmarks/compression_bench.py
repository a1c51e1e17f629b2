"""Where gradient compression pays end to end, and what its kernels cost.

    python benchmarks/compression_bench.py                 # CPU: 2 ranks, gloo and pycoll; GPU parts if GPUs
    python benchmarks/compression_bench.py --parts cpu --steps 20 --width 2048 --depth 3
    python benchmarks/compression_bench.py --parts kernels,gpu_ddp --gpu-rank 4

Parts (``--parts``, comma list; default: every part the machine can run):

cpu       DDP on CPU ranks over each backend of ``--backends`` (default gloo,pycoll: the default
          group with the first, ``dist.new_group`` for the others), a communication-dominated
          model (a wide MLP: ``--depth`` Linear(width, width) layers, small batch), each rank
          fitting its own fixed batch of random targets; for none / signSGD / PowerSGD
          (r=``--rank``): step time (slowest rank per step; mean and median over the steps after
          ``--warmup``), the loss over all ranks' batches before and after the same steps, bytes
          per step.
kernels   pack_signs / unpack_signs / majority_vote / flatten_into / unflatten_from at 64 MiB of
          float32 and batched_orthogonalize_, native (pycollectives._C) against the plain-torch
          path: time and bandwidth (bytes read + written per second); on the GPU when there is one,
          else on the CPU.
gpu_ddp   >= 2 GPUs, NCCL: DDP step time with no hook, torch's powerSGD_hook and ours, both at
          rank ``--gpu-rank``; overhead = step time - the no-hook step time (the aim: ours at most
          0.6x torch's, docs/compression.md), and the loss after the same steps.

Writes ``<out>/<date>-<card>-compression.json`` (command, date, machine, configuration, results)
and prints a table.
"""
import argparse
import datetime
import json
import os
import platform
import socket
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
if REPO not in sys.path:
    sys.path.insert(0, REPO)

from pycollectives.bench.report import cpu_model  # noqa: E402 (after the path set-up)


# ------------------------------------------------------------------------------------------------
# machine description


def machine():
    info = {
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cpu": cpu_model(),
        "cpu_count": os.cpu_count(),
        "cuda": torch.version.cuda,
        "gpus": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        if torch.cuda.is_available() else [],
    }
    try:
        from pycollectives.hooks import _kernels as K

        info["native_kernels"] = K.native_available()
        info["native_module"] = getattr(K._native_module, "__name__", None)
    except Exception as e:  # noqa: BLE001
        info["native_kernels"] = f"unavailable: {e}"
    return info


def slug(text):
    import re

    text = re.sub(r"\((r|tm|c)\)", "", text, flags=re.IGNORECASE).split("@")[0]
    text = re.sub(r"\b(cpu|processor)\b", "", text, flags=re.IGNORECASE)
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "unknown"


# ------------------------------------------------------------------------------------------------
# the model and the task


def make_model(width, depth, d_in, d_out, seed):
    torch.manual_seed(seed)
    layers = [torch.nn.Linear(d_in, width), torch.nn.ReLU()]
    for _ in range(depth):
        layers += [torch.nn.Linear(width, width), torch.nn.ReLU()]
    layers.append(torch.nn.Linear(width, d_out))
    return torch.nn.Sequential(*layers)


def make_data(seed, world, batch, d_in, d_out, device):
    """One fixed batch per rank (inputs and random targets) that the model memorises: the loss moves
    within a few steps, so that the methods can be compared after the same steps."""
    g = torch.Generator().manual_seed(seed + 12345)
    xs = torch.randn(world, batch, d_in, generator=g)
    ys = torch.randn(world, batch, d_out, generator=g)
    return xs.to(device), ys.to(device)


def setup_hook(ddp, method, group, rank_r, device_type):
    from pycollectives.hooks import PowerSGDState, SignSGDState, powersgd_hook, signsgd_hook

    if method == "none":
        return None
    if method == "signsgd":
        state = SignSGDState(process_group=group)
        ddp.register_comm_hook(state, signsgd_hook)
        return state
    if method == "powersgd":
        state = PowerSGDState(process_group=group, matrix_approximation_rank=rank_r, start_powerSGD_iter=2)
        ddp.register_comm_hook(state, powersgd_hook)
        return state
    if method == "torch_powersgd":
        from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as P

        state = P.PowerSGDState(process_group=group, matrix_approximation_rank=rank_r, start_powerSGD_iter=2)
        ddp.register_comm_hook(state, P.powerSGD_hook)
        return state
    raise ValueError(method)


def train(method, group, args, rank, world, device, d_in=256, d_out=16):
    """Warmup + timed steps of DDP with `method`; returns per-rank figures."""
    model = make_model(args.width, args.depth, d_in, d_out, args.seed).to(device)
    ddp_kwargs = {"process_group": group, "bucket_cap_mb": args.bucket_mb}
    if device.type == "cuda":
        ddp_kwargs["device_ids"] = [device.index]
    ddp = torch.nn.parallel.DistributedDataParallel(model, **ddp_kwargs)
    state = setup_hook(ddp, method, group, args.gpu_rank if device.type == "cuda" else args.rank, device.type)
    batch = args.batch if device.type == "cpu" else args.gpu_batch
    xs, ys = make_data(args.seed, world, batch, d_in, d_out, device)
    lr = args.lr if device.type == "cpu" else args.gpu_lr
    opt = torch.optim.SGD(ddp.parameters(), lr=lr, momentum=0.9)
    autocast = torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" else torch.autocast(
        "cpu", enabled=False)

    def eval_loss():  # over every rank's batch
        with torch.no_grad(), autocast:
            return float(torch.nn.functional.mse_loss(model(xs.flatten(0, 1)).float(), ys.flatten(0, 1)))

    loss0 = eval_loss()
    times = []
    for step in range(args.warmup + args.steps):
        if step == args.warmup:
            if hasattr(state, "stats"):
                state.stats.reset()
            dist.barrier(group=group)
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with autocast:
            out = ddp(xs[rank])
        torch.nn.functional.mse_loss(out.float(), ys[rank]).backward()
        opt.step()
        if device.type == "cuda":
            torch.cuda.synchronize()
        if step >= args.warmup:
            times.append(time.perf_counter() - t0)
    loss = eval_loss()
    stats = state.stats.as_dict() if hasattr(state, "stats") else None
    params = sum(p.numel() for p in model.parameters())
    return {"method": method, "step_ms": [t * 1e3 for t in times], "loss": loss, "loss0": loss0,
            "params": params, "hook_stats": stats}


# ------------------------------------------------------------------------------------------------
# rank entry points (spawned)


def _init(rank, world, tmpdir, backend, device):
    store = dist.FileStore(os.path.join(tmpdir, "store"), world)
    kwargs = {}
    if device.type == "cuda":
        kwargs["device_id"] = device
    dist.init_process_group(backend, store=store, rank=rank, world_size=world, **kwargs)


def _cpu_rank(rank, world, args, tmpdir):
    torch.set_num_threads(args.threads)
    backends = args.backends
    if "pycoll" in backends:
        import pycollectives  # noqa: F401  (registers "pycoll")
    device = torch.device("cpu")
    _init(rank, world, tmpdir, backends[0], device)
    groups = {backends[0]: None}
    for b in backends[1:]:
        groups[b] = dist.new_group(backend=b)
    rows = []
    for bname, group in groups.items():
        for method in args.methods:
            if "pycoll" in backends:
                import pycollectives

                pycollectives.reset_stats()
            row = train(method, group, args, rank, world, device)
            row["backend"] = bname
            if bname == "pycoll":  # what pycoll counted (construction broadcasts and warmup included)
                row["pycoll_stats"] = pycollectives.stats()
            rows.append(row)
    with open(os.path.join(tmpdir, f"rank{rank}.json"), "w") as fh:
        json.dump(rows, fh)
    dist.destroy_process_group()


def _gpu_rank(rank, world, args, tmpdir):
    device = torch.device("cuda", rank)
    torch.cuda.set_device(device)
    _init(rank, world, tmpdir, "nccl", device)
    rows = []
    for method in args.gpu_methods:
        row = train(method, None, args, rank, world, device)
        row["backend"] = "nccl"
        rows.append(row)
        torch.cuda.empty_cache()
    with open(os.path.join(tmpdir, f"rank{rank}.json"), "w") as fh:
        json.dump(rows, fh)
    dist.destroy_process_group()


def run_spawned(fn, world, args):
    with tempfile.TemporaryDirectory(prefix="pycoll-compress-bench-") as tmpdir:
        mp.start_processes(fn, args=(world, args, tmpdir), nprocs=world, join=True, start_method="spawn")
        per_rank = []
        for r in range(world):
            with open(os.path.join(tmpdir, f"rank{r}.json")) as fh:
                per_rank.append(json.load(fh))
    merged = []
    for rows in zip(*per_rank):
        row = dict(rows[0])
        steps = len(row["step_ms"])
        # time per step: the slowest rank at each step, then the mean over steps
        worst = [max(r["step_ms"][i] for r in rows) for i in range(steps)]
        row["step_ms_mean"] = sum(worst) / steps
        row["step_ms_median"] = sorted(worst)[steps // 2]
        row["step_ms_min"] = min(worst)
        row["step_ms"] = worst
        merged.append(row)
    return merged


# ------------------------------------------------------------------------------------------------
# kernel timing


def _timer(device):
    if device.type == "cuda":
        def timed(fn, iters):
            fn()
            torch.cuda.synchronize()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(iters):
                fn()
            end.record()
            end.synchronize()
            return start.elapsed_time(end) / 1e3 / iters
    else:
        def timed(fn, iters):
            fn()
            t0 = time.perf_counter()
            for _ in range(iters):
                fn()
            return (time.perf_counter() - t0) / iters
    return timed


def bench_kernels(device, iters, mib=64):
    from pycollectives.hooks import _kernels as K

    torch.manual_seed(0)
    n = (mib << 20) // 4
    x = torch.randn(n, device=device)
    packed = K.ref_pack_signs(x) if not K.native_available() else K.pack_signs(x)
    rows2 = torch.stack([packed, K.pack_signs(-x) if K.native_available() else K.ref_pack_signs(-x)])
    parts = [torch.randn(n // 64, device=device) for _ in range(64)]
    bucket = torch.empty(n, device=device)
    mats = torch.randn(64, 1024, 4, device=device)
    timed = _timer(device)
    cases = [
        # name, bytes moved, native fn, torch fn
        ("pack_signs", 4 * n + n // 8, lambda: K.pack_signs(x), lambda: K.ref_pack_signs(x)),
        # Into a buffer kept across calls, as the signSGD hook does: a fresh 64 MiB output would
        # time the page faults of its first touch (~50 ms on the CPU), not the kernel.
        ("unpack_signs", n // 8 + 4 * n, lambda: K.unpack_signs(packed, n, 1.0, out=bucket),
         lambda: K.ref_unpack_signs(packed, n, 1.0, out=bucket)),
        ("majority_vote_w2", 2 * n // 8 + 4 * n, lambda: K.majority_vote(rows2, n, out=bucket),
         lambda: K.ref_majority_vote(rows2, n, out=bucket)),
        ("flatten_into_64", 8 * n, lambda: K.flatten_into(parts, bucket), lambda: torch.cat(parts, out=bucket)),
        ("unflatten_from_64", 8 * n, lambda: K.unflatten_from(bucket, parts),
         lambda: K.ref_unflatten_from(bucket, parts)),
        ("orthogonalize_64x1024x4", 2 * 4 * mats.numel(), lambda: K.batched_orthogonalize_(mats),
         lambda: K.ref_batched_orthogonalize_(mats)),
        ("torch_qr_64x1024x4", 2 * 4 * mats.numel(), None, lambda: torch.linalg.qr(mats)),
    ]
    out = []
    for name, nbytes, native, ref in cases:
        row = {"kernel": name, "device": str(device), "bytes": nbytes}
        if native is not None and K.native_available():
            t = timed(native, iters)
            row.update(native_us=t * 1e6, native_gbps=nbytes / t / 1e9)
        t = timed(ref, max(1, iters // 4))
        row.update(torch_us=t * 1e6, torch_gbps=nbytes / t / 1e9)
        out.append(row)
    return out


# ------------------------------------------------------------------------------------------------


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--parts", default=None, help="cpu,kernels,gpu_ddp (default: all the machine can run)")
    ap.add_argument("--backends", default="gloo,pycoll", help="CPU backends, comma list (first = default group)")
    ap.add_argument("--methods", default="none,signsgd,powersgd")
    ap.add_argument("--nproc", type=int, default=2, help="CPU ranks")
    ap.add_argument("--threads", type=int, default=1, help="torch threads per CPU rank")
    ap.add_argument("--width", type=int, default=2048)
    ap.add_argument("--depth", type=int, default=3)
    ap.add_argument("--batch", type=int, default=8, help="CPU batch per rank")
    ap.add_argument("--rank", type=int, default=4, help="PowerSGD rank on CPU")
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--bucket-mb", type=float, default=25.0)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--gpu-methods", default="none,torch_powersgd,powersgd,signsgd")
    ap.add_argument("--gpu-rank", type=int, default=4, help="PowerSGD rank on GPUs (ours and torch's)")
    ap.add_argument("--gpu-width", type=int, default=4096)
    ap.add_argument("--gpu-depth", type=int, default=8)
    ap.add_argument("--gpu-batch", type=int, default=4096)
    ap.add_argument("--gpu-nproc", type=int, default=0, help="GPU ranks (0: every visible GPU)")
    ap.add_argument("--gpu-lr", type=float, default=0.02)
    ap.add_argument("--gpu-steps", type=int, default=30)
    ap.add_argument("--kernel-iters", type=int, default=20)
    ap.add_argument("--out", default=os.path.join(HERE, "results"))
    ap.add_argument("--name", default="compression")
    args = ap.parse_args(argv)
    args.backends = [b for b in args.backends.split(",") if b]
    args.methods = [m for m in args.methods.split(",") if m]
    args.gpu_methods = [m for m in args.gpu_methods.split(",") if m]
    ngpu = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if args.parts is None:
        parts = ["cpu", "kernels"] + (["gpu_ddp"] if ngpu >= 2 else [])
    else:
        parts = [p for p in args.parts.split(",") if p]
    args.parts = parts
    return args


def print_rows(title, rows, cols):
    print(f"\n{title}")
    print("  ".join(f"{c:>16}" for c in cols))
    for r in rows:
        vals = []
        for c in cols:
            v = r.get(c)
            vals.append(f"{v:16.3f}" if isinstance(v, float) else f"{str(v):>16}")
        print("  ".join(vals))


def main(argv=None):
    args = parse_args(argv)
    now = datetime.datetime.now()
    result = {"schema": "pycoll-compression-bench/1", "command": " ".join([sys.executable] + sys.argv),
              "date": now.isoformat(timespec="seconds"), "machine": machine(), "config": vars(args).copy()}
    ngpu = torch.cuda.device_count() if torch.cuda.is_available() else 0

    if "kernels" in args.parts:
        device = torch.device("cuda" if ngpu else "cpu")
        result["kernels"] = bench_kernels(device, args.kernel_iters if ngpu else max(2, args.kernel_iters // 5))
        print_rows(f"kernels at 64 MiB float32 on {device}", result["kernels"],
                   ["kernel", "native_us", "native_gbps", "torch_us", "torch_gbps"])

    if "cpu" in args.parts:
        rows = run_spawned(_cpu_rank, args.nproc, args)
        base = {r["backend"]: r["step_ms_median"] for r in rows if r["method"] == "none"}
        for r in rows:
            r["speedup_vs_none"] = base.get(r["backend"], float("nan")) / r["step_ms_median"]
            hs = r.get("hook_stats") or {}
            r["bytes_per_step"] = (hs.get("sent_bytes", 0) / max(args.steps, 1)) if hs else \
                4.0 * r["params"]  # plain all_reduce: the gradients
        result["cpu"] = rows
        print_rows(f"DDP on {args.nproc} CPU ranks, MLP {args.depth}x{args.width} ({rows[0]['params'] / 1e6:.1f} M "
                   f"params), batch {args.batch}/rank, {args.steps} steps",
                   rows, ["backend", "method", "step_ms_median", "step_ms_mean", "speedup_vs_none", "loss0", "loss",
                          "bytes_per_step"])

    if "gpu_ddp" in args.parts:
        if ngpu < 2:
            result["gpu_ddp"] = {"skipped": f"needs 2 GPUs, {ngpu} visible"}
        else:
            gargs = argparse.Namespace(**vars(args))
            gargs.width, gargs.depth, gargs.steps = args.gpu_width, args.gpu_depth, args.gpu_steps
            world = args.gpu_nproc or ngpu
            rows = run_spawned(_gpu_rank, world, gargs)
            # medians: a shared GPU host has outlier steps that a mean would charge to one row
            base = next(r["step_ms_median"] for r in rows if r["method"] == "none")
            for r in rows:
                r["overhead_ms"] = r["step_ms_median"] - base
            ours = next((r for r in rows if r["method"] == "powersgd"), None)
            theirs = next((r for r in rows if r["method"] == "torch_powersgd"), None)
            summary = {}
            if ours and theirs:
                summary["overhead_ratio_ours_vs_torch"] = ours["overhead_ms"] / theirs["overhead_ms"] \
                    if theirs["overhead_ms"] > 0 else None
            result["gpu_ddp"] = {"world": world, "rows": rows, "summary": summary}
            print_rows(f"DDP on {world} GPUs (NCCL), MLP {gargs.depth}x{gargs.width} "
                       f"({rows[0]['params'] / 1e6:.0f} M params), bf16 autocast, batch {args.gpu_batch}/rank",
                       rows, ["method", "step_ms_median", "step_ms_mean", "overhead_ms", "loss0", "loss"])
            print(f"summary: {summary}")

    os.makedirs(args.out, exist_ok=True)
    card = result["machine"]["gpus"][0] if ngpu and ("kernels" in args.parts or "gpu_ddp" in args.parts) \
        else result["machine"]["cpu"]
    base = os.path.join(args.out, f"{now.date().isoformat()}-{slug(card)}-{args.name}")
    path, i = base + ".json", 2
    while os.path.exists(path):
        path, i = f"{base}-{i}.json", i + 1
    with open(path, "w") as fh:
        json.dump(result, fh, indent=1)
    print(f"\nwrote {path}")
    return result


if __name__ == "__main__":
    main()
