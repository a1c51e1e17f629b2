"""The engines' wait for one Store key per rank (csrc/engines/wait_for_ranks.h): on timeout the
error names the ranks whose key never came, in the group's terms, within the timeout given.
The CUDA engine's use of it (a send as a group's first op) is in test_gpu_errors.py."""
import time

import pytest
import torch.distributed as dist

pytestmark = pytest.mark.pycoll_only


def _wait(store, keys, timeout_ms):
    from pycollectives import _C

    _C._test_wait_for_every_rank(store, keys, timeout_ms)


@pytest.mark.parametrize("present, missing_text", [
    ((0, 2), "ranks 1, 3 of this group of 4"),
    ((0, 1, 3), "rank 2 of this group of 4"),
    ((), "ranks 0, 1, 2, 3 of this group of 4"),
])
def test_timeout_names_the_ranks_that_never_came(present, missing_text):
    store = dist.HashStore()
    keys = [f"engine/settings/{r}" for r in range(4)]
    for r in present:
        store.set(keys[r], "x")
    t0 = time.monotonic()
    with pytest.raises(dist.DistBackendError) as err:
        _wait(store, keys, 300)
    assert time.monotonic() - t0 < 5
    text = str(err.value)
    assert f"pycoll: test wait: {missing_text} did not arrive within the group's timeout (300 ms). (the reason)" \
        in text, text


def test_returns_once_every_rank_has_come():
    store = dist.HashStore()
    keys = [f"engine/settings/{r}" for r in range(3)]
    for k in keys:
        store.set(k, "x")
    t0 = time.monotonic()
    _wait(store, keys, 10_000)
    assert time.monotonic() - t0 < 5
