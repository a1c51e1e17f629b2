"""Errors on the CUDA engine: bad arguments raise, ranks that call different collectives or start
with different settings get an error naming both sides instead of garbage or a timeout, and a
group whose engine cannot start says which ranks never came.
"""
import datetime
import os
import time

import pytest
import torch
import torch.distributed as dist

from gpu_collectives_util import (GPU_MARKS, GPUS, PG_TIMEOUT, WORLD, R, mismatch_message, run_as_script, run_bound,
                                  setup_device)
from ranks import run_ranks, set_algo

pytestmark = GPU_MARKS


# ---------------------------------------------------------------------------------------------
# bad input


def _bad_input(rank, world, seed):
    dev = setup_device(rank)
    gpus = torch.cuda.device_count()
    other = torch.device("cuda", (dev.index + 1) % gpus)
    checks = []

    def expect_error(fn, what):
        try:
            fn()
        except (RuntimeError, ValueError, TypeError):
            checks.append(what)
            return
        raise AssertionError(f"{what}: no error raised")

    t = torch.ones(16, device=dev)
    # A tensor on another GPU, once the group is bound to this rank's (by its first op); none with one GPU.
    dist.all_reduce(t.clone())
    if gpus > 1:
        expect_error(lambda: dist.all_reduce(torch.ones(16, device=other)), "wrong device")
    # all_gather output of the wrong size / dtype.
    expect_error(lambda: dist.all_gather_into_tensor(torch.empty((world + 1) * 16, device=dev), t), "all_gather size")
    expect_error(lambda: dist.all_gather_into_tensor(torch.empty(2 * 16, device=dev, dtype=torch.float16), t),
                 "all_gather dtype")
    # reduce_scatter input of the wrong size.
    expect_error(lambda: dist.reduce_scatter_tensor(torch.empty(16, device=dev), torch.ones(31, device=dev)),
                 "reduce_scatter size")
    # Bitwise op on floats.
    expect_error(lambda: dist.all_reduce(t.clone(), op=R.BAND), "bitwise on float")
    # The group still works afterwards.
    x = torch.full((33,), float(rank + 1), device=dev)
    dist.all_reduce(x)
    assert torch.all(x == world * (world + 1) / 2)
    return checks


def test_bad_input_raises(seed):
    out = run_ranks(WORLD, _bad_input, seed, timeout=120, pg_timeout=PG_TIMEOUT)
    assert all(len(checks) == (5 if GPUS > 1 else 4) for checks in out), out


def _mismatch(rank, world, seed):
    """Ranks that call a collective with different sizes or roots get an error naming both calls
    (the check word every message carries), not garbage and not a timeout. Each case breaks its
    group for good, so each gets a fresh one."""
    dev = setup_device(rank)
    last = world - 1
    cases = {
        "all_reduce": lambda: dist.all_reduce(torch.ones(16 if rank < last else 48, device=dev), group=g),
        "reduce_scatter": lambda: dist.reduce_scatter_tensor(
            torch.empty(8 if rank < last else 9, device=dev),
            torch.ones(world * (8 if rank < last else 9), device=dev), group=g),
        "all_gather": lambda: dist.all_gather_into_tensor(
            torch.empty(world * (5 if rank < last else 6), device=dev),
            torch.ones(5 if rank < last else 6, device=dev), group=g),
        "broadcast": lambda: dist.broadcast(torch.ones(64, device=dev), src=0 if rank < last else 1, group=g),
        # Same call, different algorithms (set_algo on some ranks only): the plan is in the word.
        "algorithm": lambda: _with_algo("twoshot" if rank < last else "ring",
                                        lambda: dist.all_reduce(torch.ones(1 << 16, device=dev), group=g)),
        # Two-shot of different sizes (LL128 on two ranks: the header's check word differs).
        "two-shot size": lambda: _with_algo("twoshot", lambda: dist.all_reduce(
            torch.ones((1 << 16) + (0 if rank < last else 64), device=dev), group=g)),
    }
    messages = {}
    for name, call in cases.items():
        g = dist.new_group(list(range(world)), timeout=PG_TIMEOUT)
        dist.all_reduce(torch.ones(4, device=dev), group=g)  # the group works
        t0 = time.monotonic()
        call()
        torch.cuda.synchronize()
        # Two ranks that both think they are the broadcast root only send: they learn of it one
        # call later (mismatch_message).
        messages[name] = mismatch_message(g, dev, name, t0)
    return messages


def _with_algo(name, call):
    set_algo(name)
    try:
        call()
    finally:
        set_algo("auto")


def test_mismatched_calls_raise(seed):
    results = run_ranks(WORLD, _mismatch, seed, timeout=300, pg_timeout=PG_TIMEOUT)
    for name in ("all_reduce", "reduce_scatter", "all_gather", "broadcast", "algorithm", "two-shot size"):
        texts = [r[name] for r in results]
        assert any("called different collectives" in t for t in texts), f"{name}: {texts}"
        assert all("unusable" in t for t in texts), f"{name}: {texts}"
    texts = [r["algorithm"] for r in results]
    assert any("two-shot" in t and "ring" in t for t in texts), texts


def _error_of_first_call(group, dev, what):
    """The text of the error a 1 MiB all_reduce on `group` raises; `what` names what went unnoticed."""
    try:
        dist.all_reduce(torch.ones(1 << 20, device=dev), group=group)
        torch.cuda.synchronize()
    except RuntimeError as e:
        return str(e)
    raise AssertionError(f"{what} went unnoticed")


def _settings_differ(rank, world, seed):
    """A group whose ranks start their CUDA engines with different launch settings (here
    PYCOLL_CUDA_MAX_BLOCKS on the last rank) fails on every rank at its first CUDA collective,
    naming the setting and each rank's value, instead of running kernels that do not fit
    together. Other groups keep working."""
    dev = setup_device(rank)
    last = world - 1
    os.environ["PYCOLL_CUDA_MAX_BLOCKS"] = "32" if rank == last else "64"
    g = dist.new_group(list(range(world)), timeout=PG_TIMEOUT)
    t0 = time.monotonic()
    text = _error_of_first_call(g, dev, "different PYCOLL_CUDA_MAX_BLOCKS")
    assert time.monotonic() - t0 < PG_TIMEOUT.total_seconds() / 2
    del os.environ["PYCOLL_CUDA_MAX_BLOCKS"]
    # Same for a calibration (PYCOLL_COST_MODEL) that only the last rank loaded: its `auto` would
    # choose other kernels than the other ranks'.
    import pycollectives
    if rank == last:
        pycollectives._C.set_cuda_choices("all_reduce", world, [(1 << 20, "ring")], 1 << 30)
    g2 = dist.new_group(list(range(world)), timeout=PG_TIMEOUT)
    text2 = _error_of_first_call(g2, dev, "a measured-choice table on one rank")
    pycollectives._C.clear_cuda_choices()
    x = torch.full((1 << 18,), float(rank + 1), device=dev)
    dist.all_reduce(x)  # the default group's engine starts now, with equal settings
    assert torch.all(x == world * (world + 1) / 2)
    torch.cuda.synchronize()
    return text, text2


def test_settings_differ_raise(seed):
    texts = run_ranks(WORLD, _settings_differ, seed, timeout=300, pg_timeout=PG_TIMEOUT)
    last = WORLD - 1
    for t, t2 in texts:
        assert "different settings" in t and "PYCOLL_CUDA_MAX_BLOCKS: rank 0 has 64" in t, t
        assert f"rank {last} has 32" in t, t
        assert "measured auto choices (PYCOLL_COST_MODEL): rank 0 has none" in t2, t2
        assert f"rank {last} has allreduce x{WORLD}: 1048576=ring" in t2, t2


# ---------------------------------------------------------------------------------------------
# a send between some ranks as a group's first CUDA op

SHORT_TIMEOUT = datetime.timedelta(seconds=6)


def _send_first_between_two(rank, world, bound):
    """Ranks 0 and 1 exchange a tensor as a group's first CUDA op; the other ranks issue nothing on
    it. Unbound, the group's CUDA engine waits for every rank at that op: ranks 0 and 1 raise within
    the group's timeout, naming the ranks that never came and the cure. Bound (device_id=), the
    engine was made at init and the exchange completes."""
    dev = setup_device(rank)
    g = dist.new_group(list(range(world)), timeout=SHORT_TIMEOUT)
    t = torch.full((1000,), float(rank + 1), device=dev)
    if rank >= 2:
        time.sleep(SHORT_TIMEOUT.total_seconds() + 3)  # busy elsewhere until ranks 0 and 1 are done
        return None
    t0 = time.monotonic()
    try:
        if rank == 0:
            dist.send(t, 1, group=g)
        else:
            dist.recv(t, 0, group=g)
        torch.cuda.synchronize()
    except RuntimeError as e:
        return {"error": str(e), "seconds": time.monotonic() - t0}
    return {"received": t.cpu().tolist() if rank == 1 else None}


@pytest.mark.skipif(WORLD < 3, reason="needs a group of 3 or more ranks")
def test_send_as_first_op_of_a_larger_group():
    missing = ", ".join(str(r) for r in range(2, WORLD))
    expected = ("rank " if WORLD == 3 else "ranks ") + missing + f" of {WORLD} did not arrive"
    out = run_ranks(WORLD, _send_first_between_two, False, timeout=120, pg_timeout=PG_TIMEOUT)
    for rank in (0, 1):
        text = out[rank]["error"]
        assert "CUDA engine could not start" in text and expected in text and "device_id" in text, text
        # The group's timeout, not an early failure or the default one.
        limit = SHORT_TIMEOUT.total_seconds()
        assert limit - 1 < out[rank]["seconds"] < limit + 10, out[rank]
    out = run_bound(WORLD, _send_first_between_two, True, timeout=120, pg_timeout=PG_TIMEOUT)
    assert "error" not in out[0] and "error" not in out[1], out[:2]
    assert out[1]["received"] == [1.0] * 1000, out[1]


if __name__ == "__main__":  # pragma: no cover - lets the device machine run it without pytest plugins
    run_as_script(globals())
