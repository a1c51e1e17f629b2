"""The one way the project times a collective: ``pycoll-bench`` and the regression benchmarks
(benchmarks/regression) both call these, so their numbers mean the same thing.

A measurement is ``iters`` back-to-back calls on one rank, started together on every rank by a
barrier of a group that is not under test (``barrier``), timed with the host clock on CPU and with
CUDA events on the current stream on GPU; the result is microseconds per call on this rank. The
caller takes the maximum over ranks.

This module imports nothing from pycollectives: the regression harness loads it from the working
tree while the library under test may be an older build.
"""
import time

import torch


def sync(cuda):
    if cuda:
        torch.cuda.synchronize()


def estimate_seconds(fn, n, cuda):
    """Seconds per call of n calls, host clock, device synchronised (to size a measurement)."""
    sync(cuda)
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    sync(cuda)
    return (time.perf_counter() - t0) / max(1, n)


def time_calls(fn, iters, cuda, barrier):
    """Mean microseconds per call of ``iters`` calls of ``fn`` on this rank, after ``barrier()``."""
    sync(cuda)
    barrier()
    if cuda:
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) * 1e3 / iters
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    return (time.perf_counter() - t0) * 1e6 / iters
