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


def _comms_metadata(rank, ws, path):
    import json

    t = torch.ones(1031)
    out = torch.empty(1031 * ws)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        dist.all_reduce(t)
        dist.all_gather_into_tensor(out, t)
    prof.export_chrome_trace(f"{path}.{rank}.json")
    with open(f"{path}.{rank}.json") as fh:
        events = json.load(fh)["traceEvents"]
    return [e.get("args", {}) for e in events if e.get("name") == "record_param_comms"]


def test_collectives_carry_torchs_comms_metadata(tmp_path):
    # What ProcessGroupNCCL and ProcessGroupGloo record (torch's "record_param_comms" event), so that
    # tools reading profiler traces see pycoll's collectives.
    for rank, records in enumerate(run_ranks(2, _comms_metadata, str(tmp_path / "trace"))):
        by_name = {r.get("Collective name"): r for r in records}
        assert set(by_name) >= {"allreduce", "allgather"}, records
        ar, ag = by_name["allreduce"], by_name["allgather"]
        assert ar["In msg nelems"] == 1031 and ar["Out msg nelems"] == 1031 and ar["dtype"] == "Float", ar
        assert ag["In msg nelems"] == 1031 and ag["Out msg nelems"] == 2062, ag
        assert ar["Group size"] == 2 and ar["Rank"] == rank, ar
        assert ar["Process Group Name"] == "0" and ar["Process Group Description"] == "default_pg", ar
