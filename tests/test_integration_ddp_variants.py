"""DDP's variants from torch's own test_DistributedDataParallel, against one process training on
the whole batch: static graph (at construction, or set after it), a module saved and loaded with
torch.save, gradients as bucket views. Every rank must end each step with the reference's
parameters: DDP averages the ranks' gradients, and each rank's slice is half of the batch.

torch's own test_DistributedDataParallel cannot serve: its static-graph constructions diverge with
NCCL too (pytorch/pytorch#112277; docs/testing.md). Each variant runs on its own, on CPU and on
2 GPUs (-m gpu), or 2 ranks sharing one GPU where PYCOLL_GPU_WORLD is set.
"""
import copy
import itertools
import tempfile

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from integration_util import DEVICES, rank_device
from ranks import run_ranks

WORLD = 2
STEPS = 5


class _FC2(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(10, 50, bias=True)
        self.fc.bias.requires_grad = False

    def forward(self, x):
        return self.fc(x)


class Net(nn.Module):
    """torch's distributed_test.Net: a frozen bias and an integer parameter DDP must skip."""

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(2, 10, bias=False)
        self.fc2 = _FC2()
        self.fc3 = nn.Linear(50, 4, bias=False)
        self.no_grad_param = nn.Parameter(torch.tensor([2, 2]).long(), requires_grad=False)

    def forward(self, x):
        return F.softmax(self.fc3(F.relu(self.fc2(F.relu(self.fc1(x))))), dim=1)


def _step(model):
    for p in model.parameters():
        if p.grad is not None:
            with torch.no_grad():
                p += p.grad
            p.grad = None


def _ddp_variant(rank, ws, device, static_at_init, static_after, save_load, bucket_view):
    dev = rank_device(rank, device)
    torch.manual_seed(0)  # every rank builds the same model and batch, as torch's test does
    model = Net()
    base = copy.deepcopy(model).to(dev)
    kwargs = {"device_ids": [dev]} if device == "cuda" else {}
    ddp = nn.parallel.DistributedDataParallel(copy.deepcopy(model).to(dev), static_graph=static_at_init,
                                              gradient_as_bucket_view=bucket_view, **kwargs)
    if static_after:
        ddp._set_static_graph()
    if save_load:
        with tempfile.NamedTemporaryFile() as tmp:
            torch.save(ddp, tmp.name)
            ddp = torch.load(tmp.name, weights_only=False)
    x = torch.randn(ws * 2, 2, device=dev)
    y = torch.randn(ws * 2, 4, device=dev)
    for step in range(STEPS):
        nn.MSELoss()(base(x), y).backward()
        nn.MSELoss()(ddp(x[2 * rank:2 * rank + 2]), y[2 * rank:2 * rank + 2]).backward()
        _step(base)
        _step(ddp)
        for (name, want), got in zip(base.named_parameters(), ddp.module.parameters()):
            torch.testing.assert_close(got, want, rtol=1.3e-6, atol=1e-5,
                                       msg=lambda m, n=name, s=step: f"step {s}, {n}: {m}")
    return True


VARIANTS = [v for v in itertools.product([False, True], repeat=4) if not (v[0] and v[1])]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("static_at_init,static_after,save_load,bucket_view", VARIANTS,
                         ids=lambda v: str(int(v)))
def test_ddp_variant_matches_one_process(device, static_at_init, static_after, save_load, bucket_view):
    out = run_ranks(WORLD, _ddp_variant, device, static_at_init, static_after, save_load, bucket_view, timeout=120)
    assert out == [True] * WORLD
