"""Seeded random sequences of torch.distributed ops on pycoll, each checked
against the same op on Gloo.

Shared by tests/test_fuzz.py (1,500-3,000 ops per world size, in CI),
tests/test_gpu_fuzz.py (the same with pycoll's tensors on the GPUs) and
benchmarks/soak.py (``make soak``: 100,000 ops with resource checks).

The package: core.py (the Fuzzer: the sequence, shared draws, checks against
Gloo), the ops by family as mixins of it (reductions.py, data_movement.py,
point_to_point.py, coalesced.py), tensors.py (layouts, comparisons),
groups.py (the pycoll groups and their Gloo twins) and entry_points.py (what
the ranks run: fuzz_rank, soak_rank).

Every rank draws the same sequence from ``random.Random(seed)``: the op, the
group, dtype, reduce op, sizes, layouts, roots, split matrices, async or not,
and when (and in which order) pending async work is waited.  Tensor contents
are rank-specific (a torch.Generator seeded from seed, op index, rank).

Device: CPU by default; in CUDA mode (Fuzzer(device="cuda:<rank>"),
fuzz_rank(..., device="cuda")) every tensor handed to pycoll (inputs, outputs,
strided views and the buffers around them, point-to-point and coalesced
tensors) is on the rank's GPU, made from the same CPU-generated values; the
Gloo twins and torch references use CPU copies, and every comparison is made
on CPU.  The device takes no draw: a seed runs the same ops on CPU and GPU.

Groups: the default pycoll group ("world"), a second pycoll group over the
same ranks ("dup"), a pycoll group of ranks 1.. ("sub"), and for 3+ ranks
{0, ws-1} ("pair"); each has a Gloo twin over the same ranks.  A rank that is
not in an op's group draws the op's parameters like the others and skips it.

Reference, per op: the same op on the Gloo twin with contiguous copies of the
same inputs, run just before pycoll's.  Where Gloo lacks something
(PREMUL_SUM; all_to_all with uneven lists) the reference is a plain torch
computation on the inputs all_gathered through the Gloo twin.  Integers, bools,
MIN/MAX and data movement are compared exactly (bools by value: Gloo's bool SUM
leaves bytes > 1, pycoll's must be 0/1); float SUM/AVG/PRODUCT/PREMUL_SUM are
compared with a float64 reference computed from the gathered inputs, within the
bound of reduce_ref in tests/reference.py (rigorous for any summation order with
rounding to the dtype at each step), and with Gloo's result within twice that
bound.  Every all_reduce result (plain and coalesced) must also be bitwise
identical on every rank of the group (all_gathered through Gloo).

A mismatch is recorded with the seed, op index and op description, and the
sequence goes on (every rank keeps issuing the same ops); an exception is
re-raised at once with the same context.
"""

from .core import ALGOS, KINDS, Fuzzer, FuzzError
from .entry_points import SHM_DIR, SHM_PREFIX, fuzz_rank, soak_rank, summarize, usage

__all__ = ["ALGOS", "KINDS", "Fuzzer", "FuzzError", "SHM_DIR", "SHM_PREFIX", "fuzz_rank", "soak_rank",
           "summarize", "usage"]
