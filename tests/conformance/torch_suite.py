"""PyTorch's own DistributedTest suite, pointed at pycoll (issue 21 item 3).

    make conformance                       # the whole suite on CPU, 2 ranks (about 18 min on 2 cores)
    make conformance ARGS="-k all_reduce"  # a subset (unittest -k patterns)

The suite reads BACKEND, WORLD_SIZE and TEMP_DIR (the Makefile target sets them) and decides which
of its tests apply from DistTestCases.backend_feature: "pycoll" is added to the features it has
(ddp, subgroup, plugin; gpu and cuda when PYCOLL_CONFORMANCE_GPU=1) before the suite is imported.
"""
import os
import sys

import pycollectives  # noqa: F401  (registers "pycoll")
from torch.testing._internal.common_distributed import DistTestCases

FEATURES = ["ddp", "subgroup", "plugin"] + (["gpu", "cuda"] if os.environ.get("PYCOLL_CONFORMANCE_GPU") == "1" else [])
for feature in FEATURES:
    DistTestCases.backend_feature[feature].add("pycoll")

from torch.testing._internal.common_utils import run_tests  # noqa: E402
from torch.testing._internal.distributed.distributed_test import (  # noqa: E402
    DistributedTest,
    TestDistBackend,
)


class TestDistBackendWithSpawnPYCOLL(TestDistBackend, DistributedTest._DistTestBase):
    def setUp(self):
        super().setUp()
        self._spawn_processes()


if __name__ == "__main__":
    if os.environ.get("BACKEND") != "pycoll":
        sys.exit("set BACKEND=pycoll WORLD_SIZE=2 TEMP_DIR=<dir> (make conformance does)")
    run_tests()
