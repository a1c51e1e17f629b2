"""Majority vote of signSGD two ways, each with its encoding and decoding, on CPU ranks:

bits_all_gather  pack_signs, all_gather of the int32 words, majority_vote (what signsgd_hook does)
int8_all_reduce  (g < 0) as int8, all_reduce SUM of the counts, sign(W - 2 * count)

    python benchmarks/signsgd_vote_bench.py OUT.json
"""
import os, sys, time, datetime, json, torch, torch.distributed as dist, torch.multiprocessing as mp
def main(rank, world, backend, port, q):
    torch.set_num_threads(1)
    import pycollectives
    from pycollectives.hooks import _kernels as K
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    n = 13_148_176
    g = torch.randn(n)
    words = K.pack_signs(g)
    gathered = torch.empty(world * words.numel(), dtype=torch.int32)
    out = torch.empty(n)
    def bits():
        dist.all_gather_into_tensor(gathered, words)
        K.majority_vote(gathered.view(world, -1), n, 1.0, out=out)
    def int8():
        s = (g < 0).to(torch.int8)  # 1 per negative element
        dist.all_reduce(s)          # count of negative votes (fits int8 up to 127 ranks)
        out.copy_(torch.sign(world - 2 * s.to(torch.int32)))
    res = {}
    for name, f in (("bits_all_gather", bits), ("int8_all_reduce", int8)):
        for _ in range(2): f()
        dist.barrier(); t = time.perf_counter()
        for _ in range(10): f()
        dist.barrier(); res[name] = (time.perf_counter() - t) / 10 * 1e3
    if rank == 0: q.put(res)
    dist.destroy_process_group()
if __name__ == "__main__":
    ctx = mp.get_context("spawn"); out = {}
    for backend in ("gloo", "pycoll"):
        for world in (2, 4):
            q = ctx.Queue(); port = 29900 + world + (10 if backend == "pycoll" else 0)
            mp.start_processes(main, args=(world, backend, port, q), nprocs=world, start_method="spawn")
            r = q.get(); out[f"{backend} W={world}"] = r; print(backend, world, {k: round(v, 1) for k, v in r.items()}, flush=True)
    json.dump({"command": "python benchmarks/signsgd_vote_bench.py " + " ".join(sys.argv[1:]), "date": datetime.datetime.now().isoformat(timespec="seconds"),
               "machine": "2-core AMD EPYC VM", "numel": 13148176, "ms_per_vote": out}, open(sys.argv[1], "w"), indent=1)
