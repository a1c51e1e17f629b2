"""The README's two-node torchrun command, run for real on one machine (issue 22): two torchrun
agents joined with --rdzv-backend c10d on 127.0.0.1, each with its own PYCOLL_HOSTID and, where
this process may (root), its own mount namespace with a private /dev/shm, so that the two
simulated hosts really cannot share memory: every byte between them goes through the inter-host
engine."""
import os
import shutil
import socket
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
JOB = os.path.join(HERE, "jobs", "multihost_job.py")


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _private_shm_allowed():
    if shutil.which("unshare") is None:
        return False
    probe = subprocess.run(["unshare", "-m", "sh", "-c", "mount -t tmpfs tmpfs /dev/shm"], capture_output=True)
    return probe.returncode == 0


def _agent(node_rank, port, private_shm, nproc=2, env_extra=None, job_args=()):
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", str(nproc),
                "--node-rank", str(node_rank), "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}",
                "--rdzv-id", f"pycoll-test-{port}", "--max-restarts", "0", JOB, *job_args]
    cmd = torchrun
    if private_shm:
        # A mount namespace of its own: this agent's ranks see a /dev/shm the other's cannot.
        cmd = ["unshare", "-m", "sh", "-c", 'mount -t tmpfs tmpfs /dev/shm && exec "$@"', "sh"] + torchrun
    env = dict(os.environ, PYCOLL_HOSTID=f"node{node_rank}", PYCOLL_DEBUG="INFO", OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join([os.path.dirname(HERE)] + sys.path))
    env.update(env_extra or {})
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _run_agents(agents):
    outs = []
    for a in agents:
        try:
            outs.append(a.communicate(timeout=240)[0])
        except subprocess.TimeoutExpired:
            for b in agents:
                b.kill()
            pytest.fail("the torchrun agents did not finish within 240 s")
    log = "\n".join(outs)
    assert all(a.returncode == 0 for a in agents), log[-4000:]
    return log


@pytest.mark.parametrize("private_shm", [True, False], ids=["private-dev-shm", "shared-dev-shm"])
def test_two_torchrun_agents_as_two_hosts(private_shm):
    if private_shm and not _private_shm_allowed():
        pytest.skip("unshare -m with a tmpfs /dev/shm is not permitted here (needs root)")
    port = _free_port()
    log = _run_agents([_agent(i, port, private_shm) for i in (0, 1)])
    for rank in range(4):
        assert f"multihost-job rank {rank}/4 host node{rank // 2} local {rank % 2}: ok" in log, log[-4000:]
    # The hierarchical path ran: 2 hosts of 2 ranks, all_reduce through the rails.
    assert "2 hosts (uniform)" in log and "allreduce algo=hierarchical" in log, log[-4000:]


@pytest.mark.gpu
@pytest.mark.shares_gpus
@pytest.mark.pycoll_only
def test_two_torchrun_agents_as_two_hosts_on_gpus():
    """The same command with CUDA tensors: each agent gets half of the GPUs (its own
    CUDA_VISIBLE_DEVICES), its own PYCOLL_HOSTID and NCCL_HOSTID, and a private /dev/shm where
    allowed, so NCCL too talks between the agents through its network transport. 2 GPUs: 2 hosts
    of 1 rank (every op on NCCL); 4: 2 hosts of 2 (hierarchical). One GPU with PYCOLL_GPU_WORLD
    set: 2 hosts of 1 rank, both on that GPU (NCCL takes them, as their NCCL_HOSTIDs differ)."""
    from gpu_collectives_util import GPUS, gpus_missing

    why = gpus_missing(2)
    if why:
        pytest.skip(why)
    per = max(1, min(GPUS // 2, 4))
    port = _free_port()
    private = _private_shm_allowed()
    # Each agent its half of the GPUs; on one GPU, both agents that GPU (the environment's).
    visible = [{} if GPUS < 2 else {"CUDA_VISIBLE_DEVICES": ",".join(str(i * per + g) for g in range(per))}
               for i in (0, 1)]
    agents = [_agent(i, port, private, nproc=per, job_args=["--cuda"],
                     env_extra={**visible[i], "NCCL_HOSTID": f"node{i}", "NCCL_DEBUG": "INFO",
                                "NCCL_DEBUG_SUBSYS": "INIT", "NCCL_NVLS_ENABLE": "0"})
              for i in (0, 1)]
    log = _run_agents(agents)
    ws = 2 * per
    for rank in range(ws):
        assert f"multihost-job rank {rank}/{ws} host node{rank // per} local {rank % per}: ok" in log, log[-4000:]
    if per == 1:
        assert "2 hosts (one-rank-per-host)" in log and "allreduce algo=flat" in log, log[-4000:]
    else:
        assert "2 hosts (uniform)" in log and "allreduce algo=hierarchical" in log, log[-4000:]
    # Between the agents NCCL used its network transport, as between real hosts.
    assert " via NET/" in log, log[-4000:]
