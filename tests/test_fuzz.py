"""Random op sequences on pycoll, every op checked against Gloo (issue 21, item 7).

Each world size runs one seeded sequence (tests/fuzz/): every collective,
point-to-point and coalesced form, every dtype and reduce op, sizes from 0 to
about 1 MiB, non-contiguous tensors, sync and async ops waited in a random
order, on four interleaved groups (the default group, a second group over the
same ranks, and subgroups), each with a Gloo twin that computes the reference.

    PYCOLL_FUZZ_SEED=1234 PYCOLL_FUZZ_OPS=2000 pytest -q tests/test_fuzz.py

The seed defaults to the session seed (PYCOLL_TEST_SEED, printed in the
header); a failure names the seed, the op index and the op.  A long run with
resource checks: ``make soak`` (benchmarks/soak.py).
"""

import os
import time

import pytest

from fuzz import fuzz_rank, summarize
from ranks import run_ranks

# 30-60 s for the three on the 2-core CI machine (about 2-4, 4-7 and 7-10 ms per op).
OPS = {2: 3000, 3: 2000, 4: 1500}


@pytest.mark.pycoll_only  # the reference is Gloo
@pytest.mark.parametrize("world_size", [2, 3, 4], ids=lambda ws: f"ws{ws}")
def test_fuzz(world_size, seed):
    fuzz_seed = int(os.environ.get("PYCOLL_FUZZ_SEED", seed))
    n_ops = int(os.environ.get("PYCOLL_FUZZ_OPS", OPS[world_size]))
    t0 = time.monotonic()
    try:
        out = run_ranks(world_size, fuzz_rank, fuzz_seed, n_ops, timeout=60 + 0.05 * n_ops)
    except Exception as e:
        raise AssertionError(
            f"fuzz failed: seed={fuzz_seed} ops={n_ops} world_size={world_size} "
            f"(PYCOLL_FUZZ_SEED={fuzz_seed} PYCOLL_FUZZ_OPS={n_ops} "
            f"pytest tests/test_fuzz.py -k ws{world_size})\n{e}") from None
    print(summarize(out, fuzz_seed, n_ops, world_size, time.monotonic() - t0))
