"""The wait for one Store key per rank (csrc/common/store_wait.h), which the CUDA engine's start
uses: on timeout the error names the ranks whose key never came, after the timeout given and not
before; a key that comes late but in time ends the wait. Every kind of Store torch has, since
they report a timeout with different exception types. The CUDA engine's use of it (a send as a
group's first op) is in test_gpu_errors.py."""
import datetime
import threading
import time

import pytest
import torch.distributed as dist

pytestmark = pytest.mark.pycoll_only

TIMEOUT_MS = 400


def _wait(store, keys, timeout_ms):
    from pycollectives import _C

    _C._test_wait_for_every_rank(store, keys, timeout_ms)


@pytest.fixture(params=["hash", "file", "tcp", "prefix"])
def stores(request, tmp_path):
    """Two handles on one store: what the waiting rank holds and what a peer sets keys through
    (a TCPStore client serves one request at a time, so a peer needs its own connection)."""
    if request.param == "hash":
        store = dist.HashStore()
        return store, store
    if request.param == "file":
        path = str(tmp_path / "store")
        return dist.FileStore(path, 2), dist.FileStore(path, 2)
    tcp = dist.TCPStore("127.0.0.1", 0, 2, is_master=True, wait_for_workers=False,
                        timeout=datetime.timedelta(seconds=30))
    peer = dist.TCPStore("127.0.0.1", tcp.port, 2, is_master=False, timeout=datetime.timedelta(seconds=30))
    if request.param == "tcp":
        return tcp, peer
    return dist.PrefixStore("group/", tcp), dist.PrefixStore("group/", peer)


@pytest.fixture
def store(stores):
    return stores[0]


@pytest.mark.parametrize("present, missing_text", [
    ((0, 2), "ranks 1, 3 of 4"),
    ((0, 1, 3), "rank 2 of 4"),
    ((), "ranks 0, 1, 2, 3 of 4"),
])
def test_timeout_names_the_ranks_that_never_came(store, present, missing_text):
    keys = [f"engine/settings/{r}" for r in range(4)]
    for r in present:
        store.set(keys[r], "x")
    t0 = time.monotonic()
    with pytest.raises(dist.DistBackendError) as err:
        _wait(store, keys, TIMEOUT_MS)
    assert TIMEOUT_MS / 1000 * 0.9 <= time.monotonic() - t0 < 10
    text = str(err.value)
    assert (f"pycoll: test wait: {missing_text} did not arrive within the group's timeout ({TIMEOUT_MS} ms). "
            "(the reason)") in text, text


def test_a_key_that_comes_in_time_ends_the_wait(stores):
    store, peer = stores
    keys = [f"engine/settings/{r}" for r in range(3)]
    store.set(keys[0], "x")
    store.set(keys[2], "x")
    late = threading.Timer(0.3, peer.set, args=(keys[1], "x"))
    late.start()
    t0 = time.monotonic()
    try:
        _wait(store, keys, 20_000)
    finally:
        late.join()
    assert 0.25 <= time.monotonic() - t0 < 10
