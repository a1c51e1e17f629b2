"""The simulator's fast path (pycollectives/schedule/fastsim.py) against the event simulation of
the lowered IR, the reference: the same time, steps, bytes per rank and per port, and busiest
port for every shipped program it takes, on one and two levels; the IR it lowers; steps written
for arrays of ranks; and the ring at 2,048 ranks."""
import math
import time

import numpy as np
import pytest

from pycollectives.schedule import Program, ScheduleError, simulate
from pycollectives.schedule.fastsim import FastSim, Unsupported
from pycollectives.schedule.simulate import Topology, _build, _fast

FAST = ("ring", "ring_reduce_scatter", "ring_all_gather", "rabenseifner", "bruck", "binomial_reduce")
TOPOLOGIES = [
    dict(link="nvlink"),
    dict(link="pcie", size=1000003, gamma=1e-11, copy_gamma=3e-12),   # chunks of unequal sizes
    dict(link="100gbit", hosts=2, network="400gbit"),
    dict(link="nvlink", hosts=4, network="100gbit", nics=1),          # NICs shared: the event path
    dict(link="400gbit", lane_ports=True, pieces=3),
]


def assert_same(a, b):
    assert (a.steps, a.messages, a.bytes_sent) == (b.steps, b.messages, b.bytes_sent)
    assert math.isclose(a.time, b.time, rel_tol=1e-12), (a.time, b.time)
    assert list(a.links) == list(b.links)
    for k, v in a.links.items():
        assert v["bytes"] == b.links[k]["bytes"] and v["link"] == b.links[k]["link"], k
        assert math.isclose(v["busy"], b.links[k]["busy"], rel_tol=1e-12), k
    assert a.busiest == b.busiest and a.topology == b.topology


@pytest.mark.parametrize("n", (8, 12, 64))
@pytest.mark.parametrize("name", FAST)
def test_same_result_as_the_event_simulation(name, n):
    for kw in TOPOLOGIES:
        kw = dict(kw, size=kw.get("size", 64 << 20))
        pieces = kw.pop("pieces", None)
        factory_kw = {"chunks": pieces} if name == "bruck" and pieces else ({"pieces": pieces} if pieces else {})
        p = _build(name, n, kw.get("hosts", 1), **factory_kw)
        topo = Topology(n, **{k: v for k, v in kw.items() if k != "size"})
        # The fast path takes it (a Result), or lowers it for the event simulation (an IR).
        assert _fast(p, topo, kw["size"], 4) is not None
        assert_same(simulate(p, n, **kw), simulate(p.lower(), n, **kw))


@pytest.mark.parametrize("name", FAST)
def test_lowered_ir_is_the_languages(name):
    for n in (3, 8, 13):
        for kw in ({}, {"chunks": 2} if name == "bruck" else {"pieces": 2}):
            p = _build(name, n, **kw)
            sim = FastSim(p, Topology(n), 1 << 20, 4)
            assert sim.lower(*sim.depths()).digest() == p.lower().digest()


def test_other_programs_take_the_event_simulation():
    for name in ("double_tree", "hierarchical", "direct_all_to_all"):  # several lanes
        with pytest.raises(Unsupported):
            FastSim(_build(name, 8), Topology(8), 1 << 20, 4)
        p = _build(name, 8)
        assert_same(simulate(p, 8), simulate(p.lower(), 8))


def test_steps_for_arrays_of_ranks():
    """A step written for arrays is one step per element, in order: the same IR."""
    n = 6
    one, many = (Program("r", "all_gather", ranks=n) for _ in range(2))
    r = np.arange(n)
    for step in range(1, n):
        for q in range(n):
            one.copy(one.output(q, q), one.output((q + step) % n, q))
        assert many.copy(many.output(r, r), many.output((r + step) % n, r)) is None
    assert one.lower().digest() == many.lower().digest()
    with pytest.raises(ScheduleError, match="differ in length"):
        many.copy(many.output(r, 0), many.output(np.arange(n - 1), 0))
    with pytest.raises(ScheduleError, match="single steps"):
        h = many.copy(many.output(0, 0), many.output(1, 0))
        many.copy(many.output(r, 0), many.output(r, 1), after=[h])


def test_ring_at_2048_ranks():
    n, size, alpha, beta = 2048, 64 << 20, 2e-6, 1 / 300e9
    t = time.monotonic()
    r = simulate("ring", n, size=size, link="nvlink")
    took = time.monotonic() - t
    assert r.steps == 2 * (n - 1) and r.messages == 2 * (n - 1) * n
    assert all(b == 2 * (n - 1) * size // n for b in r.bytes_sent.values())
    assert r.time == pytest.approx(2 * (n - 1) * (alpha + size / n * beta), rel=1e-9)
    assert r.busiest == "rank 0 out (nvlink)" and len(r.links) == 2 * n
    assert took < 60, took  # about 7 s on 2 cores
