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


def _param_comms(rank, ws, trace_dir):
    import json
    import os

    sub = dist.new_group([0, 2])  # global ranks 0 and 2: start 0, stride 2
    x = torch.ones(1031)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        dist.all_reduce(x)
        dist.all_reduce(torch.ones(7, dtype=torch.float64), async_op=True).wait()
        dist.all_gather_into_tensor(torch.empty(10 * ws, dtype=torch.int32), torch.ones(10, dtype=torch.int32))
        dist.reduce_scatter_tensor(torch.empty(6), torch.ones(6 * ws))
        dist.broadcast(torch.ones(5, dtype=torch.bfloat16), src=0)
        if rank != 1:
            dist.all_reduce(torch.ones(3), group=sub)
        if rank == 0:
            dist.send(torch.ones(4, dtype=torch.int64), dst=1)
        elif rank == 1:
            dist.recv(torch.empty(4, dtype=torch.int64), src=0)
    path = os.path.join(trace_dir, f"rank{rank}.json")
    prof.export_chrome_trace(path)
    with open(path) as fh:
        events = json.load(fh)["traceEvents"]
    keys = ("Collective name", "In msg nelems", "Out msg nelems", "dtype", "Group size", "Rank",
            "Process Group Ranks", "Global rank start", "Global rank stride", "Is asynchronized op", "Seq")
    return [{k: e["args"].get(k) for k in keys} for e in sorted(events, key=lambda e: e["ts"])
            if e.get("name") == "record_param_comms"]


def test_profiler_events_carry_the_comms_metadata(tmp_path):
    """Every collective, send and receive has a record_param_comms event with torch's communication
    metadata, as NCCL's and Gloo's calls do (what Holistic Trace Analysis and the profiler's comms view read)."""
    ws = 3
    for rank, records in enumerate(run_ranks(ws, _param_comms, str(tmp_path))):
        world = {"Group size": ws, "Rank": rank, "Process Group Ranks": "[0, 1, 2]", "Global rank start": 0,
                 "Global rank stride": 1}
        expected = [
            dict(world, **{"Collective name": "allreduce", "In msg nelems": 1031, "Out msg nelems": 1031,
                           "dtype": "Float", "Is asynchronized op": False}),
            dict(world, **{"Collective name": "allreduce", "In msg nelems": 7, "Out msg nelems": 7,
                           "dtype": "Double", "Is asynchronized op": True}),
            dict(world, **{"Collective name": "allgather_into_tensor", "In msg nelems": 10,
                           "Out msg nelems": 10 * ws, "dtype": "Int", "Is asynchronized op": False}),
            dict(world, **{"Collective name": "reduce_scatter_tensor", "In msg nelems": 6 * ws,
                           "Out msg nelems": 6, "dtype": "Float", "Is asynchronized op": False}),
            dict(world, **{"Collective name": "broadcast", "In msg nelems": 5, "Out msg nelems": 5,
                           "dtype": "BFloat16", "Is asynchronized op": False}),
        ]
        if rank != 1:
            expected.append({"Collective name": "allreduce", "In msg nelems": 3, "Out msg nelems": 3, "dtype": "Float",
                             "Group size": 2, "Rank": rank // 2, "Process Group Ranks": "[0, 2]",
                             "Global rank start": 0, "Global rank stride": 2, "Is asynchronized op": False})
        if rank < 2:
            expected.append(dict(world, **{"Collective name": "send" if rank == 0 else "recv", "In msg nelems": 4,
                                           "Out msg nelems": 4, "dtype": "Long", "Is asynchronized op": False}))
        seqs = [r.pop("Seq") for r in records]
        assert records == expected, (rank, records)
        assert seqs[:5] == sorted(seqs[:5]) and len(set(seqs[:5])) == 5, seqs
