"""Gradient bucketing that overlaps communication with backward, without DDP.

    bucketer = GradientBucketer(model, bucket_mb=25)                        # plain averaging
    bucketer = GradientBucketer(model, hook=powersgd_hook, state=PowerSGDState(matrix_approximation_rank=4, start_powerSGD_iter=0))
    for batch in data:
        loss(model(batch)).backward()     # buckets launch as they fill
        bucketer.wait()                   # averaged gradients are in p.grad
        opt.step(); opt.zero_grad()

Terms
  bucket: a run of parameters in reverse registration order (roughly the
      order backward produces their gradients), at most `bucket_mb` MiB, one
      dtype and device; a parameter larger than the limit gets a bucket alone.
  ready: a parameter whose gradient has been accumulated in this backward
      (``register_post_accumulate_grad_hook``).
  launch: copy the bucket's gradients into its flat buffer (one fused
      ``flatten_into``) and start its all_reduce (average; or `hook(state,
      bucket)`, the DDP comm-hook protocol) asynchronously.

Buckets launch strictly in index order, as soon as every parameter of the
bucket and of all earlier buckets is ready, so every rank issues the same
collectives in the same order. `wait()` launches what is left (parameters
that got no gradient count as zeros), waits, and writes the results back
into ``p.grad`` with one fused ``unflatten_from`` per bucket (``p.grad`` is
created for a parameter that had none). The model's parameters are
broadcast from rank 0 at construction, as DDP does.
"""
from __future__ import annotations

import contextlib
from typing import Callable, Dict, List, Optional

import torch
import torch.distributed as dist

from .hooks import _kernels as K
from .hooks._common import Bucket, check_backend, check_float, views_of

__all__ = ["GradientBucketer"]

_MIB = 1 << 20


class _BucketSlot:
    def __init__(self, index: int, params: List[torch.nn.Parameter]) -> None:
        self.index = index
        self.params = params
        self.numel = sum(p.numel() for p in params)
        self.buffer: Optional[torch.Tensor] = None
        self.ready = 0
        self.future: Optional[torch.futures.Future] = None


class GradientBucketer:
    """Bucketed, overlapped gradient averaging for a model, optionally through a compression hook.

    model: the module whose trainable parameters are averaged.
    bucket_mb: bucket size limit in MiB.
    hook: None (average with all_reduce) or a DDP-style comm hook
        ``hook(state, bucket) -> Future`` (signsgd_hook, powersgd_hook, ...).
    state: the hook's state.
    process_group: the group (None: the default group); for a compression
        hook the state's group is used.
    broadcast_parameters: broadcast parameters and buffers from rank 0 first.
    """

    def __init__(self, model: torch.nn.Module, bucket_mb: float = 25, hook: Optional[Callable] = None,
                 state=None, process_group: Optional[dist.ProcessGroup] = None,
                 broadcast_parameters: bool = True) -> None:
        if not bucket_mb > 0:
            raise ValueError(f"GradientBucketer: bucket_mb must be > 0, got {bucket_mb}")
        if hook is not None and not callable(hook):
            raise TypeError(f"GradientBucketer: hook must be callable, got {type(hook).__name__}")
        self.hook, self.state = hook, state
        self.process_group = process_group
        params, seen = [], set()
        for p in model.parameters():
            if p.requires_grad and id(p) not in seen:
                seen.add(id(p))
                params.append(p)
        for p in params:
            check_float("GradientBucketer", p, what=f"parameter of shape {tuple(p.shape)}")
        devices = {p.device for p in params}
        for d in devices:
            check_backend("GradientBucketer", process_group, d)

        # Buckets in reverse parameter order, split by size, dtype and device.
        limit = int(bucket_mb * _MIB)
        self.buckets: List[_BucketSlot] = []
        current: List[torch.nn.Parameter] = []
        size = 0
        for p in reversed(params):
            nbytes = p.numel() * p.element_size()
            if current and (size + nbytes > limit or p.dtype != current[0].dtype or p.device != current[0].device):
                self.buckets.append(_BucketSlot(len(self.buckets), current))
                current, size = [], 0
            current.append(p)
            size += nbytes
        if current:
            self.buckets.append(_BucketSlot(len(self.buckets), current))
        self._slot: Dict[int, _BucketSlot] = {id(p): b for b in self.buckets for p in b.params}
        self._seen_this_step: set = set()
        self._next = 0  # first bucket not launched yet
        self._enabled = True
        self._handles = [p.register_post_accumulate_grad_hook(self._on_grad) for p in params]

        if broadcast_parameters and dist.get_world_size(process_group) > 1:
            src = dist.get_global_rank(process_group, 0) if process_group is not None else 0
            with torch.no_grad():
                for t in list(model.parameters()) + list(model.buffers()):
                    dist.broadcast(t.data, src=src, group=process_group)

    # -- backward side --------------------------------------------------------

    def _on_grad(self, p: torch.Tensor) -> None:
        if not self._enabled:
            return
        if id(p) in self._seen_this_step:
            raise RuntimeError("GradientBucketer: a parameter received a second gradient before wait(); call "
                               "wait() after every backward, or accumulate inside `with bucketer.no_sync():`")
        self._seen_this_step.add(id(p))
        slot = self._slot[id(p)]
        slot.ready += 1
        while self._next < len(self.buckets) and \
                self.buckets[self._next].ready == len(self.buckets[self._next].params):
            self._launch(self.buckets[self._next])
            self._next += 1

    def _launch(self, slot: _BucketSlot) -> None:
        first = slot.params[0]
        if slot.buffer is None:
            slot.buffer = torch.empty(slot.numel, dtype=first.dtype, device=first.device)
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in slot.params]
        K.flatten_into([g.detach() for g in grads], slot.buffer)
        if self.hook is None:
            slot.buffer.div_(dist.get_world_size(self.process_group))
            slot.future = dist.all_reduce(slot.buffer, group=self.process_group, async_op=True).get_future()
        else:
            bucket = Bucket(slot.index, slot.buffer, views_of(slot.buffer, [p.shape for p in slot.params]),
                            keys=[id(p) for p in slot.params], is_last=slot.index == len(self.buckets) - 1,
                            parameters=slot.params)
            slot.future = self.hook(self.state, bucket)

    # -- optimizer side -------------------------------------------------------

    def wait(self) -> None:
        """Launches the buckets not launched yet, waits for all, writes the averages into ``p.grad``."""
        try:
            while self._next < len(self.buckets):
                self._launch(self.buckets[self._next])
                self._next += 1
            for slot in self.buckets:
                value = slot.future.wait()
                result = value[0] if isinstance(value, (list, tuple)) else value
                if result is None:
                    result = slot.buffer
                for p in slot.params:
                    if p.grad is None:
                        p.grad = torch.empty_like(p)
                K.unflatten_from(result.view(-1), [p.grad for p in slot.params])
        finally:
            for slot in self.buckets:
                slot.ready = 0
                slot.future = None
            self._seen_this_step.clear()
            self._next = 0

    @contextlib.contextmanager
    def no_sync(self):
        """Backward passes inside accumulate gradients locally, without communication."""
        prev, self._enabled = self._enabled, False
        try:
            yield
        finally:
            self._enabled = prev

    def remove(self) -> None:
        """Unregisters the gradient hooks."""
        for h in self._handles:
            h.remove()
        self._handles = []

    def bucket_sizes(self) -> List[int]:
        """Elements per bucket, in launch order."""
        return [b.numel for b in self.buckets]
