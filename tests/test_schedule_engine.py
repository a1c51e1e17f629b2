"""Schedule programs run by the CPU engine (csrc/cpu/schedule_run.h), forced by name with
PYCOLL_ALGO or set_algo, against torch references computed from every rank's input: every shipped
program at 2, 3 and 4 ranks (8 in the slow matrix), every dtype and reduce op, sizes 0, 1, odd and
not divisible into chunks, in place and not, non-contiguous inputs, rooted ops at every root;
messages larger than a slot (segments), programs with several lanes and with scratch; the digest
in the op header (ranks forcing different programs raise on every rank, never hang); DDP and
FSDP2 trained with a program forced give the parameters of the built-in algorithm; a fuzz of
permuted rings.
"""
import random

import pytest
import torch
import torch.distributed as dist

from ranks import IS_GLOO, run_ranks
from reference import DTYPES, FLOAT_OPS, INT_OPS, dist_op, filler, gen, name, reduce_ref

pytestmark = pytest.mark.skipif(IS_GLOO, reason="schedule programs run on pycoll's engine")

# Every shipped program by the collective it is, with the name that forces it.
PROGRAMS = {
    "ring_all_reduce": "all_reduce", "rabenseifner": "all_reduce", "double_tree": "all_reduce",
    "hierarchical_all_reduce": "all_reduce", "ring_reduce_scatter": "reduce_scatter",
    "ring_all_gather": "all_gather", "bruck": "all_gather", "double_tree_broadcast": "broadcast",
    "binomial_reduce": "reduce", "direct_all_to_all": "all_to_all",
}
SIZES = (0, 1, 7, 1000)


def _inputs(coll, dtype, op, numel, world, seed):
    """Every rank's input (one block, or `world` blocks for reduce_scatter and all_to_all)."""
    blocks = world if coll in ("reduce_scatter", "all_to_all") else 1
    return [gen(dtype, op, (blocks * numel,), seed + 7919 * q) for q in range(world)]


def _run_case(rank, world, coll, dtype, op, numel, seed, variant="", root=0):
    """Runs one op on this rank; returns an error string, or "" when the result is right."""
    xs = _inputs(coll, dtype, op, numel, world, seed)
    factor = 0.5 if op == "PREMUL_SUM" else None
    mine = xs[rank].clone()
    if variant == "strided":  # a non-contiguous input: every other element of a larger tensor
        big = filler(dtype, (2 * mine.numel(),))
        big[::2] = mine
        mine = big[::2]
    if coll == "all_reduce":
        dist.all_reduce(mine, op=dist_op(op, factor))
        ref, bound = reduce_ref(xs, op, dtype, factor)
        got = mine
    elif coll == "reduce":
        dist.reduce(mine, dst=root, op=dist_op(op, factor))
        if rank != root:
            return ""
        ref, bound = reduce_ref(xs, op, dtype, factor)
        got = mine
    elif coll == "reduce_scatter":
        if variant == "inplace":
            got = mine[rank * numel:(rank + 1) * numel]
        else:
            got = filler(dtype, (numel,))
        dist.reduce_scatter_tensor(got, mine, op=dist_op(op, factor))
        ref, bound = reduce_ref([x[rank * numel:(rank + 1) * numel] for x in xs], op, dtype, factor)
    elif coll == "all_gather":
        got = filler(dtype, (world * numel,))
        if variant == "inplace":
            got[rank * numel:(rank + 1) * numel] = mine
            mine = got[rank * numel:(rank + 1) * numel]
        dist.all_gather_into_tensor(got, mine)
        ref, bound = torch.cat(xs), None
    elif coll == "broadcast":
        dist.broadcast(mine, src=root)
        ref, bound, got = xs[root], None, mine
    elif coll == "all_to_all":
        got = filler(dtype, (world * numel,))
        dist.all_to_all_single(got, mine)
        ref, bound = torch.cat([x[rank * numel:(rank + 1) * numel] for x in xs]), None
    else:
        return f"unknown collective {coll}"
    if bound is None:
        ok = torch.equal(got, ref)
    else:
        ok = bool(((got.double() - ref).abs() <= bound).all())
    if ok:
        return ""
    bad = (got.double() - ref.double()).abs().argmax().item() if got.numel() else 0
    return (f"{coll} {name(dtype)} {op} numel={numel} {variant} root={root}: element {bad} is "
            f"{got.flatten()[bad].item()}, expected {ref.flatten()[bad].item()}")


def _ran_schedule():
    """Whether this rank's last op ran a schedule program (its flight recorder entry)."""
    import json

    from pycollectives import _C

    entries = json.loads(_C.flight_recorder_json())["entries"]
    return entries[-1]["algorithm"] == "schedule" and entries[-1]["plan"].startswith("schedule ")


def _run_cases(rank, world, program, cases, register=None):
    """Forces `program`, runs every (coll, dtype, op, numel, variant, root) case; returns the errors."""
    import pycollectives

    if register:
        register()
    pycollectives.set_algo(program)
    errors = []
    for i, (coll, dtype, op, numel, variant, root) in enumerate(cases):
        err = _run_case(rank, world, coll, dtype, op, numel, 1000 * i + 17, variant, root)
        if err:
            errors.append(f"{program}: {err}")
        elif not _ran_schedule():
            errors.append(f"{program}: {coll} did not run the schedule program")
    return errors


def _shape_cases(coll, world, sizes=SIZES):
    """Sizes, variants and roots for one collective, in float32 (the dtype matrix is separate)."""
    op = "SUM" if coll in ("all_reduce", "reduce", "reduce_scatter") else "data"
    dt = torch.float32
    cases = [(coll, dt, op, n, "", 0) for n in sizes]
    if coll in ("broadcast", "reduce"):
        cases += [(coll, dt, op, 1000, "", r) for r in range(1, world)]
    if coll in ("all_reduce", "reduce_scatter", "reduce", "broadcast"):
        cases.append((coll, dt, op, 999, "strided", 0))
    if coll in ("all_gather", "reduce_scatter"):
        cases.append((coll, dt, op, 999, "inplace", 0))
    if coll in ("all_reduce", "reduce", "reduce_scatter"):
        cases.append((coll, dt, "AVG", 1000, "", world - 1))
    return cases


def _every_program(rank, world, sizes):
    errors = []
    for program, coll in PROGRAMS.items():
        errors += _run_cases(rank, world, program, _shape_cases(coll, world, sizes))
    return errors


@pytest.mark.parametrize("world", [2, 3, 4])
def test_every_program_every_size_root_and_layout(world):
    for errors in run_ranks(world, _every_program, SIZES, timeout=240):
        assert errors == []


def _dtype_cases(coll, dtypes=DTYPES):
    cases = []
    for dt in dtypes:
        ops = FLOAT_OPS if dt.is_floating_point else INT_OPS
        cases += [(coll, dt, op, 37, "", 1) for op in ops]
    return cases


def _dtype_matrix(rank, world, programs):
    errors = []
    for program in programs:
        coll = PROGRAMS[program]
        errors += _run_cases(rank, world, program, _dtype_cases(coll) if coll != "all_gather" else
                             [(coll, dt, "data", 37, "", 0) for dt in DTYPES])
    return errors


def test_every_dtype_and_reduce_op():
    progs = ["ring_all_reduce", "ring_reduce_scatter", "binomial_reduce", "ring_all_gather"]
    for errors in run_ranks(3, _dtype_matrix, progs, timeout=240):
        assert errors == []


# A program with scratch and two lanes: every rank's input travels to rank 0's scratch (odd
# ranks on lane 1), rank 0 reduces it there and sends the sum back on the lane it came from.
def scratch_all_reduce(n):
    from pycollectives.schedule import Program

    p = Program("scratch_all_reduce", "all_reduce", ranks=n, chunks=2, inplace=True, scratch=2 * (n - 1))
    for q in range(1, n):
        p.copy(p.input(q, 0, 2), p.scratch(0, 2 * (q - 1), 2), lane=q % 2)
    for q in range(1, n):
        p.reduce(p.scratch(0, 2 * (q - 1), 2), p.input(0, 0, 2))
    for q in range(1, n):
        p.copy(p.input(0, 0, 2), p.input(q, 0, 2), lane=q % 2)
    return p


def _register_scratch():
    from pycollectives.schedule import register_algorithm

    register_algorithm("scratch_all_reduce", scratch_all_reduce, ranks=(4,))


def _segments(rank, world):
    """Messages larger than a slot: PYCOLL_SHM_BYTES=256K cuts them into several segments."""
    errors = []
    big = 100_003  # float32: 400 KB per block, several slots of 64-128 KiB
    for program, coll in PROGRAMS.items():
        errors += _run_cases(rank, world, program, [(coll, torch.float32, "SUM" if coll in (
            "all_reduce", "reduce", "reduce_scatter") else "data", big, "", world - 1)])
    errors += _run_cases(rank, world, "scratch_all_reduce", [("all_reduce", torch.float32, "SUM", big, "", 0),
                                                             ("all_reduce", torch.int64, "MAX", 5, "", 0)],
                         register=_register_scratch)
    return errors


def test_large_messages_run_in_segments_through_lanes_and_scratch():
    for errors in run_ranks(4, _segments, env={"PYCOLL_SHM_BYTES": "256K"}, timeout=240):
        assert errors == []


def _from_env(rank, world):
    import pycollectives

    x = torch.full((1000,), float(rank + 1))
    dist.all_reduce(x)
    ran = _ran_schedule()
    y = torch.full((10,), float(rank))
    out = torch.empty(10 * world)
    dist.all_gather_into_tensor(out, y)  # an op of another collective: auto
    return pycollectives.get_algo(), bool((x == world * (world + 1) / 2).all()), ran, _ran_schedule(), out.tolist()


def test_pycoll_algo_names_a_module_function_each_rank_imports():
    target = "pycollectives.schedule.examples.ring:ring_all_reduce"
    for rank_out in run_ranks(3, _from_env, env={"PYCOLL_ALGO": target}, timeout=120):
        algo, right, ran, other_ran, gathered = rank_out
        assert (algo, right, ran, other_ran) == (target, True, True, False)
        assert gathered == [float(q) for q in range(3) for _ in range(10)]


def _different_programs(rank, world, programs):
    import pycollectives
    from pycollectives import _C

    _C.set_algo(programs[rank])  # unchecked here: the engine must still raise on every rank
    x = torch.ones(100)
    try:
        dist.all_reduce(x)
        first = "no error"
    except Exception as e:  # noqa: BLE001 - the message is the result
        first = str(e)
    pycollectives.set_algo("auto")
    x = torch.ones(100)
    dist.all_reduce(x)  # the group is still in step
    return first, x[0].item()


def test_ranks_forcing_different_programs_raise_on_every_rank():
    results = run_ranks(2, _different_programs, ["ring_all_reduce", "rabenseifner"], timeout=120)
    for msg, after in results:
        assert "mismatch" in msg and "program digest" in msg, msg
        assert after == 2.0


def test_a_program_that_does_not_resolve_raises_on_every_rank():
    results = run_ranks(2, _different_programs, ["ring_all_reduce", "no_such_module_xyz:f"], timeout=120)
    assert "mismatch" in results[0][0] and "no program" in results[0][0], results[0][0]
    assert "no_such_module_xyz" in results[1][0], results[1][0]
    assert [after for _, after in results] == [2.0, 2.0]


def _uneven_all_to_all(rank, world):
    import pycollectives

    pycollectives.set_algo("direct_all_to_all")
    splits = [1, 2] if rank == 0 else [2, 2]  # rank 0 sends 1 to 0, 2 to 1; rank 1 sends 2 and 2
    recv = [1, 2] if rank == 0 else [2, 2]
    inp = torch.arange(sum(splits), dtype=torch.float32)
    out = torch.empty(sum(recv))
    try:
        dist.all_to_all_single(out, inp, recv, splits)
        return "no error"
    except Exception as e:  # noqa: BLE001
        return str(e)


def test_uneven_all_to_all_under_a_program_raises_on_every_rank():
    msgs = run_ranks(2, _uneven_all_to_all, timeout=120)
    assert "blocks of one size" in msgs[0] and "mismatch" in msgs[1], msgs


def test_set_algo_checks_the_name_here():
    import pycollectives
    from pycollectives.schedule import ScheduleError

    with pytest.raises(ScheduleError, match="no_such_program"):
        pycollectives.set_algo("no_such_program")
    with pytest.raises(ValueError, match="spaces|schedule program"):
        pycollectives.set_algo("two words")
    try:
        pycollectives.set_algo("bruck")
        assert pycollectives.get_algo() == "bruck"
        pycollectives.set_algo("ring")  # the built-in ring, not the example
        assert pycollectives.get_algo() == "ring"
    finally:
        pycollectives.set_algo(None)


def _sgd_steps(model, rank, steps, batch):
    """SGD on random data of this rank (the model's first layer's width)."""
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(rank)
    features = next(model.parameters()).shape[1]
    for _ in range(steps):
        opt.zero_grad()
        model(torch.randn(batch, features, generator=g)).square().mean().backward()
        opt.step()


def _train_ddp(rank, world, program):
    import pycollectives
    from torch.nn.parallel import DistributedDataParallel as DDP

    pycollectives.set_algo(program)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(33, 64), torch.nn.ReLU(), torch.nn.Linear(64, 5))
    _sgd_steps(DDP(model, bucket_cap_mb=0.01), rank, steps=4, batch=16)
    ran = _ran_schedule()
    return [p.detach().clone() for p in model.parameters()], ran


def _train_fsdp(rank, world, program):
    import pycollectives
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    pycollectives.set_algo(program)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 48), torch.nn.ReLU(), torch.nn.Linear(48, 8))
    mesh = init_device_mesh("cpu", (world,))
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    _sgd_steps(model, rank, steps=3, batch=8)
    return [p.full_tensor().detach().clone() for p in model.parameters()]


def _train_both(rank, world, trainer, program, builtin):
    forced = trainer(rank, world, program)
    reference = trainer(rank, world, builtin)
    return forced, reference


def test_ddp_with_the_ring_program_gives_the_builtin_rings_parameters_bitwise():
    for (forced, ran), (reference, _) in run_ranks(2, _train_both, _train_ddp, "ring_all_reduce", "ring",
                                                   timeout=180):
        assert ran
        assert all(torch.equal(a, b) for a, b in zip(forced, reference))


def test_fsdp2_with_ring_programs_gives_the_builtin_parameters():
    for program in ("ring_reduce_scatter", "ring_all_gather"):
        for forced, reference in run_ranks(2, _train_both, _train_fsdp, program, "auto", timeout=180):
            assert all(torch.equal(a, b) for a, b in zip(forced, reference)), program


# The fuzz: rings through the ranks in a random order, on a random lane, with random pieces and
# channel depths.
def permuted_ring(n, seed=0):
    from pycollectives.schedule import Program

    rng = random.Random(seed)
    order = list(range(n))
    rng.shuffle(order)
    p = Program(f"fuzz_ring_{seed}", "all_reduce", ranks=n, chunks=n, inplace=True,
                channel_depth=rng.choice([1, 2, 3]))
    lane = rng.randrange(2)
    with p.pipelined(rng.choice([1, 2, 3])):
        for step in range(n - 1):
            for i in range(n):
                c = (i - step) % n
                p.reduce(p.input(order[i], c), p.input(order[(i + 1) % n], c), lane=lane)
        for step in range(n - 1):
            for i in range(n):
                c = (i + 1 - step) % n
                p.copy(p.input(order[i], c), p.input(order[(i + 1) % n], c), lane=lane)
    return p


def _fuzz(rank, world, seeds):
    import functools

    from pycollectives.schedule import register_algorithm

    errors = []
    for seed in seeds:
        name_ = f"fuzz_ring_{seed}"
        register_algorithm(name_, functools.partial(permuted_ring, seed=seed), ranks=(world,))
        rng = random.Random(seed)
        numel = rng.choice([1, 5, 97, 1000, 40_001])
        errors += _run_cases(rank, world, name_, [("all_reduce", torch.float64, "SUM", numel, "", 0)])
    return errors


def test_fuzz_permuted_rings_against_the_reference():
    for errors in run_ranks(4, _fuzz, list(range(6)), env={"PYCOLL_SHM_BYTES": "256K"}, timeout=240):
        assert errors == []


@pytest.mark.slow
@pytest.mark.parametrize("world", [5, 8])
def test_slow_every_program_at_more_ranks(world):
    for errors in run_ranks(world, _every_program, SIZES + (65_537,), timeout=600):
        assert errors == []


@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 4])
def test_slow_every_program_every_dtype(world):
    for errors in run_ranks(world, _dtype_matrix, list(PROGRAMS), timeout=600):
        assert errors == []


@pytest.mark.slow
def test_slow_64_mib_all_reduce_through_the_ring_program():
    def_cases = [("all_reduce", torch.float32, "SUM", 16 << 20, "", 0)]
    for errors in run_ranks(2, _run_cases, "ring_all_reduce", def_cases, timeout=600):
        assert errors == []


def test_receive_reduce_and_forward_fuses_only_where_the_partial_is_dead():
    from pycollectives.schedule.engine_tables import FUSED_AWAY, RECV_REDUCE_SEND, _forwards, engine_tables
    from pycollectives.schedule.registry import lookup, resolve

    ring = resolve("ring_all_reduce")(4).lower()  # a copy of its own: changed below
    assert _forwards(ring, 1) == {(0, 1), (0, 3)}  # the two middle hops of the reduce-scatter
    assert _forwards(lookup("ring_all_reduce", None, 2), 0) == set()
    rows = engine_tables(ring)[-1][1][0][0]
    assert [row[0] for row in rows[:5]] == [0, RECV_REDUCE_SEND, FUSED_AWAY, RECV_REDUCE_SEND, FUSED_AWAY]
    assert all(len(row) == 19 for row in rows)

    # The same ring, but rank 1 reads its first partial again right after forwarding it: not fused.
    from pycollectives.schedule.ir import Step

    lane = ring.steps[1][0]
    partial = lane[1].dst
    ring.steps[1][0] = lane[:3] + [Step("copy", partial, ("out", partial[1], 1))] + lane[3:]
    assert _forwards(ring, 1) == {(0, 4)}
