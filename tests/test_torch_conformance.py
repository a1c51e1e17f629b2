"""PyTorch's own DistributedTest suite on pycoll, in CI (issue 21): a subset covering every op
(tests/conformance/ci_subset.txt), run through tests/conformance/torch_suite.py on CPU, 2 ranks.
The whole suite (about 18 minutes on 2 cores) is `make conformance`; docs/testing.md has its counts."""
import os
import re
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
SUITE = os.path.join(HERE, "conformance", "torch_suite.py")
SUBSET = os.path.join(HERE, "conformance", "ci_subset.txt")


def _subset():
    with open(SUBSET) as fh:
        return [line.split("#")[0].strip() for line in fh if line.split("#")[0].strip()]


def test_torch_distributed_suite_subset(tmp_path):
    pytest.importorskip("expecttest")
    names = _subset()
    (tmp_path / "barrier").mkdir()
    env = dict(os.environ, BACKEND="pycoll", WORLD_SIZE="2", TEMP_DIR=str(tmp_path),
               PYTHONPATH=os.pathsep.join([os.path.dirname(HERE)] + sys.path))
    env.pop("CI", None)  # with CI set, torch's run_tests writes XML reports through xmlrunner
    proc = subprocess.run([sys.executable, SUITE] + [f"TestDistBackendWithSpawnPYCOLL.{n}" for n in names],
                          env=env, capture_output=True, text=True, timeout=1500)
    out = proc.stdout + proc.stderr
    ran = re.search(r"Ran (\d+) tests?", out)
    assert ran and int(ran.group(1)) == len(names), out[-6000:]
    assert proc.returncode == 0 and re.search(r"^OK\b", out, re.M), out[-6000:]
    skipped = int(m.group(1)) if (m := re.search(r"skipped=(\d+)", out)) else 0
    # Every listed test runs here (none is skipped): the subset is what pycoll passes.
    assert skipped == 0, f"{skipped} of the listed tests were skipped:\n{out[-6000:]}"
    assert len(names) >= 60


def test_shards_sum_the_suites_counts():
    # make conformance SHARDS=N: the shards' unittest summaries, summed, and the expected failure
    # counted as one (not as a failure).
    pytest.importorskip("expecttest")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.dirname(HERE)] + sys.path))
    proc = subprocess.run([sys.executable, os.path.join(HERE, "conformance", "run_shards.py"), "--shards", "2",
                           "--gpu-sets", "0,1;2,3", "-k", "test_all_reduce_sum", "-k", "test_ddp_logging_data_cpu"],
                          env=env, capture_output=True, text=True, timeout=600)
    out = proc.stdout + proc.stderr
    listed = re.search(r"^(\d+) tests in 2 shards", out, re.M)
    ran = re.search(r"^ran: (\d+), .*expected failures: 1, .*passed: (\d+)$", out, re.M)
    assert proc.returncode == 0 and listed and ran, out[-4000:]
    assert int(ran.group(1)) == int(listed.group(1)) >= 3 and int(ran.group(2)) >= 2, out[-4000:]
