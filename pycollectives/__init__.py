"""pycollectives: a collective-communication backend for torch.distributed.

``import pycollectives`` registers the backend ``"pycoll"`` for CPU and CUDA
tensors, so that ``torch.distributed.init_process_group("pycoll")`` works with
any launcher (torchrun's env://, ``store=``, ``init_method="file://..."``).
"""
from __future__ import annotations

import atexit

import torch
import torch.distributed as dist

from . import _C  # noqa: F401  (the native extension)
from .bucketing import GradientBucketer
from .compression import compressed_all_reduce
from .config import get_algo, load_cost_model, set_algo
from .hosts import make_backend
from .memory import shared_cpu_memory, shared_cpu_memory_stats, use_shared_cpu_memory
from .split_options import backend_options
from .hooks import PowerSGDState, SignSGDState, powerSGD_hook, powersgd_hook, signsgd_hook
from .schedule import engine_tables as _schedule_tables
from .schedule.registry import register_algorithm  # noqa: F401 (docs/schedules.md)

__all__ = [
    "get_algo", "set_algo", "stats", "reset_stats", "cuda_built", "load_cost_model", "BACKEND_NAME",
    "signsgd_hook", "SignSGDState", "powersgd_hook", "powerSGD_hook", "PowerSGDState", "compressed_all_reduce",
    "GradientBucketer", "use_shared_cpu_memory", "shared_cpu_memory", "shared_cpu_memory_stats",
]

BACKEND_NAME = "pycoll"


def _create_backend(dist_backend_opts, backend_options):
    """The creator torch.distributed calls for every group using "pycoll"."""
    backend = make_backend(
        _C.ProcessGroupPycoll,
        dist_backend_opts.store,
        dist_backend_opts.group_rank,
        dist_backend_opts.group_size,
        dist_backend_opts.timeout,
        dist_backend_opts.group_id,
    )
    # The flight recorder's dumps name each group's global ranks; torch passes none for the
    # default group, whose group ranks are the global ones.
    ranks = list(dist_backend_opts.global_ranks_in_group) or list(range(dist_backend_opts.group_size))
    desc = "default_pg" if not dist_backend_opts.global_ranks_in_group else "undefined"
    backend._describe_for_recorder(desc, ranks)
    return backend


def _register() -> None:
    if BACKEND_NAME.upper() in dist.Backend._plugins:  # idempotent across reloads
        return
    # devices must be a list: a plain string would be iterated character by character.
    dist.Backend.register_backend(BACKEND_NAME, _create_backend, extended_api=True, devices=["cpu", "cuda"])


def stats() -> dict:
    """Per-op counters of this process: {op: {"calls": n, "bytes": payload bytes this rank contributed}}."""
    return dict(_C.stats())


def reset_stats() -> None:
    _C.reset_stats()


def cuda_built() -> bool:
    """True if the extension was compiled with the CUDA engine."""
    return bool(_C.built_with_cuda())


_register()
_C.set_schedule_source(_schedule_tables.provide)  # programs PYCOLL_ALGO or set_algo forces (schedule/)
_C.apply_cpu_allocator_setting()  # PYCOLL_CPU_ALLOCATOR=shared (pycollectives/memory.py)
# torch 2.11's split_group (DeviceMesh) deep-copies parent_backend.options: a copyable one.
_C.ProcessGroupPycoll.options = property(backend_options)
# Before finalization: background threads still holding tensors must let go while they can take
# the GIL (csrc/backend/executor.h: wait_for_background_work). Bounded: an op stuck on a peer that
# is gone does not hold the exit up for more than this.
atexit.register(_C._wait_for_background_work, 5.0)
try:
    load_cost_model()
except Exception as _exc:  # a bad or unreadable file must not break the import
    import warnings

    warnings.warn(f"pycollectives: cost model not loaded: {_exc}", RuntimeWarning, stacklevel=2)
