"""One rank of a regression-benchmark pool (rank_pool.py starts it).

It joins a pycoll process group (the library found first on PYTHONPATH: the build under test)
and a Gloo control group, connects back to the pool, and serves requests until told to quit:
  ("prepare", case)                    make the case's buffers and call, keep them
  ("estimate", name, calls)            seconds per call of `calls` calls (max over ranks)
  ("time", name, calls, delay_us)      microseconds per call of `calls` calls (max over ranks),
                                       each call preceded by `delay_us` of injected delay
  ("ping",) / ("drop", name) / ("quit",)
Every reply is ("ok", value) or ("error", text).
"""
import argparse
import datetime
import os
import sys
import time
import traceback
from multiprocessing.connection import Client

import torch
import torch.distributed as dist

from harness import load_harness

GPU_BOUND_BYTES = 16 << 20  # 2 H100: 16 MiB all_reduce 62 us of kernels, 1 MiB 13 us mostly host


def _spin(seconds):
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


class Rank:
    def __init__(self, args):
        self.rank, self.world = args.rank, args.world
        self.cuda = args.device == "cuda"
        self.device = torch.device("cuda", self.rank) if self.cuda else torch.device("cpu")
        if self.cuda:
            torch.cuda.set_device(self.device)
        self._share_cpus()
        import pycollectives
        self.pyc = pycollectives
        self.h = load_harness()
        timeout = datetime.timedelta(seconds=args.timeout_s)
        store = dist.FileStore(args.store, self.world)
        dist.init_process_group("pycoll", store=store, rank=self.rank, world_size=self.world, timeout=timeout)
        self.ctrl = dist.new_group(backend="gloo", timeout=timeout)
        self.calls = {}
        self.gpu_bound = {}
        self.gpu_cycles_per_us = self._gpu_clock() if self.cuda else 0.0

    def _share_cpus(self):
        """Each rank on one core of its own, the same core for rank r in every pool, and one torch
        thread. Ranks that spin while they wait for each other, and OpenMP pools of every rank on
        every core, made one timing differ from the next by 10-20% on the 2-core machine; on a
        32-core GPU host, ranks free to move within 16 cores made two pools of one build differ by
        15-20% on host-bound calls (docs/regression-benchmarks.md)."""
        cpus = sorted(os.sched_getaffinity(0))
        share = max(1, len(cpus) // self.world)
        core = cpus[(self.rank * share + share // 2) % len(cpus)]  # mid-share: away from core 0's interrupts
        os.sched_setaffinity(0, [core])
        torch.set_num_threads(1)

    def _gpu_clock(self):
        """torch.cuda._sleep cycles per microsecond, for delays injected on the GPU stream."""
        cycles = 2_000_000
        torch.cuda._sleep(cycles)  # warm
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        torch.cuda._sleep(cycles)
        end.record()
        end.synchronize()
        return cycles / (start.elapsed_time(end) * 1e3)

    def barrier(self):
        dist.barrier(group=self.ctrl)

    def max_over_ranks(self, value):
        t = torch.tensor([float(value)], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self.ctrl)
        return float(t.item())

    # -- cases ---------------------------------------------------------------------------------
    def prepare(self, case):
        kind = case["kind"]
        if kind == "collective":
            fn = self._collective(case)
        elif kind == "ddp":
            fn = self._ddp_step()
        elif kind == "compression":
            fn = self._compression(case)
        else:
            raise ValueError(f"unknown case kind {kind!r}")
        algo = case.get("algo")
        self.calls[case["name"]] = (fn, algo)
        # Where a call spends its time on a GPU: in kernels for big messages and the DDP step, on
        # the host (argument checks, launches, Python) for the rest.
        self.gpu_bound[case["name"]] = self.cuda and (kind == "ddp" or case.get("bytes", 0) >= GPU_BOUND_BYTES)
        self._run(case["name"], 1)  # lazy set-up (workspaces, buckets) outside any timing
        return True

    def _collective(self, case):
        ops = self.h.ops
        coll = ops.COLLECTIVES[case["op"]]
        count = case["bytes"] // 4
        bufs = coll.setup(count, torch.float32, self.device, self.rank, self.world, False)
        coll.fill(bufs, self.rank, self.world, "sum", 0, for_timing=True)
        return coll.bind(bufs, dist.group.WORLD, ops.REDUCE_OP["sum"], 0, self.rank, self.world)

    def _ddp_step(self):
        from torch.nn.parallel import DistributedDataParallel as DDP
        torch.manual_seed(0)
        width, depth, batch = (2048, 8, 64) if self.cuda else (512, 4, 32)
        layers = []
        for _ in range(depth):
            layers += [torch.nn.Linear(width, width), torch.nn.ReLU()]
        model = torch.nn.Sequential(*layers).to(self.device)
        ddp = DDP(model, device_ids=[self.rank] if self.cuda else None)
        x = torch.randn(batch, width, device=self.device)

        def step():
            for p in ddp.parameters():
                p.grad = None
            ddp(x).square().mean().backward()
        return step

    def _compression(self, case):
        from pycollectives.compression import compressed_all_reduce
        n = case["bytes"] // 4
        side = int(n ** 0.5)
        t = torch.randn(side, side, device=self.device)
        method = case["method"]
        if method == "powersgd":
            from pycollectives import PowerSGDState
            try:
                state = PowerSGDState(process_group=None, matrix_approximation_rank=4, start_powerSGD_iter=0)
            except TypeError:  # a BASE from before torch's signature: it compressed from step 0 by default
                state = PowerSGDState(process_group=None, matrix_approximation_rank=4)
        else:
            from pycollectives import SignSGDState
            state = SignSGDState(process_group=None)
        return lambda: compressed_all_reduce(t, method, state)

    def _run(self, name, calls):
        fn, algo = self.calls[name]
        self.pyc.set_algo(algo)
        return self.h.timing.estimate_seconds(fn, calls, self.cuda)

    def estimate(self, name, calls):
        return self.max_over_ranks(self._run(name, calls))

    def time(self, name, calls, delay_us):
        fn, algo = self.calls[name]
        self.pyc.set_algo(algo)
        if delay_us > 0:
            fn = self._delayed(fn, delay_us, self.gpu_bound[name])
        us = self.h.timing.time_calls(fn, calls, self.cuda, self.barrier)
        return self.max_over_ranks(us)

    def _delayed(self, fn, delay_us, gpu_bound):
        """The op with `delay_us` more per call, where the call spends its time: a busy wait on the
        host, or a torch.cuda._sleep kernel on the stream for GPU-bound calls (a host delay would
        hide behind the queued kernels there)."""
        if gpu_bound:
            cycles = int(delay_us * self.gpu_cycles_per_us)
            return lambda: (torch.cuda._sleep(cycles), fn())
        host_s = delay_us * 1e-6
        return lambda: (_spin(host_s), fn())


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--world", type=int, required=True)
    p.add_argument("--device", choices=("cpu", "cuda"), required=True)
    p.add_argument("--store", required=True)
    p.add_argument("--address", required=True)
    p.add_argument("--timeout-s", type=int, default=300)
    args = p.parse_args()
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    conn = Client(args.address, family="AF_UNIX", authkey=bytes.fromhex(os.environ.pop("PYCOLL_POOL_KEY")))
    try:
        r = Rank(args)
    except Exception:
        conn.send(("error", traceback.format_exc()))
        raise
    conn.send(("ok", dict(rank=r.rank, library=os.path.dirname(os.path.abspath(r.pyc.__file__)),
                          harness=os.path.dirname(os.path.abspath(r.h.__file__)),
                          cuda_built=bool(r.pyc.cuda_built()),
                          card=torch.cuda.get_device_name(r.device) if r.cuda else "cpu")))
    handlers = {"ping": lambda: True, "prepare": r.prepare, "estimate": r.estimate, "time": r.time,
                "drop": lambda name: r.calls.pop(name, None) is not None}
    while True:
        msg = conn.recv()
        if msg[0] == "quit":
            break
        try:
            conn.send(("ok", handlers[msg[0]](*msg[1:])))
        except Exception as exc:
            conn.send(("error", f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"))
    dist.destroy_process_group()
    conn.send(("ok", "bye"))
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
