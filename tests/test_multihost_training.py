"""Training across simulated hosts on CPU tensors (issue 22): DDP on 2 hosts x 2 ranks, FSDP2 and
a 1F1B pipeline on 2 hosts of one rank, and HSDP on a 2-D DeviceMesh (shard inside a host,
replicate across), each against the same run on Gloo. Hosts are simulated with PYCOLL_HOSTID,
so every byte between them goes through the inter-host engine."""
import os

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn

from integration_util import assert_close, assert_replicas_equal, compare_backends, deterministic, randn, to_cpu
from test_integration_ddp import _ddp_rank
from test_integration_pipeline import SCHEDULES, _pipeline_rank
from test_integration_sharded import _fsdp_rank

HOSTS_2x2 = [{"PYCOLL_HOSTID": h} for h in ("hostA", "hostA", "hostB", "hostB")]
HOSTS_2x1 = [{"PYCOLL_HOSTID": h} for h in ("hostA", "hostB")]


@pytest.mark.parametrize("variant", ["plain", "small_buckets", "hook_powersgd"])
def test_ddp_on_two_hosts_of_two(variant, seed):
    res, ref = compare_backends(_ddp_rank, variant, seed, device="cpu", world_size=4, rank_env=HOSTS_2x2)
    for r in range(4):
        for key in ("losses", "grads", "params", "buffers"):
            assert_close(res[r][key], ref[r][key], 1e-5, 1e-6, what=f"rank {r} {key} vs Gloo")
    assert_replicas_equal(res, "params")
    assert_replicas_equal(res, "grads", "grads")


def test_fsdp2_on_two_hosts(seed):
    res, ref = compare_backends(_fsdp_rank, seed, device="cpu", timeout=300, rank_env=HOSTS_2x1)
    for r in range(2):
        for cfg, out in res[r].items():
            assert not isinstance(out, str), f"rank {r} {cfg} raised:\n{out}"
            rtol, atol = (2e-2, 2e-3) if cfg[1] else (1e-5, 1e-6)
            assert_close(out["losses"], ref[r][cfg]["losses"], rtol, atol, what=f"rank {r} {cfg} losses vs Gloo")
            assert_close(out["params"], ref[r][cfg]["params"], rtol, atol, what=f"rank {r} {cfg} params vs Gloo")


def test_1f1b_pipeline_on_two_hosts(seed):
    import torch.distributed.pipelining as pp

    if not hasattr(pp, SCHEDULES["1F1B"][0]):
        pytest.skip("this torch has no Schedule1F1B")
    res, ref = compare_backends(_pipeline_rank, "1F1B", seed, device="cpu", timeout=120, rank_env=HOSTS_2x1)
    for r in range(2):
        for key in ("losses", "grads", "params"):
            assert_close(res[r][key], ref[r][key], 1e-5, 1e-6, what=f"rank {r} {key} vs Gloo")


def _hsdp_rank(rank, ws, device, seed):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    deterministic(device)
    # Rows replicate across hosts, columns shard inside a host (ranks 0,1 on host A; 2,3 on B).
    mesh = init_device_mesh(device, (2, 2), mesh_dim_names=("replicate", "shard"))
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 4))
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    losses = []
    for step in range(4):
        x = randn((8, 16), seed, "x", rank, step)
        y = randn((8, 4), seed, "y", rank, step)
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        losses.append(to_cpu(loss.detach()))
    full = {n: to_cpu(p.full_tensor()) for n, p in model.named_parameters()}
    groups = {"shard": dist.get_process_group_ranks(mesh.get_group("shard")),
              "replicate": dist.get_process_group_ranks(mesh.get_group("replicate"))}
    with open(os.environ["PYCOLL_TEST_LOG"], errors="replace") as fh:
        across_hosts = "2 hosts (uniform)" in fh.read()
    return {"losses": losses, "params": full, "groups": groups, "across_hosts": across_hosts}


def test_hsdp_shard_inside_host_replicate_across(seed):
    res, ref = compare_backends(_hsdp_rank, seed, device="cpu", world_size=4, timeout=240, rank_env=HOSTS_2x2,
                                env={"PYCOLL_DEBUG": "INFO"})
    assert all(res[r]["across_hosts"] for r in range(4)), "the pycoll group was not laid out across 2 hosts"
    for r in range(4):
        # The mesh's shard groups are one host's ranks; its replicate groups span the hosts.
        assert res[r]["groups"]["shard"] == [2 * (r // 2), 2 * (r // 2) + 1], res[r]["groups"]
        assert res[r]["groups"]["replicate"] == [r % 2, r % 2 + 2], res[r]["groups"]
        assert_close(res[r]["losses"], ref[r]["losses"], 1e-5, 1e-6, what=f"rank {r} losses vs Gloo")
        assert_close(res[r]["params"], ref[r]["params"], 1e-5, 1e-6, what=f"rank {r} params vs Gloo")
    assert_replicas_equal(res, "params")
