"""Sharded training on the backend under test, against Gloo (CPU) or NCCL
(GPU): ZeroRedundancyOptimizer (with and without overlap_with_ddp, and
consolidate_state_dict) and FSDP2 (fully_shard, with and without
reshard_after_forward, with a bf16/fp32 MixedPrecisionPolicy, data from a
DistributedSampler).  Every run also trains an unsharded DDP replica of the
same model on the same data in the same world, so that each test checks both
"sharded == unsharded" and "backend under test == reference backend".

Where ranks share a GPU (PYCOLL_GPU_WORLD on one GPU), NCCL refuses them: the
ZeRO tests then compare with Gloo on the CUDA tensors (DDP and ZeRO use
all_reduce, broadcast and all_gather, which Gloo serves on CUDA); FSDP2 skips
(see test_fsdp2).
"""

import copy

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn

from gpu_collectives_util import skip_if_sharing
from integration_util import (
    DEVICES, TinyGPT, assert_close, assert_replicas_equal, compare_backends, deterministic,
    lm_batch, lm_loss, rank_device, randn, reference, require_device, run_tensors, to_cpu,
)

WORLD = 2
STEPS = 5
BATCH = 8


# --------------------------------------------------------------------------
# ZeroRedundancyOptimizer


class DeepMLP(nn.Module):
    """Enough parameters of uneven sizes for ZeRO to give each rank a share."""

    def __init__(self):
        super().__init__()
        self.layers = nn.Sequential(
            nn.Linear(16, 48), nn.ReLU(), nn.Linear(48, 32), nn.ReLU(), nn.Linear(32, 24),
            nn.ReLU(), nn.Linear(24, 4))

    def forward(self, x):
        return self.layers(x)


def _zero_rank(rank, ws, device, mode, seed):
    """mode: "adam" (ZeRO wrapping Adam, stepped after backward), "overlap"
    (ZeRO wrapping SGD, stepped inside DDP's backward by hook_with_zero_step)
    or "sgd" (ZeRO wrapping SGD, stepped after backward: what "overlap" does,
    for backends torch will not overlap on)."""
    from torch.distributed.algorithms.ddp_comm_hooks.ddp_zero_hook import hook_with_zero_step
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
    from torch.distributed.optim import ZeroRedundancyOptimizer
    from torch.nn.parallel import DistributedDataParallel as DDP

    dev = rank_device(rank, device)
    deterministic(device)
    torch.manual_seed(seed)
    base = DeepMLP().to(dev)
    ids = [dev] if device == "cuda" else None
    # Small buckets: several DDP buckets, so ZeRO's overlap assigns them to
    # different ranks.
    ddp_zero = DDP(copy.deepcopy(base), device_ids=ids, bucket_cap_mb=0.004)
    ddp_local = DDP(copy.deepcopy(base), device_ids=ids, bucket_cap_mb=0.004)
    overlap = mode == "overlap"
    if mode in ("overlap", "sgd"):
        opt_cls, kw = torch.optim.SGD, dict(lr=0.05, momentum=0.9)
        zero = ZeroRedundancyOptimizer(ddp_zero.parameters(), optimizer_class=opt_cls,
                                       overlap_with_ddp=overlap, **kw)
        if overlap:
            ddp_zero.register_comm_hook(None, hook_with_zero_step(allreduce_hook, ddp_zero, zero))
    else:
        opt_cls, kw = torch.optim.Adam, dict(lr=0.01)
        zero = ZeroRedundancyOptimizer(ddp_zero.parameters(), optimizer_class=opt_cls, **kw)
    local = opt_cls(ddp_local.parameters(), **kw)

    def batch(step):
        return (randn((BATCH, 16), seed, rank, step, device=dev),
                randn((BATCH, 4), seed, "y", rank, step, device=dev))

    out = {"zero_losses": [], "local_losses": []}
    if mode in ("overlap", "sgd"):
        # The overlapping hook needs warm-up iterations (DDP rebuilds its
        # buckets after the first one); no parameter is updated in them.
        # ("sgd" does the same backward passes, so that both runs match.)
        for step in range(2):
            x, y = batch(-1 - step)
            nn.functional.mse_loss(ddp_zero(x), y).backward()
            zero.zero_grad()
    for step in range(STEPS):
        x, y = batch(step)
        zero.zero_grad()
        loss = nn.functional.mse_loss(ddp_zero(x), y)
        loss.backward()
        if not overlap:
            zero.step()  # the overlapping hook steps inside backward
        out["zero_losses"].append(loss.item())

        local.zero_grad()
        loss = nn.functional.mse_loss(ddp_local(x), y)
        loss.backward()
        local.step()
        out["local_losses"].append(loss.item())
    if overlap:
        # The last step's parameter update was issued from the hook as
        # broadcasts; make sure they landed.
        dist.barrier()
    out["params"] = to_cpu(dict(ddp_zero.module.named_parameters()))
    out["local_params"] = to_cpu(dict(ddp_local.module.named_parameters()))

    if mode == "adam":
        # Each rank holds a shard of the optimizer state; consolidate on rank 0.
        out["local_shard_params"] = sum(
            len(g["params"]) for g in zero.optim.param_groups)
        zero.consolidate_state_dict(to=0)
        if rank == 0:
            out["zero_state"] = to_cpu(zero.state_dict())
            out["local_state"] = to_cpu(local.state_dict())
        # The consolidated state loads back and training continues the same.
        if rank == 0:
            sd = zero.state_dict()
        else:
            sd = None
        obj = [sd]
        dist.broadcast_object_list(obj, src=0, device=dev if device == "cuda" else None)
        zero.load_state_dict(obj[0])
        x, y = batch(STEPS)
        zero.zero_grad()
        nn.functional.mse_loss(ddp_zero(x), y).backward()
        zero.step()
        local.zero_grad()
        nn.functional.mse_loss(ddp_local(x), y).backward()
        local.step()
        out["params_after_reload"] = to_cpu(dict(ddp_zero.module.named_parameters()))
        out["local_params_after_reload"] = to_cpu(dict(ddp_local.module.named_parameters()))
    return out


def _tol(device):
    return (1e-4, 1e-5) if device == "cuda" else (1e-5, 1e-6)


@pytest.mark.parametrize("device", DEVICES)
def test_zero(device, seed):
    res, ref = compare_backends(_zero_rank, "adam", seed, device=device)
    rtol, atol = _tol(device)
    for r in range(WORLD):
        for key in ("zero_losses", "local_losses", "params", "local_params",
                    "params_after_reload"):
            assert_close(res[r][key], ref[r][key], rtol, atol, what=f"rank {r} {key} vs ref")
        # ZeRO == plain DDP with a full optimizer.
        assert_close(res[r]["zero_losses"], res[r]["local_losses"], rtol, atol,
                     what=f"rank {r} ZeRO losses vs DDP+Adam")
        assert_close(res[r]["params"], res[r]["local_params"], rtol, atol,
                     what=f"rank {r} ZeRO params vs DDP+Adam")
        assert_close(res[r]["params_after_reload"], res[r]["local_params_after_reload"],
                     rtol, atol, what=f"rank {r} params after reloading the consolidated state")
    assert_replicas_equal(res, "params")
    # The optimizer state really was sharded.
    assert all(0 < res[r]["local_shard_params"] < 8 for r in range(WORLD))
    assert sum(res[r]["local_shard_params"] for r in range(WORLD)) == 8
    # consolidate_state_dict(to=0) gives rank 0 the whole optimizer state,
    # equal to the unsharded optimizer's.
    zs, ls = res[0]["zero_state"], res[0]["local_state"]
    assert len(zs["state"]) == len(ls["state"]) == 8
    for i in range(8):
        for k in ("exp_avg", "exp_avg_sq", "step"):
            assert_close(zs["state"][i][k], ls["state"][i][k], rtol, atol,
                         what=f"consolidated state[{i}][{k}]")


@pytest.mark.parametrize("device", DEVICES)
def test_zero_overlap_with_ddp(device, seed):
    # torch refuses to overlap on Gloo ("Gloo backend using Overlapping DDP
    # with ZeRO may meet hangs", pytorch#62300), so where the reference is
    # Gloo (CPU; CUDA with ranks sharing a GPU) it is the same training with
    # ZeRO stepped after backward.
    require_device(device)
    res = run_tensors(WORLD, _zero_rank, device, "overlap", seed, timeout=120)
    ref_backend, ref_device = reference(device, WORLD)
    ref = run_tensors(WORLD, _zero_rank, ref_device, "sgd" if ref_backend == "gloo" else "overlap", seed,
                      timeout=120, backend=ref_backend)
    rtol, atol = _tol(device)
    for r in range(WORLD):
        for key in ("zero_losses", "local_losses", "params", "local_params"):
            assert_close(res[r][key], ref[r][key], rtol, atol, what=f"rank {r} {key} vs ref")
        assert_close(res[r]["zero_losses"], res[r]["local_losses"], rtol, atol,
                     what=f"rank {r} ZeRO-overlap losses vs DDP+SGD")
        assert_close(res[r]["params"], res[r]["local_params"], rtol, atol,
                     what=f"rank {r} ZeRO-overlap params vs DDP+SGD")
    assert_replicas_equal(res, "params")


# --------------------------------------------------------------------------
# FSDP2

GPT = dict(vocab=64, dim=32, heads=2, layers=2, seq=16)
SAMPLES = 48  # data set size: 2 epochs of 3 steps of 2 x 4 sequences
FSDP_BATCH = 4


FSDP_CONFIGS = [(reshard, mixed) for reshard in (True, False) for mixed in (False, True)]


def _fsdp_one(rank, ws, device, dev, mesh, reshard, mixed, seed):
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    from torch.distributed.tensor import DTensor
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

    torch.manual_seed(seed)
    base = TinyGPT(**GPT).to(dev)
    ddp = DDP(copy.deepcopy(base), device_ids=[dev] if device == "cuda" else None)
    model = copy.deepcopy(base)
    kw = dict(mesh=mesh, reshard_after_forward=reshard)
    if mixed:
        kw["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16,
                                               reduce_dtype=torch.float32)
    for block in model.blocks:
        fully_shard(block, **kw)
    fully_shard(model, **kw)
    # Every parameter is a DTensor sharded over the mesh.
    assert all(isinstance(p, DTensor) for p in model.parameters())

    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, foreach=True)
    ddp_opt = torch.optim.AdamW(ddp.parameters(), lr=3e-3, foreach=True)

    x, y = lm_batch(seed, ("data",), SAMPLES, GPT["seq"], GPT["vocab"])
    data = TensorDataset(x, y)
    sampler = DistributedSampler(data, num_replicas=ws, rank=rank, shuffle=True, seed=seed % 1000)
    loader = DataLoader(data, batch_size=FSDP_BATCH, sampler=sampler)
    out = {"losses": [], "ddp_losses": [], "seen": []}
    for epoch in range(2):
        sampler.set_epoch(epoch)
        for xb, yb in loader:
            xb, yb = xb.to(dev), yb.to(dev)
            out["seen"].append(xb[:, 0].tolist())
            opt.zero_grad()
            loss = lm_loss(model(xb), yb)
            loss.backward()
            opt.step()
            out["losses"].append(loss.item())

            ddp_opt.zero_grad()
            if mixed:
                with torch.autocast(device_type=device, dtype=torch.bfloat16):
                    dloss = lm_loss(ddp(xb), yb)
            else:
                dloss = lm_loss(ddp(xb), yb)
            dloss.backward()
            ddp_opt.step()
            out["ddp_losses"].append(dloss.item())
    # The loss the whole world saw, averaged over ranks.
    t = torch.tensor(out["losses"], device=dev)
    dist.all_reduce(t, op=dist.ReduceOp.AVG)
    out["mean_losses"] = t.tolist()
    out["params"] = {n: p.full_tensor().detach().cpu() for n, p in model.named_parameters()}
    out["ddp_params"] = to_cpu(dict(ddp.module.named_parameters()))
    return out


def _fsdp_rank(rank, ws, device, seed):
    """All FSDP configurations in one world: DTensor's sharding propagation
    (several seconds of CPU per process the first time an op meets a shape)
    is cached per process, so the later configurations cost far less."""
    import traceback

    from torch.distributed.device_mesh import init_device_mesh

    dev = rank_device(rank, device)
    deterministic(device)
    mesh = init_device_mesh(device, (ws,))
    results = {}
    for cfg in FSDP_CONFIGS:
        try:
            results[cfg] = _fsdp_one(rank, ws, device, dev, mesh, *cfg, seed)
        except Exception:  # noqa: BLE001 -- reported by the test of this configuration
            results[cfg] = traceback.format_exc()
            dist.barrier()  # best effort: keep the ranks together for the next one
    return results


_fsdp_cache = {}


def _fsdp_results(device, seed):
    if device not in _fsdp_cache:
        _fsdp_cache[device] = compare_backends(_fsdp_rank, seed, device=device, timeout=240)
    return _fsdp_cache[device]


# Where ranks share a GPU there is no reference to compare with: NCCL refuses the ranks, Gloo has no
# reduce_scatter of CUDA tensors, and Gloo on CPU copies is no reference for AdamW on a transformer
# (its attention key bias gets gradients that are rounding noise, different on CPU and GPU, which
# AdamW's normalised step turns into parameter differences far above the tolerance).
FSDP_DEVICES = [DEVICES[0], pytest.param("cuda", id="cuda", marks=[pytest.mark.gpu, skip_if_sharing(
    WORLD, "no reference for FSDP2: NCCL refuses ranks on one GPU and Gloo has no reduce_scatter of CUDA "
           "tensors (test_fsdp2[cpu-*] checks FSDP2 against Gloo)")])]


@pytest.mark.parametrize("device", FSDP_DEVICES)
@pytest.mark.parametrize("mixed", [False, True], ids=["fp32", "bf16"])
@pytest.mark.parametrize("reshard", [True, False], ids=["reshard", "keep"])
def test_fsdp2(reshard, mixed, device, seed):
    res_all, ref_all = _fsdp_results(device, seed)
    for backend, out in (("tested", res_all), ("reference", ref_all)):
        for r in range(WORLD):
            if isinstance(out[r][(reshard, mixed)], str):
                pytest.fail(f"rank {r} on the {backend} backend raised:\n{out[r][(reshard, mixed)]}")
    res = [out[(reshard, mixed)] for out in res_all]
    ref = [out[(reshard, mixed)] for out in ref_all]
    # The sampler gave each rank its own half of the data, in a new order each epoch.
    seen0 = [s for b in res[0]["seen"] for s in b]
    seen1 = [s for b in res[1]["seen"] for s in b]
    half = len(seen0) // 2
    assert sorted(seen0[:half] + seen1[:half]) == sorted(seen0[half:] + seen1[half:])
    assert res[0]["seen"] == ref[0]["seen"] and res[1]["seen"] == ref[1]["seen"]

    if mixed:
        rtol, atol = 2e-2, 2e-3  # bf16 parameters in the forward/backward
    else:
        rtol, atol = _tol(device)
    for r in range(WORLD):
        # Same run on the reference backend.
        assert_close(res[r]["losses"], ref[r]["losses"], rtol, atol, what=f"rank {r} losses vs ref")
        assert_close(res[r]["params"], ref[r]["params"], rtol, atol, what=f"rank {r} params vs ref")
    assert_replicas_equal(res, "params")
    assert_replicas_equal(res, "mean_losses", "mean losses")
    # FSDP2's loss curve equals DDP's.
    curve_rtol, curve_atol = (3e-2, 3e-2) if mixed else (1e-4, 1e-5)
    for r in range(WORLD):
        assert_close(res[r]["losses"], res[r]["ddp_losses"], curve_rtol, curve_atol,
                     what=f"rank {r} FSDP2 vs DDP loss curve")
    if not mixed:
        assert_close(res[0]["params"], res[0]["ddp_params"], 1e-4, 1e-5,
                     what="FSDP2 vs DDP params")
    # And it learned something.
    assert res[0]["mean_losses"][-1] < res[0]["mean_losses"][0]
