# Copy-engine peer bandwidth on 2 GPUs (one process): unidirectional and both directions at once,
# the ceiling the SM kernels are compared with (docs/algorithms.md). python benchmarks/ce_peer_bandwidth.py OUTDIR
import json, os, sys, time
import torch
out = sys.argv[1]
assert torch.cuda.device_count() >= 2
d0, d1 = torch.device("cuda:0"), torch.device("cuda:1")
print("peer access", torch.cuda.can_device_access_peer(0, 1))
res = []
for mib in [1, 4, 16, 64, 256, 1024]:
    n = mib << 20
    a0 = torch.empty(n, dtype=torch.uint8, device=d0); b1 = torch.empty(n, dtype=torch.uint8, device=d1)
    a1 = torch.empty(n, dtype=torch.uint8, device=d1); b0 = torch.empty(n, dtype=torch.uint8, device=d0)
    s0 = torch.cuda.Stream(d0); s1 = torch.cuda.Stream(d1)
    iters = max(5, min(200, (4 << 30) // n))
    def run(bidir):
        with torch.cuda.stream(s0):
            for _ in range(iters): b1.copy_(a0, non_blocking=True)
        if bidir:
            with torch.cuda.stream(s1):
                for _ in range(iters): b0.copy_(a1, non_blocking=True)
    for bidir in (False, True):
        run(bidir); torch.cuda.synchronize(d0); torch.cuda.synchronize(d1)
        t = time.perf_counter(); run(bidir); torch.cuda.synchronize(d0); torch.cuda.synchronize(d1)
        dt = (time.perf_counter() - t) / iters
        r = dict(mib=mib, bidir=bidir, us=dt * 1e6, gbps_per_dir=n / dt / 1e9)
        print(r); res.append(r)
    del a0, b1, a1, b0
json.dump(res, open(os.path.join(out, "ce_bw.json"), "w"), indent=1)
