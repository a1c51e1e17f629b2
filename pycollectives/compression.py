"""Compressed all_reduce for training loops without DDP.

    state = PowerSGDState(matrix_approximation_rank=4, start_powerSGD_iter=0)  # keep it across steps
    for step in ...:
        loss.backward()
        compressed_all_reduce([p.grad for p in model.parameters()], "powersgd", state)
        opt.step()

The tensors are replaced, in place, by the compressed average over the
ranks of the group (the same on every rank). The state carries error
feedback and warm start from one call to the next: pass the same state (and
the same `key`, which names the tensors) every step. Without a state a
fresh one is made, so nothing carries over between calls.
"""
from __future__ import annotations

from typing import List, Optional, Sequence, Union

import torch
import torch.distributed as dist

from .hooks import _kernels as K
from .hooks._common import Bucket, check_float, views_of
from .hooks.powersgd import PowerSGDState, powersgd_hook
from .hooks.signsgd import SignSGDState, signsgd_hook

__all__ = ["compressed_all_reduce"]

_METHODS = {
    "signsgd": (SignSGDState, signsgd_hook),
    "powersgd": (PowerSGDState, powersgd_hook),
}


def compressed_all_reduce(tensor: Union[torch.Tensor, Sequence[torch.Tensor]], method: str = "signsgd",
                          state=None, group: Optional[dist.ProcessGroup] = None, key="default"):
    """Averages `tensor` (or a list of tensors) over the group with signSGD or PowerSGD, in place.

    method: "signsgd" or "powersgd".
    state: a SignSGDState / PowerSGDState to keep between calls (None: a fresh one, with `group`).
    group: the process group (None: the default group, or the state's).
    key: names the tensors across calls, so that their error feedback and
        warm-start state is found again (use one key per set of tensors).
    Returns `tensor` (the same object).
    """
    if method not in _METHODS:
        raise ValueError(f"compressed_all_reduce: method must be one of {', '.join(map(repr, _METHODS))}, "
                         f"got {method!r}")
    cls, hook = _METHODS[method]
    if state is None:
        # A one-off call compresses at once (torch's PowerSGDState default waits 1000 steps).
        state = cls(process_group=group, start_powerSGD_iter=0) if method == "powersgd" else cls(process_group=group)
    elif not isinstance(state, cls):
        raise TypeError(f"compressed_all_reduce: method {method!r} needs a {cls.__name__}, got "
                        f"{type(state).__name__}")
    elif group is not None and state.process_group is not group:
        raise ValueError("compressed_all_reduce: `group` differs from the state's process_group "
                         "(give the group to the state)")

    single = isinstance(tensor, torch.Tensor)
    tensors: List[torch.Tensor] = [tensor] if single else list(tensor)
    if not tensors:
        return tensor
    for i, t in enumerate(tensors):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"compressed_all_reduce: tensors[{i}] is a {type(t).__name__}, not a tensor")
        check_float("compressed_all_reduce", t, what=f"tensor {i}" if not single else "tensor")
        if t.dtype != tensors[0].dtype or t.device != tensors[0].device:
            raise ValueError(f"compressed_all_reduce: tensors[{i}] is {t.dtype} on {t.device}, tensors[0] "
                             f"{tensors[0].dtype} on {tensors[0].device} (all must match)")

    if single and tensor.is_contiguous():
        buffer, grads = tensor.view(-1), [tensor]
    else:
        buffer = torch.empty(sum(t.numel() for t in tensors), dtype=tensors[0].dtype, device=tensors[0].device)
        K.flatten_into(tensors, buffer)
        grads = views_of(buffer, [t.shape for t in tensors])
    bucket = Bucket(0, buffer, grads, keys=[(key, i) for i in range(len(tensors))], is_last=True)
    hook(state, bucket).wait()
    if grads[0] is not tensors[0]:
        K.unflatten_from(buffer, tensors)
    return tensor
