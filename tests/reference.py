"""Random inputs per reduce op, and references for reductions: what reducing one tensor per rank
must give, with the error bound a float result may have; the dtypes and reduce ops they cover.
Shared by the CPU collective tests (tests/cpu_collectives_util.py) and the fuzz (tests/fuzz/)."""
import functools

import torch
import torch.distributed as dist

DTYPES = [
    torch.float32, torch.float64, torch.float16, torch.bfloat16,
    torch.int8, torch.uint8, torch.int32, torch.int64, torch.bool,
]
FLOAT_OPS = ["SUM", "AVG", "PRODUCT", "MIN", "MAX", "PREMUL_SUM"]
INT_OPS = ["SUM", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR"]  # also bool

# Machine epsilon (twice the unit roundoff) per float dtype: see reduce_ref.
EPS = {torch.float32: 2.0**-23, torch.float64: 2.0**-52,
       torch.float16: 2.0**-10, torch.bfloat16: 2.0**-7}


def reduce_ref(xs, op, dtype, factor=None):
    """Reference for reducing the tensors `xs` (one per rank) with `op`.

    Returns (ref, bound).  bound None: exact comparison, ref has `dtype`.
    Otherwise ref is float64 and |result - ref| <= bound elementwise.  The
    float bounds are rigorous for any summation order with rounding to the
    dtype after every step (the backend may do better by accumulating
    fp16/bf16 in fp32): W - 1 additions plus the final cast each add at most
    u * sum|x_i| (u = EPS / 2), so W * EPS * sum|x_i| has a factor of 2 to
    spare while still catching a missing or doubled contribution.
    """
    w = len(xs)
    if dtype == torch.bool:
        s = torch.stack([x.to(torch.int64) for x in xs]).sum(0)
        if op in ("SUM", "MAX", "BOR"):
            ref = s > 0
        elif op in ("PRODUCT", "MIN", "BAND"):
            ref = s == w
        elif op == "BXOR":
            ref = s % 2 == 1
        else:
            raise ValueError(op)
        return ref, None
    if not dtype.is_floating_point:
        x = torch.stack([x.to(torch.int64) for x in xs])
        if op == "SUM":
            ref = x.sum(0)
        elif op == "PRODUCT":
            ref = x.prod(0)
        elif op == "MIN":
            ref = x.amin(0)
        elif op == "MAX":
            ref = x.amax(0)
        elif op in ("BAND", "BOR", "BXOR"):
            f = {"BAND": torch.bitwise_and, "BOR": torch.bitwise_or,
                 "BXOR": torch.bitwise_xor}[op]
            ref = functools.reduce(f, list(x))
        else:
            raise ValueError(op)
        return ref.to(dtype), None  # int64 -> int8/uint8 wraps like the backend
    x = torch.stack([x.double() for x in xs])
    eps = EPS[dtype]
    tiny = torch.finfo(dtype).tiny
    absum = x.abs().sum(0)
    if op == "SUM":
        return x.sum(0), w * eps * absum + tiny
    if op == "AVG":  # sum then divide, or divide then sum: both within 2 EPS
        return x.sum(0) / w, 2 * eps * absum + tiny
    if op == "PREMUL_SUM":  # one more rounding if the factor is cast to dtype
        return (x * factor).sum(0), (w + 2) * eps * factor * absum + tiny
    if op == "PRODUCT":
        ref = x.prod(0)
        return ref, (w + 1) * eps * ref.abs() + tiny
    if op == "MIN":
        return x.amin(0).to(dtype), None
    if op == "MAX":
        return x.amax(0).to(dtype), None
    raise ValueError(op)


def dist_op(op, factor=None):
    if op == "PREMUL_SUM":
        return dist._make_nccl_premul_sum(factor)
    return getattr(dist.ReduceOp, op)


# Density of True in bool inputs, so that AND-like and OR-like results are
# not constant over 4 ranks.
BOOL_P = {"PRODUCT": 0.85, "MIN": 0.85, "BAND": 0.85,
          "SUM": 0.15, "MAX": 0.15, "BOR": 0.15}


def gen(dtype, op, shape, seed):
    """Random input for reduce op `op` ("data" for pure data movement)."""
    g = torch.Generator().manual_seed(seed)
    if dtype.is_floating_point:
        if op == "PRODUCT":  # magnitudes near 1: no overflow, no subnormals
            mag = torch.rand(shape, generator=g, dtype=torch.float64) + 0.5
            sign = torch.randint(0, 2, shape, generator=g, dtype=torch.float64) * 2 - 1
            return (mag * sign).to(dtype)
        wide = torch.float64 if dtype == torch.float64 else torch.float32
        return (torch.rand(shape, generator=g, dtype=wide) * 2 - 1).to(dtype)
    if dtype == torch.bool:
        return torch.rand(shape, generator=g) < BOOL_P.get(op, 0.5)
    lo, hi = _int_range(dtype, op)
    return torch.randint(lo, hi, shape, generator=g, dtype=torch.int64).to(dtype)


def _int_range(dtype, op):
    if op == "PRODUCT":
        return (0, 8) if dtype == torch.uint8 else (-7, 8)
    if op == "SUM" and dtype in (torch.int32, torch.int64):
        return -(2**20), 2**20  # no signed overflow in 32/64-bit sums
    if dtype == torch.int64:
        return -(2**62), 2**62
    info = torch.iinfo(dtype)  # int8/uint8 sums and products wrap: compared modulo 2^8
    return info.min, info.max + 1


def name(dtype):
    return str(dtype).replace("torch.", "")


def filler(dtype, shape):
    """Recognisable junk for outputs (never a valid result of a reduction
    of our inputs for floats, and rarely for ints)."""
    if dtype == torch.bool:
        return torch.zeros(shape, dtype=dtype)
    if dtype.is_floating_point:
        return torch.full(shape, 123.0 if dtype != torch.float16 else 77.0, dtype=dtype)
    return torch.full(shape, 99, dtype=dtype)
