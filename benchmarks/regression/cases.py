"""The regression cases: what is timed, at which sizes, with which algorithm.

A case is a plain dict (it travels to the rank processes): ``name`` (stable: comparisons key on
it), ``kind`` (collective, ddp, compression), and for collectives ``op`` (a pycoll-bench op name),
``bytes`` and ``algo`` (None: the library's ``auto``).
"""
import fnmatch

MiB = 1 << 20
KiB = 1 << 10

CPU_SIZES = (8, 64 * KiB, 1 * MiB, 16 * MiB)
GPU_SIZES = (8, 64 * KiB, 1 * MiB, 16 * MiB, 256 * MiB)
GPU_COMPARE_EXTRA = (4 * MiB, 32 * MiB, 64 * MiB, 1024 * MiB)  # make bench-compare on GPUs also covers these

OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "sendrecv", "all_to_all")
# Algorithms a user can force (pycollectives.set_algo), per engine and op, besides auto: those
# that run something else than auto might (the CUDA broadcast has one algorithm; its all_gather and
# reduce_scatter have ring and direct, which set_algo names oneshot).
FORCED_ALGOS = {
    "cpu": {
        "all_reduce": ("ring", "tree", "oneshot", "twoshot"),
        "all_gather": ("ring", "oneshot"),
        "reduce_scatter": ("ring", "twoshot"),
        "broadcast": ("tree", "oneshot"),
    },
    "cuda": {
        "all_reduce": ("ring", "tree", "oneshot", "twoshot"),
        "all_gather": ("ring", "oneshot"),
        "reduce_scatter": ("ring", "oneshot"),
    },
}
SPLIT_OPS = ("all_gather", "reduce_scatter", "all_to_all")  # the buffer is cut into world chunks
ELEM = 4  # float32


def size_label(nbytes):
    if nbytes >= MiB and nbytes % MiB == 0:
        return f"{nbytes // MiB}MiB"
    if nbytes >= KiB and nbytes % KiB == 0:
        return f"{nbytes // KiB}KiB"
    return f"{nbytes}B"


def _fits(op, nbytes, world):
    count, rem = divmod(nbytes, ELEM)
    return rem == 0 and (op not in SPLIT_OPS or count % world == 0)


def build_cases(device, world, compare=False, pattern=None):
    """Every case for `device` ("cpu" or "cuda") on `world` ranks, in a fixed order."""
    sizes = list(GPU_SIZES if device == "cuda" else CPU_SIZES)
    if compare and device == "cuda":
        sizes = sorted(set(sizes) | set(GPU_COMPARE_EXTRA))
    cases = []
    for op in OPS:
        for nbytes in sizes:
            if not _fits(op, nbytes, world):
                continue
            for algo in (None,) + FORCED_ALGOS[device].get(op, ()):
                name = f"{op}-{size_label(nbytes)}" + (f"-{algo}" if algo else "")
                cases.append(dict(name=name, kind="collective", op=op, bytes=nbytes, algo=algo))
    cases.append(dict(name="ddp-step", kind="ddp"))
    cases.append(dict(name="signsgd-1MiB", kind="compression", method="signsgd", bytes=1 * MiB))
    cases.append(dict(name="powersgd-1MiB", kind="compression", method="powersgd", bytes=1 * MiB))
    if pattern:
        pats = [p.strip() for p in pattern.split(",") if p.strip()]
        cases = [c for c in cases if any(fnmatch.fnmatch(c["name"], p) for p in pats)]
    return cases


def case_op(case):
    """What a delay injected "around an op" matches: the collective's op name, else the kind."""
    return case.get("op") or case.get("method") or case["kind"]
