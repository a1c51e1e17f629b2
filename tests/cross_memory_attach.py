"""Whether sibling ranks on this host may read each other with cross-memory attach
(process_vm_readv), as the CPU engine's in-place reads need (csrc/cpu/peer_read.h).

Where they may not (Yama's ptrace_scope at 2 or 3 without CAP_SYS_PTRACE, a seccomp filter, /proc
with hidepid under scope 1), the engine stages and says so in its debug log, and the tests that
expect the in-place path skip with that line as the reason (the fixture needs_cross_memory_attach
in conftest.py). The answer comes from two real ranks doing one in-place all_gather, once per
session.
"""
import functools
import os
import sys

from ranks import quiet, run_ranks

DENIED = "cross-memory attach (process_vm_readv) is not allowed"


def _probe_rank(rank, ws):
    quiet()
    import torch
    import torch.distributed as dist

    x = torch.full((1 << 18,), float(rank))
    out = torch.empty(ws * x.numel())
    dist.all_gather_into_tensor(out, x)
    assert torch.equal(out, torch.arange(ws, dtype=x.dtype).repeat_interleave(x.numel()))
    sys.stderr.flush()
    with open(os.environ["PYCOLL_TEST_LOG"], errors="replace") as f:
        return [line.strip() for line in f if DENIED in line]


@functools.lru_cache(maxsize=None)
def why_not():
    """None where the ranks may read each other in place, else the engine's debug line saying why not."""
    for lines in run_ranks(2, _probe_rank, timeout=120, env={"PYCOLL_CPU_PEER_READ": "on", "PYCOLL_DEBUG": "INFO"}):
        if lines:
            return lines[0]
    return None
