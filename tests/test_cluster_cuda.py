"""CUDA ranks on pycoll-cluster's simulated hosts: 2 hosts x 2 ranks over a shaped 1 Gbit/s link,
every rank on GPU LOCAL_RANK % count (on one GPU all four share it, each host's two running the
CUDA engine's kernels there). Every collective against a reference (tests/cluster_worker.py, mode
cuda), the hierarchical and the flat all_reduce, and nothing of the cluster left afterwards.
Needs a GPU and the rights pycoll-cluster needs (root or unprivileged user namespaces)."""

import json

import pytest
import torch

from test_cluster import _leftovers, _run, needs_cluster

GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0


@pytest.mark.gpu
@pytest.mark.shares_gpus
@pytest.mark.skipif(GPUS < 1, reason="needs a CUDA GPU")
@needs_cluster
def test_2x2_cuda_ranks_over_1gbit_collectives_forms_and_cleanup(tmp_path):
    before = _leftovers()
    out = tmp_path / "r.json"
    p = _run(2, 2, "1gbit", "cuda", out, timeout=420, extra=("--measure", "1"))
    assert p.returncode == 0, p.stderr[-4000:]
    r = json.loads(out.read_text())
    assert r["hostnames"] == ["pcl-host0", "pcl-host0", "pcl-host1", "pcl-host1"]
    c = r["cuda"]
    assert c["device"] == "cuda:0"
    assert c["sizes"] == [1, 1031, 65536]
    assert c["forms"] == {"hierarchical": "ok", "flat": "ok"}
    # Ranks of one host that share a GPU are NCCL hosts of their own (NCCL refuses them otherwise).
    assert r["nccl_hostid"].endswith("-rank0") == (GPUS < 2), r["nccl_hostid"]
    assert _leftovers() == before
