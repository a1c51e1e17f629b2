"""PowerSGD (Vogels et al., NeurIPS 2019) as a DDP communication hook.

Terms
  M: a gradient viewed as an ``n x m`` matrix (``n`` = first dimension, ``m``
     = the product of the others), plus its error-feedback residual ``E``.
  r: the rank of the approximation (``matrix_approximation_rank``).
  group: the matrices of one bucket that have the same ``(n, m)``; their
     ``M``, ``P`` and ``Q`` are stored as batches ``[B, n, m]``,
     ``[B, n, r]`` and ``[B, r, m]`` (Q transposed), so each step is one
     ``bmm`` per group for each product and one launch of
     ``batched_orthogonalize_``. Where a group's gradients lie back to back
     in the bucket (DDP's views of same-shape neighbours), M is read from and
     the result written to the bucket directly, with no copy.

One step for one bucket, on every rank::

    M = G + E                       (error feedback; G the gradient)
    P = M Q                         (Q: last step's Q, warm start)
    all_reduce(P of every group, + the uncompressed tensors)   # one call
    P = orthogonalize(P)            (batched modified Gram-Schmidt)
    Q = M^T P
    E = M - P Q^T                   (this rank's residual, with its own Q)
    all_reduce(Q of every group) / W                           # one call
    G = P Q^T                       (the same on every rank)

The residual is the paper's (Vogels et al., Algorithm 2): what this rank's
own rank-r message ``P Q_w^T`` leaves out, ``(I - P P^T) M_w``. torch's
powerSGD_hook subtracts the averaged approximation instead; both give the
same averaged gradients (every step depends on the ranks' M only through
their sum), ours keeps each rank's residual smaller.

Tensors with one dimension, and matrices where compression does not pay
(``n m < min_compression_rate * r (n + m)``), go uncompressed (averaged
exactly), inside the first all_reduce (in an all_reduce of their own for
fp16/bf16 gradients, whose P and Q are float32).

Bytes per step (payload this rank puts into its all_reduces, element size s
of the compute dtype; float32 for float32 and for fp16/bf16 gradients)::

    raw  = s_grad * sum over all tensors of numel
    sent = s * (sum over compressed matrices of r (n + m)
                + sum over uncompressed tensors of numel)

so the ratio raw / sent is ``n m / (r (n + m))`` for a single ``n x m``
matrix (e.g. 512 x 512 at rank 4: 64x). :func:`powersgd_bytes` computes it
for a list of shapes; ``state.stats`` counts it as it happens, and on pycoll
``pycollectives.stats()["allreduce"]["bytes"]`` shows the same.

Ordering. Every rank must issue its collectives in the same order. The
second all_reduce of a bucket can only start after the first completed, and
starting it from the first one's completion callback would make its position
depend on timing. So the hook of bucket k issues P(k), then waits for P(k-1)
(usually long done: it had the whole backward of bucket k) and issues
Q(k-1); the hook of the last bucket also finishes its own. No callback
issues or waits for a collective, so a single progress thread cannot
deadlock (torch's powerSGD_hook waits inside a callback).
"""

import logging
import math
from typing import Dict, List, Optional, Sequence, Tuple

import torch
import torch.distributed as dist

from . import _kernels as K
from ._common import CommStats, bucket_keys, check_backend, check_float, completed_future

logger = logging.getLogger(__name__)

__all__ = ["PowerSGDState", "powersgd_hook", "powerSGD_hook", "powersgd_bytes"]

_HOOK = "powersgd_hook"


def _matrix_shape(shape: Sequence[int], rank: int, min_compression_rate: float) -> Optional[Tuple[int, int, int]]:
    """(n, m, r) if a tensor of this shape is compressed, else None."""
    if len(shape) < 2:
        return None
    n = int(shape[0])
    m = int(math.prod(int(d) for d in shape[1:]))
    r = min(rank, n, m)
    if r < 1 or n * m < min_compression_rate * r * (n + m):
        return None
    return n, m, r


def powersgd_bytes(shapes: Sequence[Sequence[int]], rank: int = 1, min_compression_rate: float = 2.0,
                   element_size: int = 4, grad_element_size: Optional[int] = None) -> dict:
    """Analytic bytes of one PowerSGD step over tensors of these shapes.

    Returns ``{"raw": bytes of a plain all_reduce, "sent": bytes of PowerSGD's
    two all_reduces, "ratio": raw / sent}`` per rank (payload put in, as
    ``pycollectives.stats()`` counts it).
    """
    grad_element_size = element_size if grad_element_size is None else grad_element_size
    raw = sent = 0
    for shape in shapes:
        numel = int(math.prod(int(d) for d in shape))
        raw += numel * grad_element_size
        nmr = _matrix_shape(shape, rank, min_compression_rate)
        sent += (nmr[2] * (nmr[0] + nmr[1]) if nmr else numel) * element_size
    return {"raw": raw, "sent": sent, "ratio": raw / sent if sent else float("inf")}


def _batch_view(grads: Sequence[torch.Tensor], n: int, m: int) -> Optional[torch.Tensor]:
    """The gradients as one [B, n, m] tensor when they lie back to back in memory (DDP's bucket views
    of same-shape neighbours do), else None."""
    first = grads[0]
    step = n * m * first.element_size()
    for i, g in enumerate(grads):
        if not g.is_contiguous() or g.data_ptr() != first.data_ptr() + i * step:
            return None
    return first.as_strided((len(grads), n, m), (n * m, m, 1))


class _Group:
    """Same-shape matrices of one bucket: indices into the bucket, persistent E and Q, views of P and Q."""

    def __init__(self, n: int, m: int, r: int) -> None:
        self.n, self.m, self.r = n, m, r
        self.index: List[int] = []  # positions in the bucket's gradient list
        self.keys: List[object] = []
        self.G: Optional[torch.Tensor] = None  # [B, n, m] gradient dtype, scratch (allocated when needed)
        self.V: Optional[torch.Tensor] = None  # this step's [B, n, m] view of the gradients, if they are one
        self.E: Optional[torch.Tensor] = None  # [B, n, m] compute dtype, residual
        self.M: Optional[torch.Tensor] = None  # this step's M (E, G or a cast of G)
        self.P: Optional[torch.Tensor] = None  # [B, n, r] view of the layout's P buffer
        # Q transposed, [B, r, m], a view of the layout's Q buffer: P^T M then writes it contiguously
        # (M^T P into a [B, m, r] tensor takes a slow transposed path on the CPU, 6x here)
        self.Qt: Optional[torch.Tensor] = None


class _Layout:
    """How one bucket (a tuple of gradient keys) is compressed, with its buffers."""

    def __init__(self, state: "PowerSGDState", keys: tuple, grads: Sequence[torch.Tensor]) -> None:
        dev, gdtype = grads[0].device, grads[0].dtype
        cdtype = torch.float32 if gdtype in (torch.float16, torch.bfloat16) else gdtype
        self.keys, self.device, self.grad_dtype, self.dtype = keys, dev, gdtype, cdtype
        self.shapes = [tuple(g.shape) for g in grads]
        groups: Dict[Tuple[int, int, int], _Group] = {}
        self.uncompressed: List[int] = []
        for i, g in enumerate(grads):
            nmr = _matrix_shape(g.shape, state.rank, state.min_compression_rate)
            if nmr is None:
                self.uncompressed.append(i)
                continue
            grp = groups.setdefault(nmr, _Group(*nmr))
            grp.index.append(i)
            grp.keys.append(keys[i])
        self.groups = list(groups.values())
        self.unc_numel = sum(grads[i].numel() for i in self.uncompressed)
        p_numel = sum(len(g.index) * g.n * g.r for g in self.groups)
        q_numel = sum(len(g.index) * g.m * g.r for g in self.groups)
        # The uncompressed tensors ride in the P all_reduce when the dtypes agree.
        self.merged = gdtype == cdtype
        self.p_buf = torch.empty(p_numel + (self.unc_numel if self.merged else 0), dtype=cdtype, device=dev)
        self.u_buf = self.p_buf[p_numel:] if self.merged else torch.empty(self.unc_numel, dtype=gdtype, device=dev)
        self.q_buf = torch.empty(q_numel, dtype=cdtype, device=dev)
        po = qo = 0
        for g in self.groups:
            b = len(g.index)
            g.P = self.p_buf[po : po + b * g.n * g.r].view(b, g.n, g.r)
            g.Qt = self.q_buf[qo : qo + b * g.m * g.r].view(b, g.r, g.m)
            po += b * g.n * g.r
            qo += b * g.m * g.r
            if state.use_error_feedback:
                g.E = torch.zeros(b, g.n, g.m, dtype=cdtype, device=dev)
            state._fill_q(g.Qt)
        self.raw_bytes = sum(math.prod(s) for s in self.shapes) * grads[0].element_size()
        self.sent_bytes = (self.p_buf.numel() * self.p_buf.element_size()
                           + self.q_buf.numel() * self.q_buf.element_size())
        if not self.merged:
            self.sent_bytes += self.u_buf.numel() * self.u_buf.element_size()
        self.raw_numel = sum(math.prod(s) for s in self.shapes)
        self.sent_numel = self.p_buf.numel() + self.q_buf.numel() + (0 if self.merged else self.u_buf.numel())


class _Run:
    """One bucket in one step: its futures and the future the hook returned."""

    def __init__(self, layout: _Layout, buffer: torch.Tensor, grads: List[torch.Tensor], world: int) -> None:
        self.layout, self.buffer, self.grads, self.world = layout, buffer, grads, world
        self.p_fut: Optional[torch.futures.Future] = None
        self.u_fut: Optional[torch.futures.Future] = None
        self.result = torch.futures.Future(devices=[buffer.device] if buffer.device.type == "cuda" else None)


class PowerSGDState:
    """State of :func:`powersgd_hook`, with the signature of torch's
    ``torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook.PowerSGDState`` (names, positional
    order, defaults), so that switching from torch's hook to this one is a change of import.

    process_group: the group to communicate in (None: the default group).
    matrix_approximation_rank: r >= 1.
    start_powerSGD_iter: plain averaging all_reduce for the first steps (torch's default, 1000; 0
        compresses from the first step; torch requires > 1 with error feedback or warm start,
        this hook does not).
    min_compression_rate: a matrix is compressed only when ``n m >= rate * r (n + m)``.
    use_error_feedback: add each matrix's residual ``M - P Q^T`` to the next step's gradient.
    warm_start: start each step's power iteration from the last step's Q
        (else from a fresh random Q).
    orthogonalization_epsilon: eps of ``col /= |col| + eps``; an all-zero column stays 0 even with 0.
    random_seed: seed of the initial Q (the same on every rank, which PowerSGD needs).
    compression_stats_logging_frequency: log :meth:`compression_stats` every this many steps.
    batch_tensors_with_same_shape: accepted for torch compatibility; this hook always orthogonalises
        same-shaped matrices in one batched kernel (the result is the same either way).
    start_iter: keyword-only, this package's former name of start_powerSGD_iter.
    """

    def __init__(self, process_group: Optional[dist.ProcessGroup] = None, matrix_approximation_rank: int = 1,
                 start_powerSGD_iter: int = 1_000, min_compression_rate: float = 2, use_error_feedback: bool = True,
                 warm_start: bool = True, orthogonalization_epsilon: float = 0, random_seed: int = 0,
                 compression_stats_logging_frequency: int = 10_000, batch_tensors_with_same_shape: bool = False,
                 *, start_iter: Optional[int] = None) -> None:
        if start_iter is not None:
            if start_powerSGD_iter not in (1_000, start_iter):
                raise ValueError(f"PowerSGDState: start_iter={start_iter} and start_powerSGD_iter={start_powerSGD_iter} "
                                 f"name the same setting; give one")
            start_powerSGD_iter = start_iter
        if isinstance(matrix_approximation_rank, bool) or not isinstance(matrix_approximation_rank, int):
            raise TypeError(f"PowerSGDState: matrix_approximation_rank must be an int >= 1, got "
                            f"{matrix_approximation_rank!r}")
        if matrix_approximation_rank < 1:
            raise ValueError(f"PowerSGDState: matrix_approximation_rank must be >= 1, got {matrix_approximation_rank}")
        if not min_compression_rate >= 0:
            raise ValueError(f"PowerSGDState: min_compression_rate must be >= 0, got {min_compression_rate}")
        if not orthogonalization_epsilon >= 0:
            raise ValueError(f"PowerSGDState: orthogonalization_epsilon must be >= 0, got {orthogonalization_epsilon}")
        if start_powerSGD_iter < 0:
            raise ValueError(f"PowerSGDState: start_powerSGD_iter must be >= 0, got {start_powerSGD_iter}")
        if compression_stats_logging_frequency < 1:
            raise ValueError(f"PowerSGDState: compression_stats_logging_frequency must be >= 1, got "
                             f"{compression_stats_logging_frequency}")
        self.process_group = process_group
        self.rank = matrix_approximation_rank
        self.matrix_approximation_rank = matrix_approximation_rank
        self.min_compression_rate = float(min_compression_rate)
        self.use_error_feedback = bool(use_error_feedback)
        self.warm_start = bool(warm_start)
        self.eps = float(orthogonalization_epsilon)
        self.start_iter = int(start_powerSGD_iter)
        self.compression_stats_logging_frequency = int(compression_stats_logging_frequency)
        self.batch_tensors_with_same_shape = bool(batch_tensors_with_same_shape)
        self.iter = 0  # steps completed (the last bucket of a step advances it)
        self.stats = CommStats()
        self._numel = [0, 0]  # elements before / after compression (compression_stats)
        self._rng = torch.Generator().manual_seed(int(random_seed))
        self._layouts: Dict[tuple, _Layout] = {}
        self._where: Dict[object, Tuple[_Layout, _Group, int]] = {}  # compressed gradient key -> its slot
        self._owner: Dict[object, _Layout] = {}  # gradient key -> the layout it is in now
        self._pending: List[_Run] = []
        self._backend_checked: Dict[str, str] = {}

    @property
    def start_powerSGD_iter(self) -> int:  # torch's attribute name
        return self.start_iter

    def compression_stats(self) -> Tuple[float, int, int]:
        """As torch's: (compression rate, elements before compression, elements after), summed
        over the buckets of every step so far."""
        before, after = self._numel
        return (before / after if after else 0.0), before, after

    def _step_done(self) -> None:
        self.iter += 1
        if self.iter % self.compression_stats_logging_frequency == 0:
            rate, before, after = self.compression_stats()
            logger.info("powersgd_hook: compression rate %.2f (%d -> %d elements) after %d steps",
                        rate, before, after, self.iter)

    # -- state of the matrices -------------------------------------------------

    def _fill_q(self, qt: torch.Tensor) -> None:
        """Q^T for a random Q [B, m, r] with orthonormal columns, identical on every rank (drawn on the CPU
        from the seeded generator)."""
        if qt.numel() == 0:
            return
        b, r, m = qt.shape
        q = torch.randn((b, m, r), generator=self._rng, dtype=torch.float32)
        K.batched_orthogonalize_(q, self.eps)
        qt.copy_(q.transpose(1, 2))

    def _layout(self, keys: tuple, grads: Sequence[torch.Tensor]) -> _Layout:
        lay = self._layouts.get(keys)
        if lay is not None and lay.shapes == [tuple(g.shape) for g in grads] and lay.grad_dtype == grads[0].dtype \
                and lay.device == grads[0].device:
            return lay
        lay = _Layout(self, keys, grads)
        # Carry residuals and warm-start Qs over, per gradient, from an older layout (DDP rebuilds its
        # buckets after the first step).
        for grp in lay.groups:
            for b, key in enumerate(grp.keys):
                old = self._where.get(key)
                if old is not None:
                    _, ogrp, ob = old
                    if (ogrp.n, ogrp.m, ogrp.r) == (grp.n, grp.m, grp.r):
                        grp.Qt[b].copy_(ogrp.Qt[ob])
                        if grp.E is not None and ogrp.E is not None:
                            grp.E[b].copy_(ogrp.E[ob])
                self._where[key] = (lay, grp, b)
        for key in keys:
            self._owner[key] = lay
        self._layouts[keys] = lay
        # Drop layouts that own no gradient any more (the buckets before a rebuild).
        live = {id(v) for v in self._owner.values()}
        for k in [k for k, v in self._layouts.items() if id(v) not in live]:
            del self._layouts[k]
        return lay

    def residual(self, key) -> Optional[torch.Tensor]:
        """The error-feedback residual (n x m) of the gradient with this key (DDP: ``id(param)``), if any."""
        loc = self._where.get(key)
        if loc is None or loc[1].E is None:
            return None
        return loc[1].E[loc[2]]

    def reset(self) -> None:
        """Forgets residuals, warm-start state, pending work and counters (the seed's sequence goes on)."""
        self._abandon(RuntimeError("PowerSGDState.reset() abandoned this bucket"))
        self._layouts.clear()
        self._where.clear()
        self._owner.clear()
        self.stats.reset()
        self._numel = [0, 0]
        self.iter = 0

    def _check(self, device: torch.device) -> None:
        if device.type not in self._backend_checked:
            self._backend_checked[device.type] = check_backend(_HOOK, self.process_group, device)

    # -- the three phases of a bucket ------------------------------------------

    def _issue_p(self, run: _Run) -> None:
        """M = G + E; P = M Q; issue the all_reduce of all P (and the uncompressed tensors)."""
        lay, grads = run.layout, run.grads
        for g in lay.groups:
            g.V = _batch_view([grads[i] for i in g.index], g.n, g.m) if lay.grad_dtype == lay.dtype else None
            if g.V is not None:
                src = g.V  # the gradients already are one [B, n, m] tensor: no copy in, none out
            else:
                if g.G is None:
                    g.G = torch.empty(len(g.index), g.n, g.m, dtype=lay.grad_dtype, device=lay.device)
                K.flatten_into([grads[i] for i in g.index], g.G)
                src = g.G
            if g.E is not None:
                g.M = g.E.add_(src)
            else:
                g.M = src if src.dtype == lay.dtype else src.to(lay.dtype)
            if not self.warm_start:
                self._fill_q(g.Qt)
            torch.bmm(g.M, g.Qt.transpose(1, 2), out=g.P)
        if lay.uncompressed:
            K.flatten_into([grads[i] for i in lay.uncompressed], lay.u_buf)
            lay.u_buf.div_(run.world)
        group = self.process_group
        if lay.p_buf.numel():
            run.p_fut = dist.all_reduce(lay.p_buf, group=group, async_op=True).get_future()
        if not lay.merged and lay.u_buf.numel():
            run.u_fut = dist.all_reduce(lay.u_buf, group=group, async_op=True).get_future()
        self.stats.add(raw=lay.raw_bytes, sent=lay.sent_bytes)
        self._numel[0] += lay.raw_numel
        self._numel[1] += lay.sent_numel

    def _issue_q(self, run: _Run) -> None:
        """Wait for P; orthogonalise; Q = M^T P; E = M - P Q^T; issue the all_reduce of all Q (or finish)."""
        lay = run.layout
        if run.p_fut is not None:
            run.p_fut.wait()
        if run.u_fut is not None:
            run.u_fut.wait()
        if lay.uncompressed:
            K.unflatten_from(lay.u_buf, [run.grads[i] for i in lay.uncompressed])
        for g in lay.groups:
            K.batched_orthogonalize_(g.P, self.eps)
            torch.bmm(g.P.transpose(1, 2), g.M, out=g.Qt)  # Q^T = P^T M
            if g.E is not None:
                g.E.baddbmm_(g.P, g.Qt, alpha=-1.0)  # E = M - P Q_local^T (E held M)
            g.M = None
        if not lay.groups:
            run.result.set_result(run.buffer)
            return
        q_fut = dist.all_reduce(lay.q_buf, group=self.process_group, async_op=True).get_future()
        q_fut.then(lambda fut: self._finish(run, fut))

    def _finish(self, run: _Run, fut: torch.futures.Future) -> None:
        """(Completion callback of Q: no collectives here.) Q /= W; G = P Q^T."""
        try:
            fut.value()  # raises if the all_reduce failed
            lay = run.layout
            lay.q_buf.div_(run.world)
            for g in lay.groups:
                if g.V is not None:  # straight into the gradients
                    torch.bmm(g.P, g.Qt, out=g.V)
                    g.V = None
                    continue
                approx = g.G if g.G.dtype == lay.dtype else torch.empty(g.G.shape, dtype=lay.dtype,
                                                                         device=lay.device)
                torch.bmm(g.P, g.Qt, out=approx)
                out = approx if approx.dtype == g.G.dtype else approx.to(g.G.dtype)
                K.unflatten_from(out, [run.grads[i] for i in g.index])
            run.result.set_result(run.buffer)
        except Exception as e:  # noqa: BLE001 -- handed to whoever waits on the bucket
            run.result.set_exception(e)

    def _abandon(self, error: BaseException) -> None:
        for run in self._pending:
            if not run.result.done():
                run.result.set_exception(error)
        self._pending = []


def powersgd_hook(state: PowerSGDState, bucket) -> torch.futures.Future[torch.Tensor]:
    """DDP communication hook: PowerSGD with error feedback and warm start (see the module doc).

    ``ddp.register_comm_hook(PowerSGDState(matrix_approximation_rank=4), powersgd_hook)``.
    Works over pycoll (CPU and CUDA), NCCL (CUDA) and Gloo (CPU). Returns a
    future of the bucket buffer, which holds the averaged approximation.
    """
    if not isinstance(state, PowerSGDState):
        raise TypeError(f"{_HOOK}: state must be a PowerSGDState, got {type(state).__name__}")
    buf = bucket.buffer()
    check_float(_HOOK, buf)
    state._check(buf.device)
    group = state.process_group
    world = dist.get_world_size(group)
    last = bucket.is_last()

    if bucket.index() == 0 and state._pending:  # a step that never reached its last bucket
        state._abandon(RuntimeError(f"{_HOOK}: a new step began before the previous one reached its last bucket"))

    if state.iter < state.start_iter or buf.numel() == 0:
        if last:
            state._step_done()
        if buf.numel() == 0:
            return completed_future(buf, buf.device)
        buf.div_(world)
        state.stats.add(raw=buf.numel() * buf.element_size(), sent=buf.numel() * buf.element_size())
        state._numel[0] += buf.numel()
        state._numel[1] += buf.numel()
        return dist.all_reduce(buf, group=group, async_op=True).get_future().then(lambda _f: buf)

    grads = list(bucket.gradients())
    keys = bucket_keys(bucket)
    if not grads or sum(g.numel() for g in grads) != buf.numel() or len(keys) != len(grads):
        grads, keys = [buf.view(-1)], (("bucket", bucket.index()),)  # no per-tensor view: all uncompressed
    lay = state._layout(keys, grads)
    run = _Run(lay, buf, grads, world)
    try:
        state._issue_p(run)
        older, state._pending = state._pending, [run]
        for r in older:
            state._issue_q(r)
        if last:
            pending, state._pending = state._pending, []
            for r in pending:
                state._issue_q(r)
            state._step_done()
    except BaseException as e:
        if not run.result.done():
            run.result.set_exception(e)
        state._abandon(e)
        raise
    return run.result


# torch's name for the hook (torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook.powerSGD_hook).
powerSGD_hook = powersgd_hook
