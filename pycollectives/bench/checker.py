"""Known per-rank inputs and the plain-torch reference result of every collective.

Every rank can build every other rank's input from (rank, element index), so the reference is
computed locally, without communication.  Inputs are small integers (|v| <= 4, products of +-1
and at most a few 2s) so that sums, products, minima and maxima are exact in every dtype,
including float16, bfloat16 and int8, for world sizes up to 32; only ``avg`` rounds, and is
compared with a tolerance that fits the dtype.
"""
import torch

# name -> dtype; aliases map onto these names (see DTYPE_ALIASES).
DTYPES = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float64": torch.float64,
    "int32": torch.int32,
    "int64": torch.int64,
    "int8": torch.int8,
    "uint8": torch.uint8,
}
DTYPE_ALIASES = {
    "float": "float32", "fp32": "float32", "f32": "float32",
    "half": "float16", "fp16": "float16", "f16": "float16",
    "bf16": "bfloat16",
    "double": "float64", "fp64": "float64", "f64": "float64",
    "int": "int32", "i32": "int32",
    "long": "int64", "i64": "int64",
    "i8": "int8", "char": "int8",
    "u8": "uint8", "byte": "uint8",
}
REDUCE_OPS = ("sum", "avg", "prod", "min", "max")

# (rtol, atol) for results that may round (avg); exact results are compared exactly.
TOLERANCE = {
    torch.float64: (1e-12, 1e-12),
    torch.float32: (1e-5, 1e-5),
    torch.float16: (4e-3, 4e-3),
    torch.bfloat16: (3e-2, 3e-2),
}
# Written into buffers the collective is supposed to overwrite (in-place all_gather).
SENTINEL = 77


def resolve_dtype(name):
    """torch dtype for a name or alias; KeyError if unknown."""
    key = name.strip().lower()
    key = DTYPE_ALIASES.get(key, key)
    return key, DTYPES[key]


def pattern(rank, start, count, dtype, device, reduce_op="sum"):
    """Input of ``rank`` at element indices [start, start + count).

    A hash of (index, rank) picks a small value: -4..4 (0..4 for uint8); for ``prod`` +-1
    (1 for uint8) with a 2 wherever index % 8 == rank % 8, so that a product over the ranks
    stays a small power of two."""
    idx = torch.arange(start, start + count, dtype=torch.int64, device=device)
    h = ((idx * 1103515245 + (rank + 1) * 2654435761 + 12345) % 2147483648) // 65536
    signed = dtype != torch.uint8
    if reduce_op == "prod":
        v = (1 - 2 * (h % 2)) if signed else torch.ones_like(h)
        v = torch.where(idx % 8 == rank % 8, v * 2, v)
    else:
        v = (h % 9 - 4) if signed else (h % 5)
    return v.to(dtype)


def _reduce(values, reduce_op, world):
    """Element-wise reduction of an iterable of tensors, in float64 / int64."""
    acc = None
    for v in values:
        wide = v.to(torch.float64 if v.is_floating_point() else torch.int64)
        if acc is None:
            acc = wide.clone()
        elif reduce_op in ("sum", "avg"):
            acc += wide
        elif reduce_op == "prod":
            acc *= wide
        elif reduce_op == "min":
            torch.minimum(acc, wide, out=acc)
        elif reduce_op == "max":
            torch.maximum(acc, wide, out=acc)
        else:
            raise ValueError(f"unknown reduce op {reduce_op!r}")
    if reduce_op == "avg":
        acc /= world
    return acc


def expected(op, rank, world, numel, dtype, device, reduce_op="sum", root=0):
    """Reference result on ``rank`` for collective ``op`` whose largest buffer has ``numel``
    elements, or None where the op defines no result on this rank (reduce off the root)."""
    chunk = numel // world
    if op == "all_reduce":
        ref = _reduce((pattern(j, 0, numel, dtype, device, reduce_op) for j in range(world)), reduce_op, world)
    elif op == "reduce":
        if rank != root:
            return None
        ref = _reduce((pattern(j, 0, numel, dtype, device, reduce_op) for j in range(world)), reduce_op, world)
    elif op == "broadcast":
        ref = pattern(root, 0, numel, dtype, device, reduce_op)
    elif op == "all_gather":
        ref = torch.cat([pattern(j, 0, chunk, dtype, device, reduce_op) for j in range(world)])
    elif op == "reduce_scatter":
        ref = _reduce((pattern(j, rank * chunk, chunk, dtype, device, reduce_op) for j in range(world)),
                      reduce_op, world)
    elif op == "all_to_all":
        ref = torch.cat([pattern(j, rank * chunk, chunk, dtype, device, reduce_op) for j in range(world)])
    elif op == "sendrecv":
        ref = pattern((rank - 1) % world, 0, numel, dtype, device, reduce_op)
    elif op == "pingpong":
        if rank > 1:
            return None
        ref = pattern(0, 0, numel, dtype, device, reduce_op)  # rank 0's buffer, there and back
    elif op == "send":
        if rank % 2 == 0:
            return None  # a sender (or the idle last rank of an odd world) receives nothing
        ref = pattern(rank - 1, 0, numel, dtype, device, reduce_op)
    else:
        raise ValueError(f"unknown collective {op!r}")
    return ref.to(dtype)


def compare(actual, reference, exact=True):
    """None when ``actual`` matches ``reference``, else a message naming the first mismatch.

    ``exact`` compares bit for bit (integer results and every float result built from small
    integers); otherwise floats are compared with the dtype's tolerance (avg)."""
    if reference is None:
        return None
    if actual.shape != reference.shape or actual.dtype != reference.dtype:
        return (f"result has shape {tuple(actual.shape)} and dtype {actual.dtype}, "
                f"expected {tuple(reference.shape)} and {reference.dtype}")
    if actual.numel() == 0:
        return None
    if exact or not reference.is_floating_point():
        bad = actual != reference
        if reference.is_floating_point():
            bad |= torch.isnan(actual)
    else:
        rtol, atol = TOLERANCE[reference.dtype]
        bad = ~torch.isclose(actual.double(), reference.double(), rtol=rtol, atol=atol)
    nbad = int(bad.sum())
    if nbad == 0:
        return None
    i = int(bad.nonzero()[0, 0])
    return (f"{nbad} of {reference.numel()} elements differ; first at index {i}: "
            f"got {actual[i].item()!r}, expected {reference[i].item()!r}")


def result_is_exact(reduce_op):
    """Whether the reference is exact (bitwise comparison) for this reduce op."""
    return reduce_op != "avg"
