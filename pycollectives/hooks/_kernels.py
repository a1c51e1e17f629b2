"""The compression kernels: native (``pycollectives._C``) when built, plain torch otherwise.

Each public function here calls ``pycollectives._C.<name>`` when the extension
has it and falls back to the ``ref_<name>`` implementation below, which is
also the reference the native kernels are tested against
(tests/test_compression_kernels.py). ``PYCOLL_COMPRESSION_NATIVE=0`` forces
the torch path (to compare, or to rule the kernels out).

Layouts (the same in C++, CUDA and here; see csrc/cpu/kernels/compression.h):

* packed signs: int32 words, element ``i`` is bit ``i % 32`` (LSB first) of
  word ``i // 32``; the bit is 1 when the element is negative (``x < 0``), so
  sign(0), sign(-0.0) and sign(NaN) count as +. Bits past the end are 0.
* majority vote: ``scale * sign(#ranks voting + minus #ranks voting -)``, 0 on
  a tie (only possible for an even world size).
* Gram-Schmidt: modified Gram-Schmidt on the columns of each ``[n, r]``
  matrix, ``col_i /= |col_i| + eps`` then ``col_j -= <col_i, col_j> col_i``
  for ``j > i``; an all-zero column stays 0.
"""
from __future__ import annotations

from typing import List, Optional, Sequence

import torch

from ..package_settings import COMPRESSION_NATIVE

try:
    from .. import _C as _native_module
except ImportError:  # pragma: no cover - the package needs _C anyway
    _native_module = None

__all__ = [
    "native_available", "pack_signs", "unpack_signs", "majority_vote", "batched_orthogonalize_",
    "flatten_into", "unflatten_from", "sign_words",
    "ref_pack_signs", "ref_unpack_signs", "ref_majority_vote", "ref_batched_orthogonalize_",
    "ref_flatten_into", "ref_unflatten_from",
    "signsgd_fast_path", "signsgd_encode_", "signsgd_sub_signs_", "majority_vote_segments",
    "ref_signsgd_encode_", "ref_signsgd_sub_signs_", "ref_majority_vote_segments",
]

_NAMES = ("pack_signs", "unpack_signs", "majority_vote", "batched_orthogonalize_", "flatten_into", "unflatten_from")
_FLOATS = (torch.float32, torch.float64, torch.float16, torch.bfloat16)


def _native(name):
    if COMPRESSION_NATIVE.get() == "0" or _native_module is None:
        return None
    return getattr(_native_module, name, None)


def native_available() -> bool:
    """True when the extension provides every compression kernel (after the rebuild)."""
    return all(_native(n) is not None for n in _NAMES)


def _native_for(name: str, *tensors: torch.Tensor):
    """The native function, unless it cannot take these tensors (CUDA tensors, CPU-only build)."""
    fn = _native(name)
    if fn is None:
        return None
    if any(t.is_cuda for t in tensors) and not _native_module.built_with_cuda():
        return None
    if any(not (t.is_cuda or t.is_cpu) for t in tensors):
        return None
    return fn


def sign_words(numel: int) -> int:
    return (int(numel) + 31) // 32


# ---------------------------------------------------------------------------
# plain-torch reference implementations (argument checks mirror the native ones)

_SHIFTS = {}


def _shifts(device) -> torch.Tensor:
    s = _SHIFTS.get(device)
    if s is None:
        s = torch.arange(32, dtype=torch.int32, device=device)
        _SHIFTS[device] = s
    return s


def _check_floating(t: torch.Tensor, op: str, arg: str) -> None:
    if t.dtype not in _FLOATS:
        raise TypeError(f"{op}: {arg} must be float32, float64, float16 or bfloat16, got {t.dtype}")


def _check_words(t: torch.Tensor, op: str, arg: str) -> None:
    if t.dtype != torch.int32:
        raise TypeError(f"{op}: {arg} must be int32 (packed sign words), got {t.dtype}")


def _validate_pack(tensor: torch.Tensor) -> None:
    _check_floating(tensor, "pycoll::pack_signs", "tensor")


def ref_pack_signs(tensor: torch.Tensor) -> torch.Tensor:
    _validate_pack(tensor)
    flat = tensor.reshape(-1)
    n = flat.numel()
    words = sign_words(n)
    neg = torch.zeros(words * 32, dtype=torch.int32, device=flat.device)
    neg[:n] = (flat < 0).to(torch.int32)
    # Distinct bits: their int32 sum is their OR (bit 31 wraps to the sign, as in C).
    return (neg.view(words, 32) << _shifts(flat.device)).sum(dim=1, dtype=torch.int32)


def _bits(packed_rows: torch.Tensor, numel: int) -> torch.Tensor:
    """[..., words] int32 -> [..., numel] int32 bits."""
    words = sign_words(numel)
    w = packed_rows[..., :words]
    bits = (w.unsqueeze(-1) >> _shifts(w.device)) & 1  # arithmetic shift; & 1 keeps the one bit
    return bits.reshape(*w.shape[:-1], words * 32)[..., :numel]


def _validate_unpack(packed: torch.Tensor, numel: int) -> None:
    op = "pycoll::unpack_signs"
    _check_words(packed, op, "packed")
    if packed.dim() != 1:
        raise ValueError(f"{op}: packed must be 1-D, got shape {tuple(packed.shape)}")
    if numel < 0:
        raise ValueError(f"{op}: numel must be >= 0, got {numel}")
    if packed.numel() < sign_words(numel):
        raise ValueError(f"{op}: packed has {packed.numel()} words, numel {numel} needs {sign_words(numel)}")


def _validate_out(out: Optional[torch.Tensor], like: torch.Tensor, numel: int, op: str) -> None:
    if out is None:
        return
    if out.dtype != torch.float32:
        raise TypeError(f"{op}: out must be float32, got {out.dtype}")
    if out.device != like.device:
        raise ValueError(f"{op}: out is on {out.device}, the words on {like.device}")
    if not out.is_contiguous() or out.numel() != numel:
        raise ValueError(f"{op}: out must be contiguous with {numel} elements, got shape {tuple(out.shape)}")


def _result(values: torch.Tensor, out: Optional[torch.Tensor]) -> torch.Tensor:
    if out is None:
        return values
    out.view(-1).copy_(values)
    return out


def ref_unpack_signs(packed: torch.Tensor, numel: int, scale: float = 1.0,
                     out: Optional[torch.Tensor] = None) -> torch.Tensor:
    _validate_unpack(packed, numel)
    _validate_out(out, packed, numel, "pycoll::unpack_signs")
    bits = _bits(packed, numel)
    return _result((1 - 2 * bits).to(torch.float32) * float(scale), out)


def _validate_vote(gathered: torch.Tensor, numel: int) -> None:
    op = "pycoll::majority_vote"
    _check_words(gathered, op, "gathered")
    if gathered.dim() != 2:
        raise ValueError(f"{op}: gathered must be [world, words], got shape {tuple(gathered.shape)}")
    if gathered.shape[0] < 1:
        raise ValueError(f"{op}: gathered must hold at least one rank's words")
    if numel < 0:
        raise ValueError(f"{op}: numel must be >= 0, got {numel}")
    if gathered.shape[1] < sign_words(numel):
        raise ValueError(f"{op}: gathered rows have {gathered.shape[1]} words, numel {numel} needs {sign_words(numel)}")


def ref_majority_vote(gathered: torch.Tensor, numel: int, scale: float = 1.0,
                      out: Optional[torch.Tensor] = None) -> torch.Tensor:
    _validate_vote(gathered, numel)
    _validate_out(out, gathered, numel, "pycoll::majority_vote")
    world = gathered.shape[0]
    neg = _bits(gathered, numel).sum(dim=0)  # ranks voting "-"
    return _result(torch.sign(world - 2 * neg).to(torch.float32) * float(scale), out)


def _validate_orthogonalize(matrices: torch.Tensor, eps: float) -> None:
    op = "pycoll::batched_orthogonalize_"
    _check_floating(matrices, op, "matrices")
    if matrices.dim() != 3:
        raise ValueError(f"{op}: matrices must be [batch, n, r], got shape {tuple(matrices.shape)}")
    if matrices.shape[2] > matrices.shape[1]:
        raise ValueError(f"{op}: matrices need r <= n (columns to orthogonalise), got shape {tuple(matrices.shape)}")
    if eps < 0:
        raise ValueError(f"{op}: eps must be >= 0, got {eps}")


def ref_batched_orthogonalize_(matrices: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    _validate_orthogonalize(matrices, eps)
    r = matrices.shape[2]
    for i in range(r):
        col = matrices[:, :, i : i + 1]
        norm = torch.linalg.vector_norm(col, dim=1, keepdim=True)
        inv = torch.where(norm > 0, 1.0 / (norm + eps), torch.zeros_like(norm))
        col.mul_(inv)
        if i + 1 < r:
            rest = matrices[:, :, i + 1 :]
            rest.sub_(torch.sum(col * rest, dim=1, keepdim=True) * col)
    return matrices


def _check_bucket_args(tensors: Sequence[torch.Tensor], bucket: torch.Tensor, op: str) -> None:
    if not bucket.is_contiguous():
        raise ValueError(f"{op}: bucket must be contiguous")
    total = 0
    for i, t in enumerate(tensors):
        if t.dtype != bucket.dtype:
            raise TypeError(f"{op}: tensors[{i}] is {t.dtype}, the bucket is {bucket.dtype} (all must match)")
        if t.device != bucket.device:
            raise ValueError(f"{op}: tensors[{i}] is on {t.device}, the bucket on {bucket.device}")
        total += t.numel()
    if total > bucket.numel():
        raise ValueError(f"{op}: the tensors hold {total} elements, the bucket only {bucket.numel()}")


def ref_flatten_into(tensors: Sequence[torch.Tensor], bucket: torch.Tensor) -> None:
    _check_bucket_args(tensors, bucket, "pycoll::flatten_into")
    flat = bucket.view(-1)
    off = 0
    for t in tensors:
        n = t.numel()
        flat[off : off + n].view(t.shape).copy_(t)
        off += n


def ref_unflatten_from(bucket: torch.Tensor, tensors: Sequence[torch.Tensor]) -> None:
    _check_bucket_args(tensors, bucket, "pycoll::unflatten_from")
    flat = bucket.view(-1)
    off = 0
    for t in tensors:
        n = t.numel()
        t.copy_(flat[off : off + n].view(t.shape))
        off += n


# ---------------------------------------------------------------------------
# dispatch: native when present (and able to take the tensors), else reference


# The arguments are checked here, in Python, before a native call, with the
# same messages as the native checks (which stay as a second line).


def pack_signs(tensor: torch.Tensor) -> torch.Tensor:
    _validate_pack(tensor)
    fn = _native_for("pack_signs", tensor)
    return fn(tensor) if fn is not None else ref_pack_signs(tensor)


def unpack_signs(packed: torch.Tensor, numel: int, scale: float = 1.0,
                 out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """float32 [numel] of +-scale; written into `out` (contiguous float32 [numel]) when given."""
    _validate_unpack(packed, numel)
    _validate_out(out, packed, numel, "pycoll::unpack_signs")
    fn = _native_for("unpack_signs", packed)
    if fn is None:
        return ref_unpack_signs(packed, numel, scale, out)
    return fn(packed, int(numel), float(scale), out)


def majority_vote(gathered: torch.Tensor, numel: int, scale: float = 1.0,
                  out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """float32 [numel] of {-scale, 0, +scale}; written into `out` (contiguous float32 [numel]) when given."""
    _validate_vote(gathered, numel)
    _validate_out(out, gathered, numel, "pycoll::majority_vote")
    fn = _native_for("majority_vote", gathered)
    if fn is None:
        return ref_majority_vote(gathered, numel, scale, out)
    return fn(gathered, int(numel), float(scale), out)


def batched_orthogonalize_(matrices: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    _validate_orthogonalize(matrices, eps)
    fn = _native_for("batched_orthogonalize_", matrices)
    if fn is None:
        return ref_batched_orthogonalize_(matrices, eps)
    fn(matrices, float(eps))
    return matrices


def flatten_into(tensors: List[torch.Tensor], bucket: torch.Tensor) -> None:
    _check_bucket_args(tensors, bucket, "pycoll::flatten_into")
    fn = _native_for("flatten_into", bucket)
    (fn if fn is not None else ref_flatten_into)(list(tensors), bucket)


def unflatten_from(bucket: torch.Tensor, tensors: List[torch.Tensor]) -> None:
    _check_bucket_args(tensors, bucket, "pycoll::unflatten_from")
    fn = _native_for("unflatten_from", bucket)
    (fn if fn is not None else ref_unflatten_from)(bucket, list(tensors))


# ---------------------------------------------------------------------------
# the signSGD hook's CPU fast path: float32 buckets on the CPU, in segments (ends: cumulative
# segment ends, ends[-1] == numel; one scale per segment). Each native function does in one pass
# what its ref_ composition does in two or three; the ref_ versions are the references of the tests.

_FAST = ("signsgd_encode_", "signsgd_sub_signs_", "majority_vote_segments")


def signsgd_fast_path(t: torch.Tensor) -> bool:
    """True when the fused native CPU kernels can take this bucket."""
    return (t.is_cpu and t.dtype == torch.float32 and t.dim() == 1 and t.is_contiguous()
            and all(_native(n) is not None for n in _FAST))


def _segments(ends: Sequence[int]) -> List[int]:
    out, prev = [], 0
    for e in ends:
        out.append(int(e) - prev)
        prev = int(e)
    return out


def ref_signsgd_encode_(e: torch.Tensor, g: Optional[torch.Tensor], ends: Sequence[int]):
    if g is not None:
        e.add_(g)
    words = pack_signs(e)
    l1 = torch.stack([torch.linalg.vector_norm(seg, ord=1, dtype=torch.float64)
                      for seg in e.split(_segments(ends))])
    return words, l1


def signsgd_encode_(e: torch.Tensor, g: Optional[torch.Tensor], ends: Sequence[int]):
    """e += g (g may be None); returns (sign words of e, float64 L1 norm of each segment of e)."""
    fn = _native("signsgd_encode_") if signsgd_fast_path(e) and (g is None or signsgd_fast_path(g)) else None
    if fn is not None:
        return fn(e, g, [int(x) for x in ends])
    return ref_signsgd_encode_(e, g, ends)


def ref_signsgd_sub_signs_(e: torch.Tensor, words: torch.Tensor, ends: Sequence[int], scales: torch.Tensor) -> None:
    sgn = unpack_signs(words, e.numel(), 1.0)
    for seg, sg, sc in zip(e.split(_segments(ends)), sgn.split(_segments(ends)), scales):
        seg.addcmul_(sg, sc, value=-1.0)


def signsgd_sub_signs_(e: torch.Tensor, words: torch.Tensor, ends: Sequence[int], scales: torch.Tensor) -> None:
    """e -= scales[segment] * sign, the signs read from the words (error feedback's residual)."""
    fn = _native("signsgd_sub_signs_") if signsgd_fast_path(e) else None
    if fn is not None:
        fn(e, words, [int(x) for x in ends], scales)
    else:
        ref_signsgd_sub_signs_(e, words, ends, scales)


def ref_majority_vote_segments(gathered: torch.Tensor, numel: int, ends: Sequence[int], scales: torch.Tensor,
                               out: torch.Tensor) -> torch.Tensor:
    vote = majority_vote(gathered, numel, 1.0, out=out)
    for seg, sc in zip(vote.split(_segments(ends)), scales):
        seg.mul_(sc)
    return vote


def majority_vote_segments(gathered: torch.Tensor, numel: int, ends: Sequence[int], scales: torch.Tensor,
                           out: torch.Tensor) -> torch.Tensor:
    """majority_vote into out, each segment times its scale."""
    fn = _native("majority_vote_segments") if signsgd_fast_path(out) else None
    if fn is not None:
        return fn(gathered, numel, [int(x) for x in ends], scales, out)
    return ref_majority_vote_segments(gathered, numel, ends, scales, out)
