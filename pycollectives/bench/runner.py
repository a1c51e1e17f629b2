"""What every rank runs: process groups, then for each (dtype, size, op) the rows in
alternation on the same buffers, each timed nccl-tests style.

Before the first size, every row's group runs small all_reduces for ``prewarm_s`` seconds (the
first second of a run was measured slower for every backend, pycoll and NCCL alike: clocks ramp
up), in alternation, so that the smallest sizes, timed first, are not biased.

Timing of one row (backend or pycoll algorithm) at one size:
  1. one call with the known inputs; with --check its result is compared with the reference
     (errors and check results are agreed over the control group, so every rank takes the
     same path afterwards);
  2. ``warmup`` calls (5 below 1 MiB, 2 below 16 MiB, 1 above, unless -w), also timed to
     estimate the cost of a call;
  3. ``iters`` calls (-n, or adaptive: ``budget`` seconds / estimate, the largest estimate
     over ranks so that every rank runs the same count), between a barrier and a clock read
     (CPU: time.perf_counter; CUDA: events on the current stream);
  4. time per call = elapsed / iters, then the maximum over ranks.
With --rounds N the whole sweep (every size, every row) runs N times and a row's time is the median
of its N times (combine_rounds), so that one slow stretch of the host moves no ratio by itself.
Barriers, the maximum, iteration counts and error agreement all go through a separate Gloo
"control" group, never through the groups being measured.
"""
import datetime
import math
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist

from . import checker
from .floor import FLOOR_OPS, measure_floor
from .ops import COLLECTIVES, REDUCE_OP, run_count, skip_reason
from .progress import make_progress
from .sizes import format_size
from .timing import estimate_seconds, sync, time_calls



def default_warmup(nbytes):
    """Warmup calls when -w is not given: fewer for big sizes, where one call is long and
    the first call (step 1) has already paid for any lazy set-up."""
    return 5 if nbytes < (1 << 20) else 2 if nbytes < (16 << 20) else 1


class Variant:
    """One row of the table at each size: a backend's group, optionally a pycoll algorithm."""

    def __init__(self, label, backend, algo, group=None):
        self.label, self.backend, self.algo, self.group = label, backend, algo, group

    def __repr__(self):
        return f"Variant({self.label!r})"


def make_variants(backends, algos):
    """Rows in the order they run.  A backend named twice gets '#2'; pycoll with --algo gets
    one row per algorithm, labelled 'pycoll/ring' etc."""
    out, seen = [], {}
    for index, backend in enumerate(backends):
        seen[backend] = seen.get(backend, 0) + 1
        base = backend if seen[backend] == 1 else f"{backend}#{seen[backend]}"
        if backend == "pycoll" and algos:
            out.extend(Variant(f"{base}/{a}", backend, a, index) for a in algos)
        else:
            out.append(Variant(base, backend, None, index))
    return out


def baseline_label(variants):
    """The row ratios refer to: the first row whose backend is not pycoll, else the first."""
    for v in variants:
        if v.backend != "pycoll":
            return v.label
    return variants[0].label


class Control:
    """Agreement between ranks over a Gloo group that is not under test."""

    def __init__(self, group, world):
        self.group, self.world = group, world

    def max(self, value):
        t = torch.tensor([float(value)], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self.group)
        return float(t.item())

    def any(self, flag):
        return self.max(1.0 if flag else 0.0) > 0.0

    def gather(self, obj):
        out = [None] * self.world
        dist.all_gather_object(out, obj, group=self.group)
        return out

    def barrier(self):
        dist.barrier(group=self.group)

    def agree_error(self, msg):
        """None if no rank has a message, else every rank's message joined (same on all)."""
        if not self.any(msg is not None):
            return None
        by_msg = {}
        for r, m in enumerate(self.gather(msg)):
            if m is not None:
                by_msg.setdefault(m, []).append(str(r))
        if len(by_msg) == 1 and len(next(iter(by_msg.values()))) == self.world:
            return f"all ranks: {next(iter(by_msg))}"
        return "; ".join(f"rank {','.join(ranks)}: {m}" for m, ranks in by_msg.items())


def _capture_graph(fn, calls):
    """A CUDA graph of ``calls`` calls, captured after two calls on a side stream."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    torch.cuda.synchronize()
    return graph


def _time_graph(graph, calls, replays, ctrl):
    graph.replay()                       # warm replay
    torch.cuda.synchronize()
    ctrl.barrier()
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(replays):
        graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e3 / (calls * replays)


def combine_rounds(per_round):
    """One row per (dtype, op, size, row label, mode) from the rows of every round (each a list in
    the same order): the median time over the rounds that timed it, bandwidths scaled to match,
    each round's time in ``round_times_us``; a failed check or an error in any round marks the row
    (the first error text is kept)."""
    if len(per_round) == 1:
        return per_round[0]
    key = ("dtype", "op", "bytes", "label", "mode")
    if len({len(rows) for rows in per_round}) != 1:
        raise RuntimeError("pycoll-bench: the rounds produced different rows")
    out = []
    for rows in zip(*per_round):
        if any(tuple(r[k] for k in key) != tuple(rows[0][k] for k in key) for r in rows):
            raise RuntimeError(f"pycoll-bench: the rounds' rows do not line up: {[tuple(r[k] for k in key) for r in rows]}")
        row = dict(rows[0])
        times = [r["time_us"] for r in rows]
        row["round_times_us"] = times
        ok = [t for t in times if t]
        row["time_us"] = statistics.median(ok) if ok else None
        timed = [r for r in rows if r["time_us"] and r["algbw_gbps"]]
        if ok and timed:  # busbw / algbw is the op's nccl-tests factor, the same in every round
            row["algbw_gbps"] = row["bytes"] / row["time_us"] / 1e3
            row["busbw_gbps"] = row["algbw_gbps"] * timed[0]["busbw_gbps"] / timed[0]["algbw_gbps"]
        errors = [r["error"] for r in rows if r["error"]]
        if errors:
            row["error"] = errors[0]
        checks = [r["check"] for r in rows if r["check"] is not None]
        if checks:
            row["check"] = "fail" if "fail" in checks else "ok"
            row["check_error"] = next((r["check_error"] for r in rows if r["check_error"]), None)
        out.append(row)
    return out


class RankRunner:
    def __init__(self, cfg, rank, world, local_rank):
        self.cfg, self.rank, self.world, self.local_rank = cfg, rank, world, local_rank
        self.cuda = cfg.device == "cuda"
        # Rank r on GPU r % (GPUs visible): ranks beyond the GPU count share them.
        self.device = torch.device("cuda", local_rank % torch.cuda.device_count()) if self.cuda else torch.device("cpu")
        self.pyc = None
        self.faults = {f.strip() for f in cfg.inject_fault.split(",") if f.strip()}

    # -- setup ---------------------------------------------------------------------------
    def init_groups(self, store):
        cfg = self.cfg
        timeout = datetime.timedelta(seconds=cfg.timeout_s)
        if self.cuda:
            torch.cuda.set_device(self.device)
        if "pycoll" in cfg.backends:
            import pycollectives  # registers "pycoll"
            self.pyc = pycollectives
            if "pycoll" not in dist.Backend.backend_list:
                raise RuntimeError("import pycollectives did not register the 'pycoll' backend")
        kwargs = dict(backend=cfg.backends[0], rank=self.rank, world_size=self.world, timeout=timeout)
        if store is not None:
            kwargs["store"] = store
        else:
            kwargs["init_method"] = "env://"
        dist.init_process_group(**kwargs)
        groups = [dist.group.WORLD] + [dist.new_group(backend=b, timeout=timeout) for b in cfg.backends[1:]]
        self.ctrl = Control(dist.new_group(backend="gloo", timeout=timeout), self.world)
        self.variants = make_variants(cfg.backends, cfg.algos)
        for v in self.variants:
            v.group = groups[v.group]

    def set_algo(self, algo):
        fn = getattr(self.pyc, "set_algo", None) if self.pyc is not None else None
        if fn is None:
            raise RuntimeError("this pycollectives has no set_algo(); cannot force an algorithm")
        fn(algo)

    # -- one row ---------------------------------------------------------------------------
    def measure(self, v, coll, bufs, ref, nbytes, count, dtype_name, inplace, bar):
        cfg, cuda, ctrl = self.cfg, self.cuda, self.ctrl
        row = dict(op=coll.name, bytes=nbytes, count=count, dtype=dtype_name,
                   reduce_op=cfg.reduce_op if coll.reduces else None,
                   label=v.label, backend=v.backend, algo=v.algo, mode="eager", inplace=inplace,
                   warmup=None, iters=None, time_us=None, algbw_gbps=None, busbw_gbps=None,
                   check=None, check_error=None, error=None)
        rows = [row]
        coll.async_op = cfg.async_op
        fn = coll.bind(bufs, v.group, REDUCE_OP[cfg.reduce_op], cfg.root, self.rank, self.world)

        # 1. first call, on the known inputs when checking
        err = None
        t_first = 0.0
        try:
            if v.algo is not None:
                self.set_algo(v.algo)
            coll.fill(bufs, self.rank, self.world, cfg.reduce_op, cfg.root, for_timing=not cfg.check)
            t_first = estimate_seconds(fn, 1, cuda)
        except Exception as exc:  # recorded in the row, agreed by every rank
            err = f"{type(exc).__name__}: {exc}".strip()[:500]
        err = ctrl.agree_error(err)
        if err is not None:
            row["error"] = err
            bar.update(1 + int(cfg.graph), f"{coll.name} {format_size(nbytes)}")
            if cfg.graph:
                rows.append(dict(row, mode="graph"))
            return rows
        if cfg.check:
            result = coll.result(bufs)
            if coll.name in self.faults or "all" in self.faults:
                if self.rank == self.world - 1 and result.numel():
                    result.view(-1)[0] += 1
            msg = checker.compare(result, ref, exact=checker.result_is_exact(cfg.reduce_op))
            msg = ctrl.agree_error(msg)
            row["check"] = "ok" if msg is None else "fail"
            row["check_error"] = msg
            coll.fill(bufs, self.rank, self.world, cfg.reduce_op, cfg.root, for_timing=True)

        # 2. warmup, 3. timed loop, 4. max over ranks
        nwarm = cfg.warmup if cfg.warmup is not None else default_warmup(nbytes)
        est = estimate_seconds(fn, nwarm, cuda) if nwarm > 0 else t_first
        if cfg.iters is not None:
            iters = cfg.iters
        else:
            est = ctrl.max(est)
            iters = cfg.max_iters if est <= 0 else int(round(cfg.budget_s / est))
            iters = max(cfg.min_iters, min(cfg.max_iters, iters))
        us = ctrl.max(time_calls(fn, iters, cuda, ctrl.barrier))
        row.update(warmup=nwarm, iters=iters, time_us=us)
        bar.update(1, f"{coll.name} {format_size(nbytes)}")

        if cfg.graph:
            grow = dict(row, mode="graph", time_us=None, check=None, check_error=None)
            rows.append(grow)
            calls = min(iters, 100)
            replays = max(1, math.ceil(iters / calls))
            err, graph = None, None
            try:
                graph = _capture_graph(fn, calls)
            except Exception as exc:
                err = f"CUDA graph capture failed: {type(exc).__name__}: {exc}".strip()[:500]
            err = ctrl.agree_error(err)
            if err is None:
                grow["time_us"] = ctrl.max(_time_graph(graph, calls, replays, ctrl))
                grow["iters"] = calls * replays
            else:
                grow["error"] = err
            del graph
            bar.update(1, f"{coll.name} {format_size(nbytes)} graph")
        for r in rows:
            if r["time_us"]:
                r["algbw_gbps"] = nbytes / r["time_us"] / 1e3
                r["busbw_gbps"] = r["algbw_gbps"] * coll.busbw_factor(self.world)
        return rows

    def floor_row(self, coll, nbytes, count, dtype, dtype_name, inplace):
        """The memory floor at this size (floor.py), as a row labelled 'floor'."""
        ranks_on_host = self.world // max(1, self.cfg.hosts)
        us, iters = measure_floor(coll.name, count, dtype, self.world, self.rank, ranks_on_host, self.cfg.budget_s,
                                  self.ctrl)
        algbw = nbytes / us / 1e3
        return dict(op=coll.name, bytes=nbytes, count=count, dtype=dtype_name,
                    reduce_op=self.cfg.reduce_op if coll.reduces else None, label="floor", backend="floor",
                    algo=None, mode="eager", inplace=inplace, warmup=2, iters=iters, time_us=us,
                    algbw_gbps=algbw, busbw_gbps=algbw * coll.busbw_factor(self.world),
                    check=None, check_error=None, error=None)

    # -- the sweep -------------------------------------------------------------------------
    def prewarm(self):
        """Small all_reduces on every row's group, in alternation, for cfg.prewarm_s seconds
        (rounds of 50 calls per row; every rank runs the same number: the slowest rank's clock
        decides, agreed over the control group)."""
        if self.cfg.prewarm_s <= 0:
            return
        t = torch.zeros(2, device=self.device)
        t0 = time.perf_counter()
        while True:
            for v in self.variants:
                if v.algo is not None:
                    self.set_algo(v.algo)
                for _ in range(50):
                    dist.all_reduce(t, group=v.group)
            sync(self.cuda)
            if self.ctrl.max(time.perf_counter() - t0) >= self.cfg.prewarm_s:
                return

    def run(self):
        cfg = self.cfg
        jobs, skipped = [], []
        for dtype_name in cfg.dtypes:
            _, dtype = checker.resolve_dtype(dtype_name)
            elem = torch.empty((), dtype=dtype).element_size()
            for nbytes in cfg.sizes:
                for op in cfg.ops:
                    reason = skip_reason(op, nbytes, elem, self.world)
                    if reason:
                        skipped.append(dict(op=op, bytes=nbytes, dtype=dtype_name, reason=reason))
                    else:
                        count = run_count(op, nbytes, elem, self.world)
                        jobs.append((dtype_name, dtype, elem, count * elem, op))
        modes = 2 if cfg.graph else 1
        rounds = max(1, cfg.rounds)
        bar = make_progress(len(jobs) * len(self.variants) * modes * rounds,
                            enabled=cfg.progress and self.rank == 0)
        per_round = []
        t0 = time.monotonic()
        try:
            self.prewarm()
            for _ in range(rounds):
                results = []
                for dtype_name, dtype, elem, nbytes, op in jobs:
                    coll = COLLECTIVES[op]
                    count = nbytes // elem
                    inplace = coll.is_inplace(cfg.inplace)
                    bufs = coll.setup(count, dtype, self.device, self.rank, self.world, inplace)
                    if cfg.shared_tensors:
                        for t in bufs.values():
                            t.share_memory_()  # moves the storage; views of it follow
                    ref = None
                    if cfg.check:
                        ref = checker.expected(op, self.rank, self.world, count, dtype, self.device,
                                               cfg.reduce_op, cfg.root)
                    for v in self.variants:
                        results.extend(self.measure(v, coll, bufs, ref, nbytes, count, dtype_name, inplace, bar))
                    del bufs, ref
                    if not self.cuda and op in FLOOR_OPS:
                        results.append(self.floor_row(coll, nbytes, count, dtype, dtype_name, inplace))
                per_round.append(results)
        finally:
            bar.close()
            if cfg.algos and self.pyc is not None and hasattr(self.pyc, "set_algo"):
                self.pyc.set_algo(None)
        elapsed = time.monotonic() - t0
        results = combine_rounds(per_round)
        # Table and JSON order: dtype, op, size, then the rows in the order they ran.
        order = {(d, o): i for i, (d, o) in enumerate((d, o) for d in cfg.dtypes for o in cfg.ops)}
        results.sort(key=lambda r: (order[(r["dtype"], r["op"])], r["bytes"]))
        stats = None
        if self.pyc is not None and hasattr(self.pyc, "stats"):
            try:
                stats = self.pyc.stats()
            except Exception as exc:
                stats = {"error": repr(exc)}
        return dict(results=results, skipped=skipped, elapsed_s=elapsed, backend_stats=stats,
                    baseline=baseline_label(self.variants),
                    labels=[v.label for v in self.variants], host_layout=self.host_layout())

    def host_layout(self):
        """[hosts, ranks per host] as pycoll sees this launch (simulated by --hosts, or real hosts
        under torchrun), when every host has the same number of ranks and there are several of
        each; else None. --calibrate fits the forms across hosts for this layout."""
        from ..hosts import HostMap, host_identity
        hosts = HostMap.from_ids(self.ctrl.gather(host_identity()))
        return [len(hosts.hosts), len(hosts.hosts[0])] if hosts.kind == "uniform" else None


def run_rank(cfg, rank, world, local_rank, store=None):
    """Run the whole benchmark on this rank; rank 0 reports.  Returns the exit status, the
    same on every rank: 1 if a result was wrong or an op failed, else 0."""
    os.environ["NCCL_NVLS_ENABLE"] = "0"   # never NVLink multicast (docs/using-gpus.md)
    if cfg.trace:
        from .. import settings

        # The recorder keeps the most recent ops only: room for a whole run (about 0.5 KB per op),
        # unless the user chose a size.
        if settings.read("PYCOLL_FR_BUFFER_SIZE") == "2000":
            os.environ["PYCOLL_FR_BUFFER_SIZE"] = "1000000"
    runner = RankRunner(cfg, rank, world, local_rank)
    runner.init_groups(store)
    try:
        data = runner.run()
        if cfg.trace:
            write_trace(cfg.trace, runner.ctrl, rank)
        status = 0
        if rank == 0:
            try:
                from . import report
                status = report.finish(cfg, world, data)
            except Exception:  # never leave the other ranks waiting on rank 0
                import traceback
                traceback.print_exc()
                status = 1
        status = int(runner.ctrl.max(status))
        runner.ctrl.barrier()
    finally:
        dist.destroy_process_group()
    return status


def write_trace(path, ctrl, rank):
    """--trace: every rank dumps its flight recorder into PATH.dumps/, rank 0 makes the timeline."""
    from .. import trace

    dumps = os.path.abspath(path) + ".dumps"
    os.makedirs(dumps, exist_ok=True)
    trace.dump(os.path.join(dumps, "rank_"), reason="pycoll-bench --trace")
    ctrl.barrier()
    if rank == 0:
        events = trace.timeline(trace.load_dumps(dumps), path)["traceEvents"]
        slices = sum(1 for e in events if e["ph"] == "X" and e.get("cat") == "op")
        print(f"pycoll-bench: a timeline of {slices} ops in {path}; open it in https://ui.perfetto.dev")


def spawn_entry(rank, cfg, world, host, port, status_path):
    """torch.multiprocessing.spawn target: join the launcher's TCPStore, run, and (rank 0)
    write the exit status into ``status_path``."""
    if cfg.hosts > 1:
        # Simulated hosts: pycoll (hosts.py) and NCCL both read their host identity here.
        hostid = f"pycoll-bench-host{rank * cfg.hosts // world}"
        os.environ["PYCOLL_HOSTID"] = hostid
        os.environ["NCCL_HOSTID"] = hostid
    store = dist.TCPStore(host, port, world, False, timeout=datetime.timedelta(seconds=cfg.timeout_s))
    status = run_rank(cfg, rank, world, rank, store)
    if rank == 0:
        with open(status_path, "w") as fh:
            fh.write(str(status))
    # Everything is written and the groups are destroyed; skip the interpreter's teardown of
    # torch, which takes seconds per rank on a busy machine (the exit status went into the
    # file, so 0 here only means "finished").
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
