"""Where the two speeds of a CPU collective come from: 2 ranks calling all_reduce back to back for
some seconds, every call recorded with what could explain a slow one, beside a fixed local copy
loop (the control) run in the same rank thread between the calls.

Per call, on every rank: wall time, the thread's CPU time (wall minus CPU time is time off the CPU:
asleep, queued behind another thread, or stolen by the hypervisor), voluntary and involuntary
context switches of the thread (getrusage RUSAGE_THREAD) and the CPU it ran on. Every `--block`
calls: the control (a fixed memcpy loop, timed) and the thread's schedstat (run and runqueue
time). The launcher samples the machine's steal time (/proc/stat) and CPU MHz (/proc/cpuinfo)
every 50 ms meanwhile. If the control slows exactly when the collective does, the cause is outside
the process; if not, it is in the engine.

    python3 benchmarks/cpu_two_speeds.py --seconds 10 --sizes 1M,64K [--pin] [--threads N] \
        [--out DIR] [--debug]
    python3 benchmarks/cpu_two_speeds.py --analyze DIR

--pin puts rank r alone on CPU r (as the regression harness pins); PYCOLL_CPU_THREADS=--threads.
--debug sets PYCOLL_DEBUG=INFO and counts the distinct plans each rank logged.
"""
import argparse
import bisect
import ctypes
import json
import math
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time

_libc = ctypes.CDLL(None, use_errno=True)


def sched_getcpu():
    return _libc.sched_getcpu()


def parse_size(s):
    s = s.strip().upper()
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(s[-1], 1)
    return int(float(s.rstrip("KMG")) * mult)


def schedstat():
    """This thread's (run ns, runqueue-wait ns, timeslices)."""
    tid = threading.get_native_id()
    with open(f"/proc/self/task/{tid}/schedstat") as f:
        a, b, c = f.read().split()
    return int(a), int(b), int(c)


# -- one rank ---------------------------------------------------------------------------------
def rank_main(a):
    import datetime
    import torch
    import torch.distributed as dist
    import pycollectives  # noqa: F401  (registers "pycoll")
    from pycollectives.settings import read as read_setting

    rank, world = a.rank, 2
    if a.pin:
        cpus = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, [cpus[rank % len(cpus)]])
    torch.set_num_threads(1)
    store = dist.FileStore(a.store, world)
    dist.init_process_group("pycoll", store=store, rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=120))
    ctrl = dist.new_group(backend="gloo")
    src = torch.ones(a.control_bytes // 4)
    dst = torch.empty_like(src)
    # The cross-core control: each rank writes its half of a shared file, then copies the peer's
    # half out of the peer's cache (no pycoll code involved: torch copies, a flag spun on in Python).
    # Then the op-like control: torch.add of a private operand and the peer's freshly written
    # second half into a private output, the pattern of the engine's reduce step without its code.
    n = a.control_bytes // 4
    shared = torch.from_file(a.store + ".xcore", shared=True, size=4 * n + 64)
    flags = shared[4 * n:].view(torch.int32)  # one int32 per rank, 128 bytes apart
    mine, theirs = shared[rank * 2 * n:(rank + 1) * 2 * n], shared[(1 - rank) * 2 * n:(2 - rank) * 2 * n]
    xdst = torch.empty(n)
    add_in, add_out = torch.ones(n), torch.empty(n)
    # And a private add over three buffers of --big-bytes each, more than a core's L2 together:
    # what the memory system behind L2 delivers to one thread, with no peer involved.
    big = [torch.ones(a.big_bytes // 4) for _ in range(3)]
    rounds = 0
    out = {"rank": rank, "pin": a.pin, "controls_only": a.controls_only, "threads": read_setting("PYCOLL_CPU_THREADS"), "sizes": {}}
    for nbytes in [parse_size(s) for s in a.sizes.split(",")]:
        x = torch.ones(nbytes // 4)
        for _ in range(50):
            dist.all_reduce(x)
        dist.barrier(group=ctrl)
        calls, controls = [], []
        end = time.monotonic() + a.seconds
        ru0 = resource.getrusage(resource.RUSAGE_THREAD)
        i = 0
        while True:
            if i % a.block == 0:
                # The control: the same copy every time, in this thread, between two calls.
                t0 = time.monotonic_ns()
                c0 = time.thread_time_ns()
                for _ in range(a.control_reps):
                    dst.copy_(src)
                t1 = time.monotonic_ns()
                c1 = time.thread_time_ns()
                rounds += 1
                mine.fill_(float(rounds))
                flags[rank * 32] = rounds
                while int(flags[(1 - rank) * 32]) < rounds:
                    pass
                x0 = time.monotonic_ns()
                xdst.copy_(theirs[:n])
                x1 = time.monotonic_ns()
                torch.add(add_in, theirs[n:], out=add_out)
                x2 = time.monotonic_ns()
                torch.add(big[0], big[1], out=big[2])
                x3 = time.monotonic_ns()
                s = schedstat()
                controls.append((t0, t1 - t0, c1 - c0, sched_getcpu(), s[0], s[1], s[2], x1 - x0, x2 - x1, x3 - x2))
                # Both ranks stop at the same call.
                if i % (a.block * 10) == 0:
                    flag = torch.tensor([1.0 if time.monotonic() > end else 0.0])
                    dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=ctrl)
                    if flag.item() > 0:
                        break
            cpu0 = sched_getcpu()
            c0 = time.thread_time_ns()
            t0 = time.monotonic_ns()
            if not a.controls_only:
                dist.all_reduce(x)
            t1 = time.monotonic_ns()
            c1 = time.thread_time_ns()
            ru1 = resource.getrusage(resource.RUSAGE_THREAD)
            calls.append((t0, t1 - t0, c1 - c0, ru1.ru_nvcsw - ru0.ru_nvcsw, ru1.ru_nivcsw - ru0.ru_nivcsw,
                          cpu0, sched_getcpu()))
            ru0 = ru1
            i += 1
        out["sizes"][str(nbytes)] = {"calls": calls, "controls": controls}
        dist.barrier(group=ctrl)
    dist.destroy_process_group()
    with open(os.path.join(a.out, f"rank{rank}.json"), "w") as f:
        json.dump(out, f)


# -- the launcher -----------------------------------------------------------------------------
def read_steal():
    """Per CPU line of /proc/stat: the first eight counters (ticks)."""
    with open("/proc/stat") as f:
        per = {}
        for line in f:
            if line.startswith("cpu"):
                p = line.split()
                per[p[0]] = [int(v) for v in p[1:9]]  # user nice system idle iowait irq softirq steal
    return per


def read_mhz():
    with open("/proc/cpuinfo") as f:
        return [float(line.split(":")[1]) for line in f if line.startswith("cpu MHz")]


def launch(a):
    out = a.out or tempfile.mkdtemp(prefix="two_speeds_")
    os.makedirs(out, exist_ok=True)
    store = os.path.join(out, "store")
    for f in (store, store + ".xcore"):
        if os.path.exists(f):
            os.remove(f)
    env = dict(os.environ)
    if a.threads is not None:
        env["PYCOLL_CPU_THREADS"] = str(a.threads)
    if a.debug:
        env["PYCOLL_DEBUG"] = "INFO"
    base = [sys.executable, os.path.abspath(__file__), "--store", store, "--out", out, "--sizes", a.sizes,
            "--seconds", str(a.seconds), "--block", str(a.block), "--control-bytes", str(a.control_bytes),
            "--control-reps", str(a.control_reps), "--big-bytes", str(a.big_bytes)] + (["--pin"] if a.pin else []) + (["--controls-only"] if a.controls_only else [])
    procs, errs = [], []
    for r in range(2):
        err = open(os.path.join(out, f"rank{r}.stderr"), "w")
        errs.append(err)
        procs.append(subprocess.Popen(base + ["--rank", str(r)], env=env, stderr=err))
    perf = None
    if a.perf:
        # Where each rank's CPU time goes, sampled; timestamps on the clock the ranks record.
        perf = subprocess.Popen(["perf", "record", "-q", "-e", "cpu-clock", "-F", str(a.perf_hz), "-k", "CLOCK_MONOTONIC",
                                 "-p", f"{procs[0].pid},{procs[1].pid}", "-o", os.path.join(out, "perf.data")],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    samples = []
    while any(p.poll() is None for p in procs):
        samples.append((time.monotonic_ns(), read_steal(), read_mhz()))
        time.sleep(0.05)
    for e in errs:
        e.close()
    if perf:
        perf.send_signal(2)
        perf.wait()
        with open(os.path.join(out, "perf.txt"), "w") as f:
            subprocess.run(["perf", "script", "-i", os.path.join(out, "perf.data"), "-F", "pid,time,ip,sym,dso"],
                           stdout=f, stderr=subprocess.DEVNULL)
    with open(os.path.join(out, "machine.json"), "w") as f:
        json.dump({"samples": samples, "hz": os.sysconf("SC_CLK_TCK")}, f)
    rc = [p.returncode for p in procs]
    if any(rc):
        sys.exit(f"ranks exited {rc}; see {out}/rank*.stderr")
    if a.debug:
        for r in range(2):
            with open(os.path.join(out, f"rank{r}.stderr")) as f:
                plans = {}
                for line in f:
                    if "allreduce" in line and "plan=" in line:
                        key = line.split("bytes=")[1].split()[0] + " " + line.split("plan=")[1].strip()
                        plans[key] = plans.get(key, 0) + 1
            print(f"rank {r} plans logged: {plans}")
    analyze(out, a.slow, a.split, a.timeline)
    return out


# -- analysis ---------------------------------------------------------------------------------
def pct(v, q):
    v = sorted(v)
    return v[min(len(v) - 1, int(q * len(v)))] if v else float("nan")


def analyze(out, slow_factor=2.0, split_us=None, timeline=0.0):
    split_us = split_us or {}
    ranks = []
    for r in range(2):
        with open(os.path.join(out, f"rank{r}.json")) as f:
            ranks.append(json.load(f))
    with open(os.path.join(out, "machine.json")) as f:
        mach = json.load(f)
    hz = mach["hz"]
    samples = mach["samples"]
    print(f"{out}: pin={ranks[0]['pin']} PYCOLL_CPU_THREADS={ranks[0]['threads']}")
    if ranks[0].get("controls_only"):
        return controls_only_summary(ranks)
    for size, _ in ranks[0]["sizes"].items():
        c0, c1 = ranks[0]["sizes"][size]["calls"], ranks[1]["sizes"][size]["calls"]
        n = min(len(c0), len(c1))
        # A call's time: the max over ranks of the same call (both ran it back to back).
        wall = [max(c0[i][1], c1[i][1]) / 1e3 for i in range(n)]
        fast = pct(wall, 0.1)
        thr = split_us.get(int(size), fast * slow_factor)
        hist = {}
        for w in wall:
            b = round(2 ** (round(4 * math.log2(max(w, 1))) / 4))  # quarter-octave bins
            hist[b] = hist.get(b, 0) + 1
        print("  histogram (us: calls): " + ", ".join(f"{b}: {c}" for b, c in sorted(hist.items()) if c >= n / 1000))
        slow = [w > thr for w in wall]
        print(f"  {int(size) >> 10} KiB all_reduce: {n} calls, p10 {fast:.1f} us, p50 {pct(wall, .5):.1f}, "
              f"p90 {pct(wall, .9):.1f}, {100 * sum(slow) / n:.1f}% above {thr:.0f} us")
        for r, cs in enumerate((c0, c1)):
            cs = cs[:n]
            for label, sel in (("fast", [not s for s in slow]), ("slow", slow)):
                sub = [c for c, s in zip(cs, sel) if s]
                if not sub:
                    continue
                w = [c[1] / 1e3 for c in sub]
                off = [(c[1] - c[2]) / 1e3 for c in sub]
                nv = sum(c[3] for c in sub) / len(sub)
                niv = sum(c[4] for c in sub) / len(sub)
                cpus = {}
                for c in sub:
                    cpus[c[5]] = cpus.get(c[5], 0) + 1
                mig = sum(1 for c in sub if c[5] != c[6]) / len(sub)
                print(f"    rank {r} {label}: {len(sub):6d} calls, wall p50 {statistics.median(w):7.1f} us, "
                      f"off-CPU p50 {statistics.median(off):6.1f} us, vol cs/call {nv:.2f}, invol {niv:.2f}, "
                      f"cpus {dict(sorted(cpus.items()))}, migrated in call {mig:.3f}")
        # Runs: how long the states last.
        runs, cur, start = [], slow[0], c0[0][0]
        for i in range(1, n):
            if slow[i] != cur:
                runs.append((cur, (c0[i][0] - start) / 1e6))
                cur, start = slow[i], c0[i][0]
        runs.append((cur, (c0[n - 1][0] - start) / 1e6))
        for label, st in (("fast", False), ("slow", True)):
            d = [ms for s, ms in runs if s == st]
            if d:
                print(f"    {label} runs: {len(d)}, median {statistics.median(d):.1f} ms, longest {max(d):.0f} ms")
        # The control against the calls around it, per rank, and the machine in 200 ms windows.
        for r in range(2):
            ctl = ranks[r]["sizes"][size]["controls"]
            cs = ranks[r]["sizes"][size]["calls"][:n]
            ct = [c[0] for c in cs]
            pairs = []
            for k in ctl:
                j = bisect.bisect_left(ct, k[0])
                near = slow[max(0, j - 5):j + 5]
                if near:
                    pairs.append((k[1] / 1e3, k[7] / 1e3 if len(k) > 7 else 0.0, k[8] / 1e3 if len(k) > 8 else 0.0,
                                  k[9] / 1e3 if len(k) > 9 else 0.0, sum(near) / len(near)))
            for what, col in (("local copy control", 0), ("cross-core copy control", 1), ("cross-core add control", 2),
                              ("private add beyond L2 control", 3)):
                in_slow = [p[col] for p in pairs if p[4] >= 0.8]
                in_fast = [p[col] for p in pairs if p[4] <= 0.2]
                line = f"    rank {r} {what} ({len(pairs)} runs): "
                if in_fast:
                    line += f"among fast calls p50 {statistics.median(in_fast):.1f} us (n={len(in_fast)}) "
                if in_slow:
                    line += f"among slow calls p50 {statistics.median(in_slow):.1f} us (n={len(in_slow)})"
                print(line)
            # schedstat: runqueue wait over the whole phase
            if len(ctl) > 1:
                run = (ctl[-1][4] - ctl[0][4]) / 1e6
                rq = (ctl[-1][5] - ctl[0][5]) / 1e6
                span = (ctl[-1][0] - ctl[0][0]) / 1e6
                print(f"    rank {r} thread over {span:.0f} ms: on CPU {run:.0f} ms, waiting in runqueue {rq:.1f} ms")
        if timeline:
            ctl0, ctl1 = ranks[0]["sizes"][size]["controls"], ranks[1]["sizes"][size]["controls"]
            step = int(timeline * 1e6)
            t = c0[0][0]
            print("    timeline: window start ms, calls, call p50 us, slow share, local control p50 us (r0/r1), "
                  "controls p50 us (r0/r1): local copy, cross-core copy, cross-core add, add beyond L2")
            ct0 = [c[0] for c in c0[:n]]
            k0 = [k[0] for k in ctl0]
            k1 = [k[0] for k in ctl1]
            while t < c0[n - 1][0]:
                lo, hi = bisect.bisect_left(ct0, t), bisect.bisect_left(ct0, t + step)
                a0, b0 = bisect.bisect_left(k0, t), bisect.bisect_left(k0, t + step)
                a1, b1 = bisect.bisect_left(k1, t), bisect.bisect_left(k1, t + step)
                if hi > lo and b0 > a0 and b1 > a1:
                    med = lambda v: statistics.median(v)
                    print(f"      {(t - c0[0][0]) / 1e6:7.0f} {hi - lo:6d} {med(wall[lo:hi]):7.1f} "
                      f"{sum(slow[lo:hi]) / (hi - lo):5.2f}  " +
                      "  ".join(f"{med([k[col] for k in ctl0[a0:b0]]) / 1e3:5.1f}/{med([k[col] for k in ctl1[a1:b1]]) / 1e3:5.1f}"
                                for col in (1, 7, 8, 9)))
                t += step
        window_split(ranks, size, c0[:n], wall, slow)
        if os.path.exists(os.path.join(out, "perf.txt")):
            perf_split(out, ranks, size, c0[:n], slow)
        t_lo, t_hi = c0[0][0], c0[n - 1][0]
        ct0 = [c[0] for c in c0[:n]]
        win = []
        for i in range(1, len(samples)):
            ta, sa, ma = samples[i - 1]
            tb, sb, mb = samples[i]
            if ta < t_lo or tb > t_hi:
                continue
            steal = {k: (sb[k][7] - sa[k][7]) / hz / ((tb - ta) / 1e9) for k in sb if k != "cpu"}
            busy = {k: 1 - (sb[k][3] - sa[k][3]) / hz / ((tb - ta) / 1e9) for k in sb if k != "cpu"}
            lo, hi = bisect.bisect_left(ct0, ta), bisect.bisect_left(ct0, tb)
            if hi > lo:
                win.append((sum(slow[lo:hi]) / (hi - lo), steal, busy, mb))
        if win:
            for label, sel in (("windows mostly fast", lambda f: f <= 0.2), ("windows mostly slow", lambda f: f >= 0.8),
                               ("windows mixed", lambda f: 0.2 < f < 0.8)):
                w = [x for x in win if sel(x[0])]
                if not w:
                    continue
                cpus = sorted(w[0][1])
                st = {c: statistics.mean(x[1][c] for x in w) for c in cpus}
                bz = {c: statistics.mean(x[2][c] for x in w) for c in cpus}
                mhz = statistics.mean(statistics.mean(x[3]) for x in w)
                print(f"    {label} ({len(w)} x 50 ms): steal " + ", ".join(f"{c} {100 * st[c]:.1f}%" for c in cpus) +
                      "; busy " + ", ".join(f"{c} {100 * bz[c]:.0f}%" for c in cpus) + f"; MHz {mhz:.0f}")


def controls_only_summary(ranks, ms=200):
    """No collective ran: the cross-core copy control's median per window, as a histogram."""
    for size in ranks[0]["sizes"]:
        ctl = [ranks[r]["sizes"][size]["controls"] for r in range(2)]
        t0, t1 = ctl[0][0][0], ctl[0][-1][0]
        meds = []
        t, step = t0, ms * 1_000_000
        while t < t1:
            v = [k[7] / 1e3 for c in ctl for k in c if t <= k[0] < t + step]
            if len(v) > 20:
                meds.append(statistics.median(v))
            t += step
        hist = {}
        for m in meds:
            hist[round(m)] = hist.get(round(m), 0) + 1
        print(f"  controls only: {len(ctl[0])} runs per rank; cross-core copy control, median per {ms} ms window "
              f"(us: windows): " + ", ".join(f"{k}: {v}" for k, v in sorted(hist.items())))
        print("    windows in order: " + " ".join(f"{m:.0f}" for m in meds))


def window_split(ranks, size, calls, wall, slow, ms=200):
    """Per window of `ms`: the call's median and each control's (mean of the ranks' medians), in
    windows of mostly fast calls against windows of mostly slow ones."""
    names = ("local copy", "cross-core copy", "cross-core add", "private add beyond L2")
    cols = (1, 7, 8, 9)
    ct = [c[0] for c in calls]
    ctl = [ranks[r]["sizes"][size]["controls"] for r in range(2)]
    kt = [[k[0] for k in c] for c in ctl]
    got = {True: [], False: []}
    t, step = ct[0], ms * 1_000_000
    while t < ct[-1]:
        lo, hi = bisect.bisect_left(ct, t), bisect.bisect_left(ct, t + step)
        ks = [c[bisect.bisect_left(k, t):bisect.bisect_left(k, t + step)] for c, k in zip(ctl, kt)]
        if hi - lo > 100 and all(ks):
            share = sum(slow[lo:hi]) / (hi - lo)
            if share <= 0.2 or share >= 0.8:
                row = [statistics.median(wall[lo:hi])]
                for col in cols:
                    have = [statistics.median(k[col] for k in kk) / 1e3 for kk in ks if len(kk[0]) > col]
                    row.append(statistics.mean(have) if len(have) == 2 else float("nan"))
                got[share >= 0.8].append(row)
        t += step
    if not got[True] or not got[False]:
        return
    print(f"    {ms} ms windows: {len(got[False])} mostly fast, {len(got[True])} mostly slow (median, [p10-p90] of windows):")
    for i, name in enumerate(("the call",) + names):
        f = sorted(r[i] for r in got[False])
        sl = sorted(r[i] for r in got[True])
        if any(math.isnan(v) for v in f + sl):
            continue
        q = lambda v, p: v[int(p * (len(v) - 1))]
        print(f"      {name:24s} fast {statistics.median(f):6.1f} [{q(f, .1):6.1f}-{q(f, .9):6.1f}]  "
              f"slow {statistics.median(sl):6.1f} [{q(sl, .1):6.1f}-{q(sl, .9):6.1f}] us  ratio {statistics.median(sl) / statistics.median(f):.2f}")


def perf_category(sym, dso):
    if "until_ge" in sym:
        return "Waiter::until_ge (spin)"
    if "yield" in sym or sym in ("schedule", "__schedule", "do_sched_yield") or "pick_next" in sym or "entry_SYSCALL" in sym \
            or "syscall" in sym.lower() or "native_sched_clock" in sym or "rcu" in sym:
        return "kernel: sched_yield/syscall"
    if "memcpy" in sym or "memmove" in sym:
        return "memcpy"
    if "reduce" in sym or "Reduce" in sym or "sum" in sym.lower():
        return "reduce kernel"
    if "kernel" in dso:
        return "kernel: other"
    if "python" in dso or "libpython" in dso:
        return "python"
    if "_C" in dso or "pycoll" in dso:
        return "pycoll: other"
    return "other: " + (dso.split("/")[-1] if dso else "?")


def perf_split(out, ranks, size, calls, slow):
    """perf samples of each rank in this size's phase, split by the state of the call running then."""
    starts = [c[0] for c in calls]
    ends = [c[0] + c[1] for c in calls]
    counts = {}
    syms = {}
    with open(os.path.join(out, "perf.txt")) as f:
        for line in f:
            p = line.split()  # pid time: ip sym... (dso)
            if len(p) < 4:
                continue
            try:
                pid, t = int(p[0]), int(round(float(p[1].rstrip(":")) * 1e9))
            except ValueError:
                continue
            if t < starts[0] or t > ends[-1]:
                continue
            j = bisect.bisect_right(starts, t) - 1
            if j < 0 or t > ends[j]:
                state = "between calls"
            else:
                state = "slow" if slow[j] else "fast"
            sym = " ".join(p[3:-1]) or "?"
            dso = p[-1].strip("()")
            cat = perf_category(sym, dso)
            counts.setdefault((pid, state), {}).setdefault(cat, 0)
            counts[(pid, state)][cat] += 1
            syms.setdefault((pid, state), {}).setdefault(sym, 0)
            syms[(pid, state)][sym] += 1
    for (pid, state), cats in sorted(counts.items()):
        tot = sum(cats.values())
        top = sorted(syms[(pid, state)].items(), key=lambda kv: -kv[1])[:6]
        print(f"    perf pid {pid} {state}: {tot} samples: " +
              ", ".join(f"{k} {100 * v / tot:.0f}%" for k, v in sorted(cats.items(), key=lambda kv: -kv[1]) if v / tot >= 0.01))
        print("      top symbols: " + ", ".join(f"{k} {100 * v / tot:.0f}%" for k, v in top))


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=10)
    p.add_argument("--sizes", default="1M,64K")
    p.add_argument("--pin", action="store_true")
    p.add_argument("--threads", type=int)
    p.add_argument("--debug", action="store_true")
    p.add_argument("--out")
    p.add_argument("--slow", type=float, default=2.0, help="a call is slow above this x the p10 time")
    p.add_argument("--block", type=int, default=20, help="calls between two controls")
    p.add_argument("--control-bytes", type=int, default=256 << 10)
    p.add_argument("--control-reps", type=int, default=8)
    p.add_argument("--big-bytes", type=int, default=1 << 20)
    p.add_argument("--perf", action="store_true", help="sample the ranks with perf record (cpu-clock)")
    p.add_argument("--perf-hz", type=int, default=500, help="perf's samples per second (each one costs a call ~20 us)")
    p.add_argument("--controls-only", action="store_true", help="run the controls without the collective")
    p.add_argument("--analyze", metavar="DIR")
    p.add_argument("--split-us", default="", help="SIZE=US,...: a call is slow above US (instead of --slow)")
    p.add_argument("--timeline", type=float, default=0.0, help="print medians per window of this many ms")
    p.add_argument("--rank", type=int, help=argparse.SUPPRESS)
    p.add_argument("--store", help=argparse.SUPPRESS)
    a = p.parse_args()
    a.split = {parse_size(kv.split("=")[0]): float(kv.split("=")[1]) for kv in a.split_us.split(",") if kv}
    if a.analyze:
        analyze(a.analyze, a.slow, a.split, a.timeline)
    elif a.rank is not None:
        rank_main(a)
    else:
        launch(a)


if __name__ == "__main__":
    main()
