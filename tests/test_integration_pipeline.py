"""torch.distributed.pipelining on the backend under test: a model split into
stages trained with each schedule must give the losses and gradients of the
unsplit model (computed in every rank) and the same numbers as on Gloo (CPU)
or NCCL (GPU).  Pipelining moves activations and gradients between ranks
with send/recv (batch_isend_irecv) and its shape inference uses object
send/recv, so this exercises point-to-point traffic under a real schedule.
Where ranks share a GPU (PYCOLL_GPU_WORLD on one GPU), NCCL refuses them and
Gloo has no send/recv of CUDA tensors: the reference is then the same
pipeline on Gloo with CPU tensors.
"""

import pytest
import torch
import torch.nn as nn

from integration_util import (
    DEVICES, assert_close, compare_backends, deterministic, rank_device, randn, to_cpu,
)

WORLD = 2
DIM = 16
BLOCKS = 4  # split into 2 stages (one per rank) or 4 (two per rank)
BATCH = 16
MICROBATCHES = 4
ITERS = 2


def _full_model(seed):
    torch.manual_seed(seed)
    layers = []
    for _ in range(BLOCKS):
        layers += [nn.Linear(DIM, DIM), nn.Tanh()]
    return nn.Sequential(*layers)


def _blocks(model, first, count):
    """Blocks [first, first + count) of the full model as one stage module."""
    return nn.Sequential(*list(model.children())[2 * first: 2 * (first + count)])


# schedule name -> (class name, stage layout)
#   "single": one stage per rank (stage = rank)
#   "loop":   two stages per rank (rank, rank + world)
#   "v":      two stages per rank (rank, 2 * world - 1 - rank)
SCHEDULES = {
    "GPipe": ("ScheduleGPipe", "single"),
    "1F1B": ("Schedule1F1B", "single"),
    "Interleaved1F1B": ("ScheduleInterleaved1F1B", "loop"),
    "LoopedBFS": ("ScheduleLoopedBFS", "loop"),
    "InterleavedZeroBubble": ("ScheduleInterleavedZeroBubble", "loop"),
    "ZBVZeroBubble": ("ScheduleZBVZeroBubble", "v"),
}


def _stage_ids(layout, rank, ws):
    if layout == "single":
        return [rank], ws
    if layout == "loop":
        return [rank, rank + ws], 2 * ws
    return [rank, 2 * ws - 1 - rank], 2 * ws


def _pipeline_rank(rank, ws, device, schedule_name, seed):
    import torch.distributed.pipelining as pp

    dev = rank_device(rank, device)
    deterministic(device)
    cls_name, layout = SCHEDULES[schedule_name]
    ids, num_stages = _stage_ids(layout, rank, ws)
    per_stage = BLOCKS // num_stages

    full = _full_model(seed).to(dev)
    ref_model = _full_model(seed).to(dev)  # the unsplit model, trained alongside
    stage_mods = {i: _blocks(full, i * per_stage, per_stage) for i in ids}
    stages = [pp.PipelineStage(stage_mods[i], i, num_stages, dev) for i in ids]

    loss_fn = nn.MSELoss()
    cls = getattr(pp, cls_name)
    if layout == "single":
        schedule = cls(stages[0], n_microbatches=MICROBATCHES, loss_fn=loss_fn)
    else:
        schedule = cls(stages, n_microbatches=MICROBATCHES, loss_fn=loss_fn)
    params = [p for m in stage_mods.values() for p in m.parameters()]
    opt = torch.optim.SGD(params, lr=0.1)
    ref_opt = torch.optim.SGD(ref_model.parameters(), lr=0.1)

    first_here = 0 in ids
    last_here = num_stages - 1 in ids
    out = {"losses": [], "ref_losses": [], "grads": [], "ref_grads": []}
    for it in range(ITERS):
        x = randn((BATCH, DIM), seed, "x", it, device=dev)
        y = randn((BATCH, DIM), seed, "y", it, device=dev)
        opt.zero_grad()
        losses = []
        args = (x,) if first_here else ()
        kwargs = {}
        if last_here:
            kwargs = dict(target=y, losses=losses)
        schedule.step(*args, **kwargs)
        out["losses"].append(to_cpu(torch.stack(losses)) if last_here else None)
        # Gradients of this rank's stages, keyed by the full model's names.
        grads = {}
        for i in ids:
            for n, p in stage_mods[i].named_parameters():
                grads[f"{2 * i * per_stage + int(n.split('.')[0])}.{n.split('.')[1]}"] = to_cpu(p.grad)
        out["grads"].append(grads)
        opt.step()

        # The unsplit model: per-microbatch losses, gradient of their mean
        # (the schedule scales the summed gradients by 1 / n_microbatches).
        ref_opt.zero_grad()
        mb_losses = [loss_fn(ref_model(xm), ym)
                     for xm, ym in zip(x.chunk(MICROBATCHES), y.chunk(MICROBATCHES))]
        torch.stack(mb_losses).mean().backward()
        out["ref_losses"].append(to_cpu(torch.stack(mb_losses)))
        out["ref_grads"].append({n: to_cpu(p.grad) for n, p in ref_model.named_parameters()
                                 if n in grads})
        ref_opt.step()
    out["params"] = {n: to_cpu(p) for n, p in full.named_parameters()
                     if any(n.startswith(f"{2 * i * per_stage + k}.")
                            for i in ids for k in range(2 * per_stage))}
    return out


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("schedule", list(SCHEDULES))
def test_pipeline(schedule, device, seed):
    import torch.distributed.pipelining as pp

    if not hasattr(pp, SCHEDULES[schedule][0]):
        pytest.skip(f"this torch has no {SCHEDULES[schedule][0]}")
    res, ref = compare_backends(_pipeline_rank, schedule, seed, device=device, timeout=120, gloo_on_cuda=False)
    rtol, atol = (1e-4, 1e-5) if device == "cuda" else (1e-5, 1e-6)
    for r in range(WORLD):
        # Same as the reference backend.
        assert_close(res[r]["losses"], ref[r]["losses"], rtol, atol, what=f"rank {r} losses vs ref")
        assert_close(res[r]["grads"], ref[r]["grads"], rtol, atol, what=f"rank {r} grads vs ref")
        assert_close(res[r]["params"], ref[r]["params"], rtol, atol, what=f"rank {r} params vs ref")
        # Same as the unsplit model.
        assert_close(res[r]["grads"], res[r]["ref_grads"], 1e-4, 1e-6,
                     what=f"rank {r} stage grads vs unsplit model")
    last = [r for r in range(WORLD) if res[r]["losses"][0] is not None]
    assert len(last) == 1, "exactly one rank holds the last stage"
    r = last[0]
    assert_close(res[r]["losses"], res[r]["ref_losses"], 1e-5, 1e-6,
                 what="microbatch losses vs unsplit model")
    # Every parameter of the model lives on exactly one rank.
    names = [n for r in range(WORLD) for n in res[r]["params"]]
    assert len(names) == len(set(names)) == 2 * BLOCKS
