"""CPU tensors in shared memory, so that large CPU collectives read peers' tensors in place.

A large CPU all_reduce, reduce_scatter, all_gather or broadcast whose tensors live in shared
memory on every rank skips the staging copy: each rank maps its peers' tensors and reads them
where they are (docs/algorithms.md, "Tensors in shared memory"). ``tensor.share_memory_()`` does
that for one tensor; the shared CPU allocator does it for every tensor of at least
``min_bytes`` made while it is on, including the ones a framework makes for you (DDP's gradient
buckets, FSDP's flat parameters, an optimizer's state)::

    import pycollectives
    pycollectives.use_shared_cpu_memory()       # or PYCOLL_CPU_ALLOCATOR=shared
    model = DDP(model)                           # buckets allocated from here on are shared

    with pycollectives.shared_cpu_memory():      # or only for what is made inside
        buckets = [torch.empty(n) for n in sizes]

Turning it on raises the process's soft open-files limit to the hard one (at most 65,536): each
such tensor holds a descriptor, and the allocator uses at most a quarter of the limit, leaving
the rest to the program. Each such tensor is its own memfd file: nothing is left in /dev/shm whatever way the process
ends, and /dev/shm's size limit does not apply. After a ``fork()`` (a DataLoader worker started
with "fork") the child's copies of these tensors are private, copy-on-write, as after any fork:
what the child writes stays its own, though pages it has not written still show what the parent
writes later. The parent never reuses a block that was live at a fork.
"""
from __future__ import annotations

import contextlib

from . import _C

__all__ = ["use_shared_cpu_memory", "shared_cpu_memory", "shared_cpu_memory_stats"]


def use_shared_cpu_memory(enabled: bool = True, min_bytes: int | None = None) -> None:
    """Turns the shared CPU allocator on (for CPU tensors of at least ``min_bytes``; default
    PYCOLL_SHARED_CPU_MIN_BYTES, 256 KiB) or, with ``enabled=False``, off. Tensors already made
    keep their memory either way."""
    if min_bytes is not None and min_bytes < 4096:
        raise ValueError(f"use_shared_cpu_memory: min_bytes must be at least 4096 (one page), got {min_bytes}")
    if enabled:
        _C.install_shared_cpu_allocator(min_bytes or 0)
    else:
        _C.uninstall_shared_cpu_allocator()


@contextlib.contextmanager
def shared_cpu_memory(min_bytes: int | None = None):
    """The shared CPU allocator for the tensors made inside the block (by any thread: torch has one
    CPU allocator per process); what was on before is on again after it, with its threshold, which
    a nested block without ``min_bytes`` keeps."""
    was_on = _C.shared_cpu_allocator_installed()
    before = _C.shared_cpu_allocator_stats()["min_bytes"]
    use_shared_cpu_memory(True, min_bytes if min_bytes is not None or not was_on else before)
    try:
        yield
    finally:
        if was_on:
            _C.install_shared_cpu_allocator(before)
        else:
            _C.uninstall_shared_cpu_allocator()


def shared_cpu_memory_stats() -> dict:
    """This process's shared CPU allocator: live and cached blocks and bytes, files made, reuses,
    allocations it left to torch's allocator (``fallbacks``), its file budget and threshold."""
    stats = dict(_C.shared_cpu_allocator_stats())
    stats["installed"] = bool(_C.shared_cpu_allocator_installed())
    return stats
