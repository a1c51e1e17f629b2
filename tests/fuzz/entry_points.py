"""What the fuzz's ranks run (through tests/ranks.py: fn(rank, world_size, ...)): the CI fuzz
(fuzz_rank) and the soak (soak_rank), with the resource use the soak measures (usage).
"""

import ctypes
import gc
import os
import sys
import time

import torch
import torch.distributed as dist

from ranks import quiet

from .core import KINDS, Fuzzer

# Where pycoll's CPU transport names its POSIX shared memory
# (csrc/transport/shm/shm_transport.cpp: "/pycoll-<job token>-<rank>").
SHM_DIR = "/dev/shm"
SHM_PREFIX = "pycoll-"


def fuzz_rank(rank, ws, seed, n_ops, device="cpu"):
    """The CI fuzz: n_ops random ops, every one checked; returns op counts.
    device "cuda": pycoll's tensors on this rank's GPU (cuda:rank), the references on CPU."""
    quiet()
    if device == "cuda":
        device = f"cuda:{rank}"
    fz = Fuzzer(rank, ws, seed, trace=True, device=device)
    t0 = time.monotonic()
    fz.run(n_ops)
    counts = fz.finish()
    if fz.device.type == "cuda":  # a late device-side error fails this rank, not the teardown
        torch.cuda.synchronize(fz.device)
    dist.barrier(group=fz.groups[0].ref)
    return {"counts": counts, "seconds": time.monotonic() - t0}


def summarize(out, seed, n_ops, world_size, seconds):
    """The parent's check of fuzz_rank's results: every op kind ran on some rank (when the sequence
    is long enough to hold each); returns the one-line summary the tests print."""
    ran = {}
    for r in out:
        for kind, n in r["counts"].items():
            ran[kind] = ran.get(kind, 0) + n
    if n_ops >= len(KINDS):
        missing = sorted(set(KINDS) - set(ran))
        assert not missing, f"seed={seed}: op kinds never run: {missing}"
    return (f"fuzz ws={world_size} seed={seed} ops={n_ops}: {seconds:.1f}s, "
            f"per rank {[round(r['seconds'], 1) for r in out]}s; ops run by some rank: "
            f"{dict(sorted(ran.items()))}")


def _libc():
    try:
        return ctypes.CDLL("libc.so.6")
    except OSError:  # not glibc
        return None


_LIBC = _libc()


def _malloc_trim():
    if _LIBC is not None and hasattr(_LIBC, "malloc_trim"):
        _LIBC.malloc_trim(0)


class _Mallinfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                 "keepcost")]


def _malloc_heap_kb():
    """glibc's heap over all arenas: bytes in use (uordblks + mmapped blocks) and free but kept
    (fordblks), in kB; (None, None) where mallinfo2 is missing (glibc < 2.33, musl). Anonymous RSS
    that grows while in-use stays flat is the allocator keeping pages, not a leak."""
    fn = getattr(_LIBC, "mallinfo2", None)
    if fn is None:
        return None, None
    fn.restype = _Mallinfo2
    m = fn()
    return (m.uordblks + m.hblkhd) // 1024, m.fordblks // 1024


def usage():
    """This process's resident memory (kB), open file descriptors and threads,
    after a garbage collection and malloc_trim (so that RSS counts live memory,
    not free heap that glibc has not returned yet)."""
    gc.collect()
    _malloc_trim()
    status = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "RssAnon", "RssFile", "RssShmem"):
                status[key] = int(value.split()[0])
    fds = len(os.listdir("/proc/self/fd")) - 1  # less the one listdir holds
    names = []
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                names.append(f.read().strip())
        except OSError:  # ended meanwhile
            pass
    threads = len(names)
    shm_kb = 0  # pycoll's segments mapped here: RssShmem grows towards this as pages are touched
    with open("/proc/self/maps") as f:
        for line in f:
            if SHM_DIR + "/" + SHM_PREFIX in line:
                lo, hi = line.split()[0].split("-")
                shm_kb += (int(hi, 16) - int(lo, 16)) // 1024
    by_name = {}
    for n in names:
        by_name[n] = by_name.get(n, 0) + 1
    heap_used_kb, heap_free_kb = _malloc_heap_kb()
    return {"thread_names": dict(sorted(by_name.items())),
            "heap_used_kb": heap_used_kb, "heap_free_kb": heap_free_kb,
            "rss_kb": status.get("VmRSS"), "rss_anon_kb": status.get("RssAnon"),
            "rss_file_kb": status.get("RssFile"), "rss_shmem_kb": status.get("RssShmem"),
            "pycoll_shm_mapped_kb": shm_kb,
            "fds": fds, "threads": threads}


def soak_rank(rank, ws, seed, n_ops, warmup, check, sample_every):
    """The soak: n_ops random ops (checked unless check=False); resource use
    measured once every pending op is done after `warmup` ops and at the end.
    Mismatches are counted, not raised (the driver fails on them)."""
    quiet()
    fz = Fuzzer(rank, ws, seed, check=check)
    barrier_group = fz.groups[0].ref
    samples = []
    start, mid = {}, {}
    t0 = time.monotonic()

    def measure():
        fz.drain()
        dist.barrier(group=barrier_group)
        # A completion thread started during a burst (every one was busy) ends after 200 ms idle
        # (CompletionPool::kExtraIdle, csrc/backend/executor.h): a thread that outlives that is kept.
        time.sleep(0.3)
        return usage()

    def on_op(i):
        done = i + 1
        if done == warmup:
            start.update(measure())
            start["t"] = time.monotonic()
        elif done == n_ops // 2 and done > warmup:  # for the trend: leak or warm-up?
            mid.update(measure(), ops=done)
        elif done > warmup and done % sample_every == 0 and done < n_ops:
            u = usage()  # pending ops not waited: a sample, not a criterion
            samples.append((done, u["rss_kb"], u["rss_anon_kb"], u["rss_shmem_kb"], u["fds"],
                            u["threads"]))
        if done % 10000 == 0:
            print(f"soak: {done} ops, {time.monotonic() - t0:.0f}s, "
                  f"{fz.n_failures} failures", file=sys.stderr, flush=True)

    fz.run(n_ops, on_op=on_op)
    end = measure()
    if not start:  # fewer ops than the warm-up
        start = dict(end, t=time.monotonic())
    return {
        "ops": n_ops, "seconds": time.monotonic() - t0,
        "seconds_after_warmup": time.monotonic() - start["t"],
        "rss_kb_start": start["rss_kb"], "rss_kb_end": end["rss_kb"],
        "rss_kb_max_sampled": max([s[1] for s in samples] + [start["rss_kb"], end["rss_kb"]]),
        "samples": samples,  # (ops done, rss, anon, shmem kB, fds, threads)
        "start": start, "mid": mid or None, "end": end,
        "fds_start": start["fds"], "fds_end": end["fds"],
        "threads_start": start["threads"], "threads_end": end["threads"],
        "failures": fz.n_failures, "first_failures": fz.failures[:5],
        "counts": fz.counts,
    }
