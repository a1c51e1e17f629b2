# Timeline of the split one-shot all_reduce (docs/algorithms.md), on 2 GPUs:
#   PYCOLL_CUDA_TRACE=1 PYCOLL_ALGO=oneshot torchrun --nproc_per_node 2 benchmarks/trace_split_all_reduce.py OUTDIR 8,16,64
# For each size: 30 back-to-back calls (eager), then the trace of the last; per rank a JSON of
# relative stamps (us from the earliest CTA start on that rank), plus the eager time per call.
import os, sys, json, datetime, torch, torch.distributed as dist
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
torch.cuda.set_device(rank)
import pycollectives  # noqa
dist.init_process_group("pycoll", timeout=datetime.timedelta(seconds=60))
pg = dist.group.WORLD._get_backend(torch.device("cuda"))
E = pycollectives._C.trace_events()
out = {}
for mib in [int(m) for m in sys.argv[2].split(",")]:
    x = torch.ones((mib << 20) // 4, device="cuda")
    for _ in range(20): dist.all_reduce(x)
    torch.cuda.synchronize(); dist.barrier()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(30): dist.all_reduce(x)
    e.record(); e.synchronize()
    per_call = s.elapsed_time(e) * 1e3 / 30
    rows = pg.cuda_trace()
    ctas = []
    for c in range(len(rows) // E):
        r = rows[c * E:(c + 1) * E]
        if r[0] == 0: continue
        ctas.append(dict(cta=c, K=r[E - 1], ev=r[:E - 1]))
    t0 = min(c["ev"][0] for c in ctas)
    for c in ctas:
        K = c["K"]; ev = c["ev"]
        c["start"] = (ev[0] - t0) / 1e3; c["end"] = (ev[1] - t0) / 1e3
        c["steps"] = [((ev[2 + 2 * k] - t0) / 1e3, (ev[3 + 2 * k] - t0) / 1e3) for k in range(min(K, 30))]
        del c["ev"]
    out[mib] = dict(per_call_us=per_call, t0_ns=t0, ctas=ctas)
    # summary line
    C = len(ctas) // 2
    push, red = ctas[:C], ctas[C:]
    f = lambda xs: (round(min(xs), 2), round(sorted(xs)[len(xs) // 2], 2), round(max(xs), 2))
    print(f"rank {rank} {mib} MiB per_call {per_call:.1f} us; C={C}; start {f([c['start'] for c in ctas])}; "
          f"push first stored {f([c['steps'][0][0] for c in push])} first published {f([c['steps'][0][1] for c in push])} "
          f"push end {f([c['end'] for c in push])}; red first arrived {f([c['steps'][0][0] for c in red])} "
          f"red last arrived {f([c['steps'][-1][0] for c in red])} red end {f([c['end'] for c in red])}", flush=True)
json.dump(out, open(os.path.join(sys.argv[1], f"trace-r{rank}.json"), "w"))
dist.destroy_process_group()
