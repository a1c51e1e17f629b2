"""Schedule programs on the CUDA engine (csrc/cuda/schedule_kernel.cu), forced by name with
set_algo, against torch references computed from every rank's input: every shipped program for its
collective, float32, bfloat16, float16, float64 and int32 with every reduce op the program's
collective has, sizes 0, 1, odd and not divisible into chunks, in place and not, rooted ops at
every root, and blocks larger than a slot (the program runs in segments); a program with two
lanes, cross-lane deps and scratch. Ranks that force different programs, or pass different sizes,
raise on every rank instead of returning garbage or timing out; so does a rank whose all_to_all
splits the program cannot move, and a rank that cannot load the program its peers run stops them.
"""
import json
import time

import torch
import torch.distributed as dist

from gpu_collectives_util import (GPU_MARKS, PG_TIMEOUT, WORLD, R, check_close, check_graph_replays, make_input,
                                  mismatch_message, op_name, reference, run_as_script, setup_device)
from ranks import run_ranks, set_algo
from test_schedule_engine import scratch_all_reduce  # two lanes, cross-lane deps, scratch

pytestmark = GPU_MARKS

# Every shipped program by the collective it is, with the name that forces it.
PROGRAMS = {
    "ring_all_reduce": "all_reduce", "rabenseifner": "all_reduce", "double_tree": "all_reduce",
    "hierarchical_all_reduce": "all_reduce", "ring_reduce_scatter": "reduce_scatter",
    "ring_all_gather": "all_gather", "bruck": "all_gather", "double_tree_broadcast": "broadcast",
    "binomial_reduce": "reduce", "direct_all_to_all": "all_to_all",
}
REDUCING = ("all_reduce", "reduce_scatter", "reduce")
DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64, torch.int32)
FLOAT_OPS = (R.SUM, R.MAX, R.MIN, R.PRODUCT, R.AVG)
INT_OPS = (R.SUM, R.MAX, R.MIN, R.PRODUCT)
# 1003 divides into no program's chunks (2 to 16 per block).
SIZES = (0, 1, 7, 1003)
# 1.2 MB of float32 per block: messages of it exceed the CUDA engine's slots (256 KiB at 2-4 ranks,
# less with more), so the program runs in several segments.
LARGE = 300_007


def ring_in_pieces(n):
    """The ring all_reduce with every chunk cut in two pieces: the same peers, another program."""
    from pycollectives.schedule.examples.ring import ring_all_reduce

    return ring_all_reduce(n, pieces=2)


def _register(world):
    from pycollectives.schedule import register_algorithm, registered

    if "scratch_all_reduce" not in registered():
        register_algorithm("scratch_all_reduce", scratch_all_reduce, ranks=(world,))
        register_algorithm("ring_in_pieces", ring_in_pieces, ranks=(world,))


def _ran_schedule():
    """Whether this rank's last op ran a schedule program (its flight recorder entry)."""
    from pycollectives import _C

    entries = json.loads(_C.flight_recorder_json())["entries"]
    return entries[-1]["algorithm"] == "schedule" and entries[-1]["plan"].startswith("schedule ")


def _run_case(rank, world, dev, seed, coll, dtype, op, numel, variant="", root=0):
    """One op on this rank, checked against the reference (raises AssertionError)."""
    key = (coll, str(dtype), op_name(op) if op is not None else "data", numel, variant, root)
    blocks = world if coll in ("reduce_scatter", "all_to_all") else 1
    xs = [make_input(seed, key, q, blocks * numel, dtype, dev, op) for q in range(world)]
    mine = xs[rank].clone()
    exact = op is None  # data movement: bit for bit
    if coll == "all_reduce":
        dist.all_reduce(mine, op=op)
        got, want = mine, reference(xs, op, dtype)
    elif coll == "reduce":
        dist.reduce(mine, dst=root, op=op)
        if rank != root:
            return
        got, want = mine, reference(xs, op, dtype)
    elif coll == "reduce_scatter":
        got = mine[rank * numel:(rank + 1) * numel] if variant == "inplace" else torch.full(
            (numel,), 7, dtype=dtype, device=dev)
        dist.reduce_scatter_tensor(got, mine, op=op)
        want = reference([x[rank * numel:(rank + 1) * numel] for x in xs], op, dtype)
    elif coll == "all_gather":
        got = torch.full((world * numel,), 7, dtype=dtype, device=dev)
        if variant == "inplace":
            got[rank * numel:(rank + 1) * numel] = mine
            mine = got[rank * numel:(rank + 1) * numel]
        dist.all_gather_into_tensor(got, mine)
        want = torch.cat(xs)
    elif coll == "broadcast":
        dist.broadcast(mine, src=root)
        got, want = mine, xs[root]
    elif coll == "all_to_all":
        got = torch.full((world * numel,), 7, dtype=dtype, device=dev)
        dist.all_to_all_single(got, mine)
        want = torch.cat([x[rank * numel:(rank + 1) * numel] for x in xs])
    else:
        raise AssertionError(f"unknown collective {coll}")
    if exact:
        assert torch.equal(got, want), f"{key}: differs from the reference"
    else:
        check_close(got, want, dtype, str(key))


def _cases(coll, world):
    """(dtype, op, numel, variant, root) of one collective: sizes, layouts and roots in float32,
    every dtype and reduce op at an odd size, and a block larger than a slot."""
    reduces = coll in REDUCING
    plain = R.SUM if reduces else None
    f32 = torch.float32
    cases = [(f32, plain, n, "", 0) for n in SIZES]
    if coll in ("broadcast", "reduce"):
        cases += [(f32, plain, 1003, "", r) for r in range(1, world)]
    if coll in ("all_gather", "reduce_scatter"):
        cases.append((f32, plain, 1003, "inplace", 0))
    for dt in DTYPES:
        if not reduces:
            cases.append((dt, None, 37, "", world - 1))
            continue
        for op in FLOAT_OPS if dt.is_floating_point else INT_OPS:
            cases.append((dt, op, 37, "", world - 1))
    cases.append((f32, plain, LARGE, "", world - 1))
    if reduces:
        cases.append((torch.bfloat16, R.AVG, LARGE, "", 0))
    return cases


def _every_program(rank, world, seed):
    dev = setup_device(rank)
    _register(world)
    errors = []
    programs = dict(PROGRAMS, scratch_all_reduce="all_reduce", ring_in_pieces="all_reduce")
    for program, coll in programs.items():
        set_algo(program)
        for dtype, op, numel, variant, root in _cases(coll, world):
            try:
                _run_case(rank, world, dev, seed, coll, dtype, op, numel, variant, root)
            except AssertionError as e:
                errors.append(f"{program}: {e}")
                continue
            if not _ran_schedule():
                errors.append(f"{program}: {coll} {dtype} numel={numel} did not run the schedule program")
    set_algo("auto")
    torch.cuda.synchronize()
    return errors


def test_every_program_dtype_op_size_and_root(seed):
    for errors in run_ranks(WORLD, _every_program, seed, timeout=300, pg_timeout=PG_TIMEOUT):
        assert errors == []


def _mismatch(rank, world, seed):
    """Ranks that force different programs, pass different sizes, or run a program against the
    built-in ring get an error naming both calls. Each case breaks its group for good, so each gets
    a fresh one."""
    dev = setup_device(rank)
    _register(world)
    last = world - 1
    cases = {
        "program": ("ring_all_reduce" if rank < last else "ring_in_pieces", 4096),
        "size": ("ring_all_reduce", 4096 if rank < last else 4160),
        "built-in": ("ring_all_reduce" if rank < last else "ring", 4096),
    }
    messages = {}
    for name, (algo, numel) in cases.items():
        g = dist.new_group(list(range(world)), timeout=PG_TIMEOUT)
        dist.all_reduce(torch.ones(4, device=dev), group=g)  # the group works
        t0 = time.monotonic()
        set_algo(algo)
        try:
            dist.all_reduce(torch.ones(numel, device=dev), group=g)
            torch.cuda.synchronize()
        finally:
            set_algo("auto")
        messages[name] = mismatch_message(g, dev, name, t0)
    return messages


def test_mismatched_programs_and_sizes_raise_on_every_rank(seed):
    results = run_ranks(WORLD, _mismatch, seed, timeout=240, pg_timeout=PG_TIMEOUT)
    for name in ("program", "size", "built-in"):
        texts = [r[name] for r in results]
        assert any("called different collectives" in t for t in texts), f"{name}: {texts}"
        assert all("unusable" in t for t in texts), f"{name}: {texts}"
    texts = [r["program"] for r in results]
    assert any("another schedule program" in t for t in texts), texts
    texts = [r["size"] for r in results]
    assert any("4096 elements" in t and "4160 elements" in t for t in texts), texts


def _uneven_all_to_all(rank, world, seed):
    """A rank whose all_to_all splits a program cannot move raises at once and runs the program
    poisoned, so that its peers fail at their first message from it instead of at the timeout; the
    group is then unusable on every rank. Ranks that all pass the same uneven splits all raise and
    the group stays usable."""
    dev = setup_device(rank)
    even = [16] * world
    odd = [17, 15] + [16] * (world - 2)
    results = {}
    for name, splits in (("one", odd if rank == world - 1 else even), ("all", odd)):
        g = dist.new_group(list(range(world)), timeout=PG_TIMEOUT)
        dist.all_reduce(torch.ones(4, device=dev), group=g)  # the group works
        t0 = time.monotonic()
        first = "no error"
        set_algo("direct_all_to_all")
        try:
            out = torch.full((16 * world,), 7.0, device=dev)
            dist.all_to_all_single(out, torch.ones(16 * world, device=dev), even, splits, group=g)
            torch.cuda.synchronize()
        except (ValueError, RuntimeError) as e:
            first = str(e)
        finally:
            set_algo("auto")
        after = "usable"
        for _ in range(3):
            try:
                x = torch.ones(4, device=dev)
                dist.all_reduce(x, group=g)
                torch.cuda.synchronize()
                assert torch.all(x == world)
            except RuntimeError as e:  # DistBackendError
                after = str(e)
                break
        results[name] = (first, after, time.monotonic() - t0)
    return results


def test_uneven_all_to_all_fails_fast_on_every_rank(seed):
    results = run_ranks(WORLD, _uneven_all_to_all, seed, timeout=240, pg_timeout=PG_TIMEOUT)
    for rank, r in enumerate(results):
        first, after, took = r["one"]
        if rank == WORLD - 1:
            assert "splits differ" in first, first
        assert "unusable" in after, (rank, first, after)
        assert took < PG_TIMEOUT.total_seconds() / 2, f"rank {rank}: failed only after {took:.1f} s (a timeout?)"
        first, after, took = r["all"]
        assert "splits differ" in first and after == "usable", (rank, first, after)
    assert any("another schedule program" in r["one"][1] for r in results), results



def _cannot_load(rank, world, seed, failing):
    """The ranks in `failing` force a program whose module does not import there; the others a
    shipped one, whose kernels would wait for the failing ranks' messages until the timeout."""
    from pycollectives import _C

    dev = setup_device(rank)
    dist.all_reduce(torch.ones(4, device=dev))  # the group works
    torch.cuda.synchronize()
    _C.set_algo("no_such_module_xyz:f" if rank in failing else "ring_all_reduce")  # unchecked here
    t0 = time.monotonic()
    first = "no error"
    try:
        dist.all_reduce(torch.ones(1000, device=dev))
        torch.cuda.synchronize()
    except Exception as e:  # noqa: BLE001 - the message is the result
        first = str(e)
    finally:
        _C.set_algo("auto")
    after = "usable"
    try:
        dist.all_reduce(torch.ones(4, device=dev))
        torch.cuda.synchronize()
    except RuntimeError as e:  # DistBackendError
        after = str(e)
    return first, after, time.monotonic() - t0


# The kernels path, whatever the environment says (under auto a schedule program stages).
KERNELS = {"PYCOLL_CUDA_SAME_DEVICE": "kernels"}


def test_a_rank_that_cannot_load_the_program_stops_its_peers(seed):
    results = run_ranks(WORLD, _cannot_load, seed, [WORLD - 1], timeout=240, pg_timeout=PG_TIMEOUT, env=KERNELS)
    for rank, (first, after, took) in enumerate(results):
        assert took < PG_TIMEOUT.total_seconds() / 2, f"rank {rank}: failed only after {took:.1f} s (a timeout?)"
        assert "unusable" in after, (rank, first, after)
        if rank == WORLD - 1:
            assert "no_such_module_xyz" in first and "could not be had here" in after, (first, after)
        else:
            assert f"rank {WORLD - 1} reported an error first" in first + after, (rank, first, after)


def test_a_program_no_rank_can_load_raises_everywhere_and_the_group_goes_on(seed):
    results = run_ranks(WORLD, _cannot_load, seed, list(range(WORLD)), timeout=240, pg_timeout=PG_TIMEOUT,
                        env=KERNELS)
    for rank, (first, after, took) in enumerate(results):
        assert "no_such_module_xyz" in first and after == "usable", (rank, first, after)
        assert took < PG_TIMEOUT.total_seconds() / 2, f"rank {rank}: failed only after {took:.1f} s"

def _deep_channels(rank, world, seed):
    """A program that keeps more messages in flight per channel than the CUDA engine's channels
    hold is refused before anything is launched, on every rank alike; the group stays usable."""
    from pycollectives.schedule import Program, register_algorithm

    def deep_ring(n):
        p = Program("deep_ring", "all_gather", ranks=n, chunks=1, inplace=True, channel_depth=64)
        for q in range(n):
            for d in range(1, n):
                p.copy(p.output(q, q), p.output((q + d) % n, q))
        return p

    dev = setup_device(rank)
    register_algorithm("deep_ring", deep_ring, ranks=(world,))
    set_algo("deep_ring")
    try:
        dist.all_gather_into_tensor(torch.empty(world * 16, device=dev), torch.ones(16, device=dev))
        text = "no error"
    except (ValueError, RuntimeError) as e:
        text = str(e)
    finally:
        set_algo("auto")
    x = torch.full((33,), float(rank + 1), device=dev)
    dist.all_reduce(x)
    torch.cuda.synchronize()
    assert torch.all(x == world * (world + 1) / 2)
    return text


def test_a_program_deeper_than_the_channels_is_refused(seed):
    for text in run_ranks(WORLD, _deep_channels, seed, timeout=120, pg_timeout=PG_TIMEOUT):
        assert "deep_ring" in text and "in flight per channel" in text, text


def _graph_first_use(rank, world, seed):
    """The first call of a program inside CUDA graph capture (its step table is uploaded then),
    replayed with new inputs."""
    dev = setup_device(rank)
    # The warm-up runs auto (it makes the engine); the program is forced only for the capture.
    check_graph_replays(rank, world, [torch.zeros(4099, device=dev)],
                        before_capture=lambda: set_algo("ring_all_reduce"))
    set_algo("auto")


def test_first_use_of_a_program_inside_graph_capture(seed):
    run_ranks(WORLD, _graph_first_use, seed, timeout=240, pg_timeout=PG_TIMEOUT)


if __name__ == "__main__":  # pragma: no cover - lets the device machine run it without pytest plugins
    run_as_script(globals())
