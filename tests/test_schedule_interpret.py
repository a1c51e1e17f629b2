"""The reference interpreter (pycollectives/schedule/interpret.py) runs every shipped schedule
and random valid ones against torch, for every dtype and reduce op the engines support."""
import inspect
import json
import random

import pytest
import torch

from pycollectives.schedule import IR, Program, ScheduleError, check, interpret
from pycollectives.schedule.registry import EXAMPLES, resolve
from reference import FLOAT_OPS, INT_OPS, gen, reduce_ref

DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.int32]
SIZES = (0, 1, 7, 13)  # empty, one element, odd, not divisible by the chunks
FACTOR = 0.375


def ops_for(dtype, collective):
    if collective not in ("all_reduce", "reduce_scatter", "reduce"):
        return ["SUM"]  # data movement: the op does not matter
    return FLOAT_OPS if dtype.is_floating_point else INT_OPS


def build(name, n, pieces=1):
    f = resolve(name)
    kw = {"pieces": pieces} if "pieces" in inspect.signature(f).parameters else {}
    return check(f(n, **kw))


def run_and_compare(ir, dtype, op, size, seed, order="first"):
    n, coll = ir.ranks, ir.collective
    blocks = n if coll in ("reduce_scatter", "all_to_all") else 1
    xs = [gen(dtype, op, (blocks * size,), seed * 1000 + r) for r in range(n)]
    factor = FACTOR if op == "PREMUL_SUM" else None
    outs = interpret(ir, xs, op.lower(), factor=factor, order=order, seed=seed)
    for r in range(n):
        if coll == "all_reduce":
            ref, bound = reduce_ref(xs, op, dtype, factor)
        elif coll == "reduce_scatter":
            ref, bound = reduce_ref([x[r * size:(r + 1) * size] for x in xs], op, dtype, factor)
        elif coll == "reduce":
            if r != ir.root:
                continue
            ref, bound = reduce_ref(xs, op, dtype, factor)
        elif coll == "all_gather":
            ref, bound = torch.cat(xs), None
        elif coll == "broadcast":
            ref, bound = xs[ir.root], None
        else:  # all_to_all
            ref, bound = torch.cat([xs[q][r * size:(r + 1) * size] for q in range(n)]), None
        out = outs[r]
        assert out.dtype == dtype and out.shape == ref.shape, (ir.name, r, out.shape, ref.shape)
        if bound is None:
            assert torch.equal(out, ref), f"{ir.name} n={n} {dtype} {op} size={size}: rank {r}: {out} != {ref}"
        else:
            err = (out.double() - ref).abs()
            assert bool((err <= bound).all()), f"{ir.name} n={n} {dtype} {op} size={size}: rank {r} off by {err.max()}"


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_every_example_every_op(name, dtype):
    for n in (3, 4):
        ir = build(name, n)
        for op in ops_for(dtype, ir.collective):
            run_and_compare(ir, dtype, op, 13, seed=n)


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_every_example_sizes_and_rank_counts(name):
    for n in (2, 3, 4, 8):
        for pieces in (1, 2):
            ir = build(name, n, pieces)
            for size in SIZES:
                run_and_compare(ir, torch.float32, "SUM", size, seed=size, order="random")


@pytest.mark.slow
@pytest.mark.parametrize("n", (2, 3, 4, 8))
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_full_matrix(name, dtype, n):
    for pieces in (1, 3):
        ir = build(name, n, pieces)
        for op in ops_for(dtype, ir.collective):
            for size in SIZES + (1000,):
                run_and_compare(ir, dtype, op, size, seed=size + pieces, order="random")


def test_premul_sum_scales_each_contribution_once():
    ir = build("ring", 4)
    xs = [torch.full((8,), float(r + 1)) for r in range(4)]
    outs = interpret(ir, xs, "premul_sum", factor=0.5)
    assert all(torch.equal(o, torch.full((8,), 5.0)) for o in outs)
    outs = interpret(ir, xs, "avg")
    assert all(torch.equal(o, torch.full((8,), 2.5)) for o in outs)
    with pytest.raises(ScheduleError, match="factor"):
        interpret(ir, xs, "premul_sum")
    with pytest.raises(ScheduleError, match="integer dtype"):
        interpret(ir, xs, "band")


def test_unordered_program_differs_between_orders():
    """The interpreter honours the dependencies and nothing more: a program with a race gives
    different results under different orders (and the checker rejects it)."""
    def program(race):
        p = Program("lanes", "all_gather", ranks=2, chunks=1, order="lanes")
        h = p.copy(p.input(0), p.output(0, 0), lane=0)
        p.copy(p.input(1), p.output(1, 1), lane=0)
        p.copy(p.input(1), p.output(0, 1), lane=0)
        p.copy(p.output(0, 0), p.output(1, 0), lane=1, after=() if race else (h,))
        return p.lower()

    xs = [torch.tensor([1.0, 2.0]), torch.tensor([3.0, 4.0])]
    results = {tuple(interpret(program(True), xs, order="random", seed=s)[1].tolist()) for s in range(20)}
    assert len(results) > 1
    for s in range(20):
        assert interpret(program(False), xs, order="random", seed=s)[1].tolist() == [1.0, 2.0, 3.0, 4.0]
    with pytest.raises(ScheduleError):
        check(program(True))


# Fuzz: random permutations of ring and tree schedules ----------------------------------------

def random_chains(rng, n):
    """all_reduce: every chunk reduced along its own random ring order, then copied back around it,
    on a random lane; chunks interleaved at random, pipelined at random."""
    chunks = rng.randint(1, 4)
    inplace = rng.random() < 0.5
    p = Program("fuzz_chains", "all_reduce", ranks=n, chunks=chunks, inplace=inplace)
    buf = p.input if inplace else p.output
    if not inplace:
        for r in range(n):
            p.copy(p.input(r, 0, chunks), p.output(r, 0, chunks), lane=rng.randint(0, 1))
    orders = [rng.sample(range(n), n) for _ in range(chunks)]
    lanes = [rng.randint(0, 2) for _ in range(chunks)]
    with p.pipelined(rng.randint(1, 3)):
        for hop in range(2 * (n - 1)):
            for c in rng.sample(range(chunks), chunks):
                o = orders[c]
                if hop < n - 1:
                    p.reduce(buf(o[hop], c), buf(o[hop + 1], c), lane=lanes[c])
                else:
                    k = hop - (n - 1)
                    p.copy(buf(o[(n - 1 + k) % n], c), buf(o[(n + k) % n], c), lane=lanes[c])
    return p


def random_trees(rng, n):
    """all_reduce, reduce, broadcast or all_gather along random trees (one per chunk or block)."""
    coll = rng.choice(["all_reduce", "reduce", "broadcast", "all_gather"])
    chunks = rng.randint(1, 3)
    root = rng.randrange(n) if coll in ("reduce", "broadcast") else None
    p = Program("fuzz_trees", coll, ranks=n, chunks=chunks, root=root, inplace=True)

    def tree(top):
        order = [top] + rng.sample([r for r in range(n) if r != top], n - 1)
        return [(order[i], order[rng.randrange(i)] if i else None) for i in range(n)]

    with p.pipelined(rng.randint(1, 2)):
        if coll == "all_gather":
            for q in rng.sample(range(n), n):
                for c in range(chunks):
                    for node, parent in tree(q):
                        if parent is not None:
                            p.copy(p.output(parent, q * chunks + c), p.output(node, q * chunks + c),
                                   lane=rng.randint(0, 1))
            return p
        for c in range(chunks):
            t = tree(root if root is not None else rng.randrange(n))
            lane = rng.randint(0, 2)
            if coll != "broadcast":
                for node, parent in reversed(t):
                    if parent is not None:
                        p.reduce(p.input(node, c), p.input(parent, c), lane=lane)
            if coll != "reduce":
                for node, parent in t:
                    if parent is not None:
                        p.copy(p.input(parent, c), p.input(node, c), lane=lane)
    return p


@pytest.mark.parametrize("seed", range(40))
def test_fuzz_random_valid_programs(seed):
    rng = random.Random(seed)
    n = rng.choice([2, 3, 4, 5, 8])
    p = (random_chains if seed % 2 else random_trees)(rng, n)
    ir = check(p)
    dtype = rng.choice([torch.float32, torch.int32])
    for order_seed in range(2):
        run_and_compare(ir, dtype, "SUM", rng.choice(SIZES + (31,)), seed=order_seed, order="random")


@pytest.mark.parametrize("seed", range(30))
def test_fuzz_checker_soundness(seed):
    """Mutants of valid programs (a dependency dropped, two steps of a lane swapped): whatever the
    checker accepts computes the right result in every order the interpreter tries."""
    rng = random.Random(1000 + seed)
    n = rng.choice([2, 3, 4])
    d = json.loads(check((random_chains if seed % 2 else random_trees)(rng, n)).dumps())
    lanes = [(r, l) for r, rl in enumerate(d["steps"]) for l, lst in enumerate(rl) if len(lst) > 1]
    with_deps = [(r, l, i) for r, rl in enumerate(d["steps"]) for l, lst in enumerate(rl)
                 for i, s in enumerate(lst) if s.get("deps")]
    if with_deps and rng.random() < 0.5:
        r, l, i = rng.choice(with_deps)
        d["steps"][r][l][i].pop("deps")
    elif lanes:
        r, l = rng.choice(lanes)
        lst = d["steps"][r][l]
        i = rng.randrange(len(lst) - 1)
        lst[i], lst[i + 1] = lst[i + 1], lst[i]
    mutant = IR.from_json(d)
    try:
        check(mutant)
    except ScheduleError:
        return
    for order_seed in range(4):
        run_and_compare(mutant, torch.int32, "SUM", 7, seed=order_seed, order="random")
