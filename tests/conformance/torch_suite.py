"""PyTorch's own DistributedTest suite, pointed at pycoll (issue 21 item 3).

    make conformance                       # the whole suite on CPU, 2 ranks (about 18 min on 2 cores)
    make conformance ARGS="-k all_reduce"  # a subset (unittest -k patterns)

The suite reads BACKEND, WORLD_SIZE and TEMP_DIR (the Makefile target sets them) and decides which
of its tests apply from DistTestCases.backend_feature: "pycoll" is added to the features it has
(ddp, subgroup, plugin, gpu; cuda when PYCOLL_CONFORMANCE_GPU=1) before the suite is imported.
"""
import os
import sys
import unittest

import pycollectives  # noqa: F401  (registers "pycoll")
from torch.testing._internal.common_distributed import DistTestCases

# The suite gates its object-collective and many DDP tests on the "gpu" feature, as a stand-in for
# "a full backend" (they run on CPU tensors too, and Gloo is in that set): pycoll claims it; the
# tests that really need GPUs still skip by their own device-count checks. "cuda" makes the suite
# put tensors on GPUs: only with PYCOLL_CONFORMANCE_GPU=1.
FEATURES = ["ddp", "subgroup", "plugin", "gpu"] + (["cuda"] if os.environ.get("PYCOLL_CONFORMANCE_GPU") == "1" else [])
for feature in FEATURES:
    DistTestCases.backend_feature[feature].add("pycoll")

# PYCOLL_CONFORMANCE_AS=gloo (or nccl) runs the suite as if pycoll were named that: the suite's
# name checks (decorators such as "Only Nccl supports CUDA gather", read at import) see that name,
# and every group the suite asks of that backend is a pycoll group. This answers which of the tests
# the suite skips for pycoll's name would pass; it is a measurement, not how the suite is counted.
AS = os.environ.get("PYCOLL_CONFORMANCE_AS")
if AS:
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    os.environ["BACKEND"] = AS

    def _as_pycoll(fn):
        def wrapper(*args, **kwargs):
            if kwargs.get("backend") == AS:
                kwargs["backend"] = "pycoll"
            return fn(*args, **kwargs)
        return wrapper

    dist.init_process_group = c10d.init_process_group = _as_pycoll(c10d.init_process_group)
    dist.new_group = c10d.new_group = _as_pycoll(c10d.new_group)

from torch.testing._internal.common_utils import run_tests  # noqa: E402
from torch.testing._internal.distributed.distributed_test import (  # noqa: E402
    DistributedTest,
    TestDistBackend,
)


class TestDistBackendWithSpawnPYCOLL(TestDistBackend, DistributedTest._DistTestBase):
    def setUp(self):
        super().setUp()
        self._spawn_processes()


# Known failures, each with its reason; an unexpected success fails the run, so none outlives its fix.
EXPECTED_FAILURES = {
    # DDP's logger records ProcessGroup::getBackendName(), which is backendTypeToString(CUSTOM) =
    # "custom" for every third-party backend (torch/csrc/distributed/c10d/ProcessGroup.hpp,
    # ProcessGroup::backendTypeToString), while the test expects dist.get_backend() = "pycoll".
    "test_ddp_logging_data_cpu": "torch names every third-party backend 'custom' in DDP's logging data",
}
if "cuda" in FEATURES:
    # Its static-graph constructions (static_graph=True, or _set_static_graph() after construction)
    # leave the single-GPU reference from the 4th iteration with NCCL too: pytorch/pytorch#112277.
    # On 2 H200 (torch 2.11) NCCL and pycoll gave the same differences to 3 digits (0.0707 at
    # iteration 4 of the 2nd construction); tests/test_integration_ddp_variants.py checks those
    # DDP variants against a reference that is right.
    EXPECTED_FAILURES["test_DistributedDataParallel"] = "fails with NCCL as well (pytorch/pytorch#112277)"
for _name in EXPECTED_FAILURES:
    setattr(TestDistBackendWithSpawnPYCOLL, _name,
            unittest.expectedFailure(getattr(DistributedTest._DistTestBase, _name)))


if __name__ == "__main__":
    if os.environ.get("BACKEND") != (AS or "pycoll"):
        sys.exit("set BACKEND=pycoll WORLD_SIZE=2 TEMP_DIR=<dir> (make conformance does)")
    run_tests()
