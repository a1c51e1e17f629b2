import importlib.util
import os
import random
import sys

import pytest

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Use the source tree (in-place build) when pycollectives is not installed.
# Set before any rank starts: the ranks inherit this sys.path.
if importlib.util.find_spec("pycollectives") is None and _REPO not in sys.path:
    sys.path.insert(0, _REPO)

# The tests pin the built-in `auto` choices: a calibration in this user's cache
# (~/.cache/pycollectives/cost_model.json, pycoll-bench --calibrate's default output) or named by
# the environment must not change them. Set before pycollectives is imported here or in any rank.
os.environ["PYCOLL_COST_MODEL"] = os.path.join(_REPO, "tests", "no-such-cost-model.json")

from ranks import BACKEND, IS_GLOO  # noqa: E402

SEED = int(os.environ.get("PYCOLL_TEST_SEED", random.randrange(2**31)))


def pytest_report_header(config):
    return [
        f"pycollectives tests: backend={BACKEND} (PYCOLL_TEST_BACKEND), "
        f"seed={SEED} (PYCOLL_TEST_SEED to reproduce)"
    ]


def _cuda_devices():
    try:
        import torch

        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception:
        return 0


def pytest_collection_modifyitems(config, items):
    need_gpu = [it for it in items if it.get_closest_marker("gpu")]
    if need_gpu:
        n = _cuda_devices()
        # On one GPU, a set PYCOLL_GPU_WORLD runs the tests whose ranks may share a GPU (shares_gpus).
        shared = n == 1 and "PYCOLL_GPU_WORLD" in os.environ
        if n < 2:
            why = f"needs 2 CUDA GPUs, {n} visible"
            if n == 1:
                why += " (PYCOLL_GPU_WORLD=N runs the shares_gpus tests with N ranks on it)"
            skip = pytest.mark.skip(reason=why)
            for it in need_gpu:
                if not (shared and it.get_closest_marker("shares_gpus")):
                    it.add_marker(skip)
    if IS_GLOO:
        skip = pytest.mark.skip(reason="pycoll-specific (PYCOLL_TEST_BACKEND=gloo)")
        for it in items:
            if it.get_closest_marker("pycoll_only"):
                it.add_marker(skip)


@pytest.fixture(scope="session")
def seed():
    """Base seed of this session's random inputs (printed in the header)."""
    return SEED


@pytest.fixture
def needs_cross_memory_attach():
    """Skips a test that expects ranks to read each other in place where this host forbids it
    (tests/cross_memory_attach.py), naming the engine's reason."""
    from cross_memory_attach import why_not

    reason = why_not()
    if reason is not None:
        pytest.skip(f"cross-memory attach between ranks is not allowed here: {reason}")
