"""What the compression hooks share: backend checks, a bucket type for callers
other than DDP, per-state byte counters, completed futures."""
from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple

import torch
import torch.distributed as dist

FLOAT_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)

# backend name -> device types whose tensors the hooks send through it.
# Gloo is CPU-only here: its CUDA paths stage through host memory and do not
# cover every collective the hooks use; NCCL has no CPU tensors.
SUPPORTED_BACKENDS: Dict[str, Tuple[str, ...]] = {
    "pycoll": ("cpu", "cuda"),
    "gloo": ("cpu",),
    "nccl": ("cuda",),
}


def backend_name(group: Optional[dist.ProcessGroup], device: torch.device) -> str:
    """The backend that carries `device` tensors in `group` ("cpu:gloo,cuda:nccl" style configs included)."""
    name = str(dist.get_backend(group)).lower()
    if ":" in name:  # per-device configuration
        per_device = dict(item.split(":", 1) for item in name.split(",") if ":" in item)
        name = per_device.get(device.type, name)
    return name


def check_backend(hook: str, group: Optional[dist.ProcessGroup], device: torch.device) -> str:
    """Raises ValueError for a backend/device pair the hooks do not support; returns the backend name."""
    if not dist.is_available() or not dist.is_initialized():
        raise ValueError(f"{hook}: torch.distributed is not initialised (call init_process_group first)")
    name = backend_name(group, device)
    devices = SUPPORTED_BACKENDS.get(name)
    if devices is None:
        raise ValueError(
            f"{hook}: backend {name!r} is not supported; use one of "
            + ", ".join(f"{b} ({'/'.join(d)} tensors)" for b, d in SUPPORTED_BACKENDS.items())
        )
    if device.type not in devices:
        raise ValueError(
            f"{hook}: backend {name!r} cannot carry {device.type} tensors (it takes {'/'.join(devices)} tensors); "
            f"use {' or '.join(b for b, d in SUPPORTED_BACKENDS.items() if device.type in d)} for {device.type}"
        )
    return name


def check_float(hook: str, tensor: torch.Tensor, what: str = "gradient") -> None:
    if tensor.dtype not in FLOAT_DTYPES:
        raise TypeError(
            f"{hook}: the {what} is {tensor.dtype}; compression needs float32, float64, float16 or bfloat16"
        )


def completed_future(value, device: torch.device) -> torch.futures.Future:
    fut = torch.futures.Future(devices=[device] if device.type == "cuda" else None)
    fut.set_result(value)
    return fut


class CommStats:
    """Bytes a state's hook put into collectives, next to what plain all_reduces would have put in.

    ``raw_bytes``: payload of an uncompressed all_reduce of the same tensors
    (numel x element size). ``sent_bytes``: payload this rank contributed to
    the hook's collectives (what ``pycollectives.stats()`` counts for them on
    the pycoll backend). Counted on every backend.
    """

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.calls = 0
        self.raw_bytes = 0
        self.sent_bytes = 0

    def add(self, raw: int, sent: int) -> None:
        self.calls += 1
        self.raw_bytes += int(raw)
        self.sent_bytes += int(sent)

    @property
    def ratio(self) -> float:
        """raw / sent (how many times fewer bytes than plain all_reduce); inf before any call."""
        return self.raw_bytes / self.sent_bytes if self.sent_bytes else float("inf")

    def as_dict(self) -> dict:
        return {"calls": self.calls, "raw_bytes": self.raw_bytes, "sent_bytes": self.sent_bytes, "ratio": self.ratio}

    def __repr__(self) -> str:
        return f"CommStats({self.as_dict()})"


class Bucket:
    """The parts of DDP's ``GradBucket`` that the hooks use, for callers without DDP.

    buffer: flat gradient buffer (the hook writes its result there);
    gradients: views of `buffer` shaped like the parameters (in order);
    keys: one hashable per gradient that names it across steps (error
    feedback and warm-start state follow the key when buckets change).
    """

    def __init__(self, index: int, buffer: torch.Tensor, gradients: Sequence[torch.Tensor], keys: Sequence,
                 is_last: bool = True, parameters: Optional[Sequence[torch.Tensor]] = None) -> None:
        self._index = index
        self._buffer = buffer
        self._gradients = list(gradients)
        self._keys = tuple(keys)
        self._is_last = is_last
        self._parameters = list(parameters) if parameters is not None else []

    def index(self) -> int:
        return self._index

    def buffer(self) -> torch.Tensor:
        return self._buffer

    def set_buffer(self, tensor: torch.Tensor) -> None:
        self._buffer = tensor

    def gradients(self) -> List[torch.Tensor]:
        return self._gradients

    def parameters(self) -> List[torch.Tensor]:
        return self._parameters

    def is_last(self) -> bool:
        return self._is_last

    def keys(self) -> tuple:
        return self._keys


def bucket_keys(bucket) -> tuple:
    """Stable names of a bucket's gradients: our Bucket's keys, or DDP's parameters' identities."""
    keys = getattr(bucket, "keys", None)
    if callable(keys):
        return tuple(keys())
    return tuple(id(p) for p in bucket.parameters())


def views_of(buffer: torch.Tensor, shapes: Sequence[torch.Size]) -> List[torch.Tensor]:
    """Consecutive views of a flat buffer with the given shapes."""
    out, off = [], 0
    flat = buffer.view(-1)
    for s in shapes:
        n = 1
        for d in s:
            n *= int(d)
        out.append(flat[off : off + n].view(s))
        off += n
    return out
