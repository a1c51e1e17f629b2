"""ProcessGroup.split_group on pycoll (issue 22: DeviceMesh takes this path after
init_process_group(device_id=...)). torch's dist.split_group needs an accelerator, so these CPU
tests call the ProcessGroup method it wraps: the children are made by the members only, each is a
working pycoll group of its own ranks (on one host or across simulated hosts), torch's call for
each device type (cpu, cuda) gets the same child, and a rank outside the ranks gets None.
"""
import copy
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from ranks import run_ranks

pytestmark = pytest.mark.pycoll_only

TIMEOUT = timedelta(seconds=30)


def _split(rank, ws, splits, names_differ=False):
    # What torch calls on new_group's non-members when the default group is bound to a device
    # (tests/test_gpu_device_mesh.py runs that path): nothing to do for pycoll, but it must exist.
    dist.group.WORLD._get_backend(torch.device("cpu")).perform_nocolor_split(torch.device("cpu"))
    mine = next((s for s in splits if rank in s), splits[0])
    name = "split-" + "-".join(map(str, mine))  # one name per split, as torch's hashed names are
    if names_differ:
        # torch 2.11 salts its hashed name with the number of groups this rank registered, which
        # differs between ranks after a new_group that left some out: the child must form anyway.
        name += f"-as-rank-{rank}-names-it"
    # torch 2.11's split_group deep-copies the parent backend's options and passes them on.
    parent = dist.group.WORLD._get_backend(torch.device("cpu"))
    opts = copy.deepcopy(parent.options)
    assert opts is not parent.options and opts.backend == "pycoll", opts.backend
    assert opts._timeout == TIMEOUT and opts.group_name == parent.options.group_name != "", opts.group_name
    child = dist.group.WORLD.split_group(mine, timeout=TIMEOUT, opts=opts, group_name=name)
    if rank not in mine:
        assert child is None, f"rank {rank} is outside {mine} but got a group"
        dist.all_reduce(torch.ones(5))  # the parent's op that the members run beside their child
        dist.barrier()
        return None
    assert child.size() == len(mine) and child.rank() == mine.index(rank), (child.size(), child.rank())
    assert child.name() in ("pycoll", "custom")
    cpu = child._get_backend(torch.device("cpu"))
    # splitGroup asked once per device type: one child serves both (two would share Store keys).
    assert child._get_backend(torch.device("cuda")) is cpu
    got = []
    for n in (1, 1031, 1 << 18):
        t = torch.full((n,), float(rank + 1))
        cpu.allreduce([t]).wait()
        want = float(sum(r + 1 for r in mine))
        assert torch.all(t == want).item(), (n, t[:3], want)
        got.append(t[0].item())
    out = [torch.empty(3) for _ in mine]
    cpu.allgather([out], [torch.full((3,), float(rank))]).wait()
    assert [o[0].item() for o in out] == [float(r) for r in mine]
    # The parent still works beside its child.
    p = torch.ones(5)
    dist.all_reduce(p)
    assert torch.all(p == ws).item()
    dist.barrier()
    return got


@pytest.mark.parametrize("splits", [[[0, 1], [2, 3]], [[0, 2], [1, 3]], [[0, 1, 2, 3]]],
                         ids=["halves", "interleaved", "whole"])
def test_split_group_on_one_host(splits):
    out = run_ranks(4, _split, splits, pg_timeout=TIMEOUT, timeout=120)
    assert all(o is not None for o in out)


def test_split_group_leaves_out_a_rank():
    out = run_ranks(3, _split, [[0, 1]], pg_timeout=TIMEOUT, timeout=120)
    assert out[2] is None and out[0] == out[1]


@pytest.mark.parametrize("splits", [[[0, 2], [1, 3]], [[0, 1, 2]]], ids=["interleaved", "one-left-out"])
def test_split_group_when_torch_names_the_child_differently_on_each_rank(splits):
    out = run_ranks(4, _split, splits, True, pg_timeout=TIMEOUT, timeout=120)
    assert [o is None for o in out] == [not any(r in s for s in splits) for r in range(4)]


@pytest.mark.parametrize("splits", [[[0, 1], [2, 3]], [[0, 2], [1, 3]], [[0, 1, 2, 3]]],
                         ids=["each-host", "one-per-host", "whole"])
def test_split_group_across_simulated_hosts(splits):
    # Hosts A (ranks 0, 1) and B (ranks 2, 3): a child inside one host, one rank per host (the
    # inter-host engine only), and the hierarchical whole.
    ids = ["hostA", "hostA", "hostB", "hostB"]
    out = run_ranks(4, _split, splits, pg_timeout=TIMEOUT, timeout=180,
                    rank_env=[{"PYCOLL_HOSTID": h} for h in ids])
    assert all(o is not None for o in out)
