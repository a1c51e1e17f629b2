"""pytest options and the session's rank pools for the regression benchmarks.

    pytest benchmarks/regression                         # CPU, or 2 GPUs when two are visible
    pytest benchmarks/regression --regression-world 2,4  # also 4 ranks
    pytest benchmarks/regression --benchmark-autosave    # then --benchmark-compare later
"""
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from harness import REPO_ROOT  # noqa: E402
from rank_pool import RankPool  # noqa: E402


def _gpus():
    try:
        import torch
        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception:
        return 0


def pytest_addoption(parser):
    g = parser.getgroup("regression", "pycollectives regression benchmarks")
    g.addoption("--regression-device", default="auto", choices=("auto", "cpu", "cuda"),
                help="cuda when 2 GPUs are visible and the build has CUDA (auto), else cpu")
    g.addoption("--regression-world", default=None,
                help="comma-separated world sizes (default: 2, and 4 where 4 GPUs are visible)")
    g.addoption("--regression-rounds", type=int, default=5, help="timed rounds per case")
    g.addoption("--regression-round-ms", type=float, default=None,
                help="target length of one round (default 40 on CPU, 20 on GPU); each round is at least "
                     "50x the request's own cost")
    g.addoption("--regression-cases", default=None, help="comma-separated fnmatch patterns of case names")


def regression_device(config):
    dev = config.getoption("--regression-device")
    if dev != "auto":
        return dev
    return "cuda" if _gpus() >= 2 else "cpu"


def regression_worlds(config):
    opt = config.getoption("--regression-world")
    if opt:
        return [int(w) for w in opt.split(",")]
    return [2, 4] if regression_device(config) == "cuda" and _gpus() >= 4 else [2]


@pytest.fixture(scope="session")
def rank_pools(request):
    pools = {}
    device = regression_device(request.config)
    yield lambda world: pools.get(world) or pools.setdefault(
        world, RankPool(world, device, REPO_ROOT, label=f"working tree, {world} ranks"))
    for pool in pools.values():
        pool.close()
