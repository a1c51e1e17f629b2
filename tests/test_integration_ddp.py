"""DistributedDataParallel on the backend under test, against Gloo (CPU) or
NCCL (GPU; Gloo on the CUDA tensors where ranks share a GPU: DDP, its hooks
and SyncBatchNorm use all_reduce, broadcast and all_gather, which Gloo serves
on CUDA): the same deterministic training runs on both and must give the
same losses, gradients, parameters and buffers.

Each variant trains a tiny model for a few steps on 2 ranks, every rank
starting from different random weights (DDP must broadcast rank 0's at
construction) and reading different data (the gradients must be averaged).
Besides the comparison with the reference backend, every variant checks that
the parameters are bitwise identical on every rank after training.
"""

import copy
import gc

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn

from integration_util import (
    DEVICES, MLP, assert_close, assert_replicas_equal, compare_backends, deterministic,
    rank_device, randn, to_cpu,
)

WORLD = 2
BATCH = 8  # per rank and micro-batch
STEPS = 5


class BranchNet(nn.Module):
    """A trunk, a branch `b` taken only when asked, and a head never used."""

    def __init__(self):
        super().__init__()
        self.trunk = nn.Linear(16, 32)
        self.a = nn.Linear(32, 4)
        self.b = nn.Linear(32, 4)
        self.never = nn.Linear(32, 4)

    def forward(self, x, use_b=True):
        h = torch.relu(self.trunk(x))
        y = self.a(h)
        if use_b:
            y = y + self.b(h)
        return y


class ConvBN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 8, 3, padding=1)
        self.bn2 = nn.BatchNorm2d(8)
        self.fc = nn.Linear(8, 4)

    def forward(self, x):
        h = torch.relu(self.bn(self.conv(x)))
        h = torch.relu(self.bn2(self.conv2(h)))
        return self.fc(h.mean((2, 3)))


def _model_and_input(variant):
    if variant in ("unused", "static_graph"):
        return BranchNet(), (16,)
    if variant in ("bn_broadcast", "syncbn"):
        return ConvBN(), (3, 8, 8)
    return MLP(), (16,)


def _hook(variant, seed):
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

    if variant == "hook_allreduce":
        return None, default_hooks.allreduce_hook
    if variant == "hook_fp16":
        return None, default_hooks.fp16_compress_hook
    if variant == "hook_bf16":
        return None, default_hooks.bf16_compress_hook
    if variant == "hook_powersgd":
        state = powerSGD_hook.PowerSGDState(
            process_group=None, matrix_approximation_rank=2, start_powerSGD_iter=2,
            min_compression_rate=0.5, use_error_feedback=True, warm_start=True,
            random_seed=seed % 1000)
        return state, powerSGD_hook.powerSGD_hook
    raise ValueError(variant)


def _ddp_rank(rank, ws, device, variant, seed):
    from torch.nn.parallel import DistributedDataParallel as DDP

    dev = rank_device(rank, device)
    deterministic(device)
    torch.manual_seed(seed + 1000 * rank)  # different weights: DDP broadcasts rank 0's
    model, in_shape = _model_and_input(variant)
    if variant == "syncbn":
        model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
    model = model.to(dev)
    kwargs = {}
    if device == "cuda":
        kwargs["device_ids"] = [dev]
    if variant == "unused":
        kwargs["find_unused_parameters"] = True
    if variant == "static_graph":
        kwargs["static_graph"] = True
    if variant == "small_buckets":
        kwargs.update(bucket_cap_mb=0.001, gradient_as_bucket_view=True)
    ddp = DDP(model, **kwargs)
    if variant.startswith("hook_"):
        state, hook = _hook(variant, seed)
        ddp.register_comm_hook(state, hook)

    # Every rank's starting weights are rank 0's.
    init = to_cpu(dict(ddp.module.named_parameters()))
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    accum = 3 if variant == "no_sync" else 1
    losses, large_batch = [], []
    for step in range(STEPS):
        opt.zero_grad(set_to_none=True)
        if variant == "no_sync":
            # The large-batch gradient: one plain model, every rank's micro-batches.
            ref_model = copy.deepcopy(ddp.module)
            xs = torch.cat([randn((BATCH,) + in_shape, seed, r, step, m, device=dev)
                            for r in range(ws) for m in range(accum)])
            ys = torch.cat([randn((BATCH, 4), seed, "y", r, step, m, device=dev)
                            for r in range(ws) for m in range(accum)])
            nn.functional.mse_loss(ref_model(xs), ys).backward()
            large_batch.append(to_cpu({n: p.grad for n, p in ref_model.named_parameters()}))
        step_loss = 0.0
        for m in range(accum):
            x = randn((BATCH,) + in_shape, seed, rank, step, m, device=dev)
            y = randn((BATCH, 4), seed, "y", rank, step, m, device=dev)
            if variant == "unused":
                out = ddp(x, use_b=(step + rank) % 2 == 0)  # rank-dependent unused set
            else:
                out = ddp(x)
            loss = nn.functional.mse_loss(out, y) / accum
            if m < accum - 1:
                with ddp.no_sync():
                    loss.backward()
            else:
                loss.backward()
            step_loss += loss.item()
        if variant == "no_sync":
            large_batch[-1] = {n: (large_batch[-1][n], to_cpu(p.grad))
                               for n, p in ddp.module.named_parameters()}
        losses.append(step_loss)
        grads = to_cpu({n: p.grad for n, p in ddp.module.named_parameters()})
        opt.step()

    out = {
        "init": init,
        "losses": losses,
        "grads": grads,
        "params": to_cpu(dict(ddp.module.named_parameters())),
        "buffers": to_cpu(dict(ddp.module.named_buffers())),
        "large_batch": large_batch,
    }
    if variant == "bn_broadcast":
        # An eval forward with grad enabled broadcasts rank 0's buffers first:
        # every rank must then give the same output for the same input.
        ddp.eval()
        x = randn((BATCH,) + in_shape, seed, "eval", device=dev)
        out["eval_out"] = to_cpu(ddp(x))
        out["eval_buffers"] = to_cpu(dict(ddp.module.named_buffers()))
    # Finish and free the training state here, on the main thread, before the group goes: under
    # torch's Gloo a comm hook's future callback freed on one of Gloo's threads can drop the last
    # reference to the group there, whose destructor then joins that very thread (seen once in
    # CI, the Gloo reference run of hook_powersgd: "Resource deadlock avoided", SIGABRT).
    dist.barrier()
    del ddp, opt
    gc.collect()
    return out


CPU_VARIANTS = [
    "plain", "small_buckets", "no_sync", "unused", "static_graph", "bn_broadcast",
    "hook_allreduce", "hook_fp16", "hook_bf16", "hook_powersgd",
]
# Not here: torch's batched_powerSGD_hook, which fails in torch 2.14 itself on
# every backend (it passes a 2-D matrix to _orthogonalize, which asserts 3-D).
# SyncBatchNorm only runs on accelerators (torch raises "SyncBatchNorm expected
# input tensor to be on GPU" for CPU input).
GPU_ONLY_VARIANTS = ["syncbn"]


def _tolerances(variant, device):
    if variant in ("hook_fp16", "hook_bf16"):
        return 1e-3, 1e-4
    if device == "cuda":
        return 1e-4, 1e-5
    return 1e-5, 1e-6


def _check(variant, device, res, ref):
    rtol, atol = _tolerances(variant, device)
    for r in range(WORLD):
        # DDP broadcast rank 0's initial weights.
        assert_close(res[r]["init"], res[0]["init"], what=f"rank {r} initial params", exact=True)
        assert_close(res[r]["init"], ref[r]["init"], what=f"rank {r} initial params vs ref",
                     exact=True)
        for key in ("losses", "grads", "params", "buffers"):
            assert_close(res[r][key], ref[r][key], rtol, atol, what=f"rank {r} {key} vs ref")
    # Replicas do not drift: bitwise equal parameters and gradients.
    assert_replicas_equal(res, "params")
    assert_replicas_equal(res, "grads", "grads")
    # Each rank trained on its own data.
    assert res[0]["losses"] != res[1]["losses"]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("variant", CPU_VARIANTS)
def test_ddp(variant, device, seed):
    kw = {}
    if variant == "hook_powersgd" and device == "cpu":
        # torch's PowerSGD hook calls torch.cuda.synchronize(bucket's device) whenever CUDA is
        # available, which raises for CPU buckets on a GPU machine, with every backend: the CPU
        # run hides the GPUs (torch 2.11, powerSGD_hook.py, decompress).
        kw["env"] = {"CUDA_VISIBLE_DEVICES": ""}
    res, ref = compare_backends(_ddp_rank, variant, seed, device=device, **kw)
    _check(variant, device, res, ref)

    if variant == "no_sync":
        # The gradient accumulated over no_sync() micro-batches, then synced,
        # equals the gradient of the whole global batch.
        rtol, atol = (1e-4, 1e-5) if device == "cuda" else (1e-5, 1e-6)
        for r in range(WORLD):
            for step, pairs in enumerate(res[r]["large_batch"]):
                for name, (big, acc) in pairs.items():
                    assert_close(acc, big, rtol, atol,
                                 what=f"rank {r} step {step} {name}: accumulated vs large batch")
    if variant == "unused":
        # `never` is unused everywhere: no gradient.  `b` is used on one rank
        # per step: it still gets the averaged gradient on both.
        for r in range(WORLD):
            assert res[r]["grads"]["never.weight"] is None
            assert res[r]["grads"]["b.weight"] is not None
    if variant == "bn_broadcast":
        assert_close(res[1]["eval_out"], res[0]["eval_out"], what="eval output rank 1 vs 0",
                     exact=True)
        assert_close(res[1]["eval_buffers"], res[0]["eval_buffers"],
                     what="buffers after broadcast, rank 1 vs 0", exact=True)
        assert_close(res[0]["eval_out"], ref[0]["eval_out"], 1e-5, 1e-6, what="eval output vs ref")
        # Without the broadcast the ranks' running stats would differ.
        assert not torch.equal(res[0]["buffers"]["bn.running_mean"],
                               res[1]["buffers"]["bn.running_mean"])


@pytest.mark.gpu
@pytest.mark.shares_gpus
@pytest.mark.parametrize("variant", GPU_ONLY_VARIANTS)
def test_ddp_gpu_only(variant, seed):
    res, ref = compare_backends(_ddp_rank, variant, seed, device="cuda")
    _check(variant, "cuda", res, ref)
    # SyncBatchNorm: the running statistics come from the global batch, so
    # they agree across ranks.
    assert_close(res[1]["buffers"], res[0]["buffers"], 1e-5, 1e-6, what="SyncBN buffers rank 1 vs 0")
