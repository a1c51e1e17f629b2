"""torch.profiler shows pycoll's collectives as "pycoll:<op>" events, once per call, as it shows
"gloo:all_reduce" and "nccl:all_reduce" (issue 21 item 3: DistributedTest's profiling tests)."""

import torch
import torch.distributed as dist
from torch.profiler import ProfilerActivity, profile

from ranks import run_ranks


def _profiled(rank, ws):
    t = torch.ones(1031)
    out = torch.empty(1031 * ws)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(3):
            dist.all_reduce(t)
        dist.all_gather_into_tensor(out, t)
        dist.broadcast(t, src=0)
        w = dist.all_reduce(t, async_op=True)
        w.wait()
        dist.barrier()
    names = [e.name for e in prof.events()]
    return {n: names.count(n) for n in ("pycoll:all_reduce", "pycoll:all_gather", "pycoll:broadcast",
                                         "pycoll:barrier")}


def test_collectives_appear_in_the_profiler_once_per_call():
    for counts in run_ranks(2, _profiled):
        assert counts == {"pycoll:all_reduce": 4, "pycoll:all_gather": 1, "pycoll:broadcast": 1,
                          "pycoll:barrier": 1}, counts
