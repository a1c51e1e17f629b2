"""The schedule checker (pycollectives/schedule/check.py): every shipped program passes it, and
broken programs are rejected with a message naming the rank, step and chunk and the fault."""
import inspect
import json
import re

import pytest

import pycollectives
from pycollectives.schedule import IR, Program, ScheduleError, Step, check, lookup, register_algorithm
from pycollectives.schedule.examples.ring import ring_all_reduce
from pycollectives.schedule.registry import EXAMPLES, resolve, unregister_algorithm

RANKS = (2, 3, 4, 8)


def _kwargs(f, **kw):
    params = inspect.signature(f).parameters
    return {k: v for k, v in kw.items() if k in params}


@pytest.mark.parametrize("name", sorted(EXAMPLES))
@pytest.mark.parametrize("n", RANKS + (1, 5, 16))
def test_examples_pass(name, n):
    f = resolve(name)
    ir = check(f(n), ranks=n)
    assert ir.ranks == n and ir.num_steps() > 0 or n == 1
    check(f(n, **_kwargs(f, pieces=3)), ranks=n)  # pipelined too


def test_ring_is_short_and_textbook():
    src = inspect.getsource(ring_all_reduce)
    assert len(src.strip().splitlines()) < 30
    ir = ring_all_reduce(4).lower()
    for r in range(4):  # each rank: send, receive, send, ... 2(N-1) of each, sends first (parallel)
        ops = [s.op for s in ir.steps[r][0]]
        assert ops == ["send", "recv_reduce"] * 3 + ["send", "recv"] * 3


def check_fails(program, pattern, **kw):
    with pytest.raises(ScheduleError) as e:
        check(program, **kw)
    assert re.search(pattern, str(e.value)), str(e.value)
    return str(e.value)


def ring_without(n, skip=None, extra=None):
    """The ring all_reduce with the reduce-scatter step `skip` = (step, rank) left out and `extra`
    (src rank, dst rank, chunk) reduced once more at the end of the reduce-scatter."""
    p = Program("ring", "all_reduce", ranks=n, chunks=n, inplace=True)
    for step in range(n - 1):
        for r in range(n):
            if (step, r) != skip:
                c = (r - step) % n
                p.reduce(p.input(r, c), p.input((r + 1) % n, c))
    if extra:
        a, b, c = extra
        p.reduce(p.input(a, c), p.input(b, c))
    for step in range(n - 1):
        for r in range(n):
            c = (r + 1 - step) % n
            p.copy(p.input(r, c), p.input((r + 1) % n, c))
    return p


def test_missing_contribution():
    check_fails(ring_without(4, skip=(0, 1)),
                r"^rank 0, step 5 \(lane 0\): output chunk 1 holds r0\+r2\+r3 \(missing rank 1\) "
                r"but all_reduce needs r0\+r1\+r2\+r3$")


def test_double_contribution():
    check_fails(ring_without(4, extra=(0, 1, 0)),
                r"^rank 1, step \d+ \(lane 0\): input chunk 0 holds r0\+r0\+r1 \(rank 0 twice\) "
                r"but all_reduce needs every contribution once \(r0\+r1\+r2\+r3\)$")


def test_output_message_names_the_writer():
    """An output chunk that ends wrong names the last step that wrote it."""
    p = Program("half", "all_reduce", ranks=4, chunks=1)
    p.copy(p.input(0), p.output(0))
    p.reduce(p.input(1), p.output(0))
    for r in range(1, 4):
        p.copy(p.output(0), p.output(r))
    check_fails(p, r"^rank 0, step 1 \(lane 0\): output chunk 0 holds r0\+r1 \(missing rank 2, rank 3\) "
                   r"but all_reduce needs r0\+r1\+r2\+r3$")


def two_lanes(race):
    """all_gather of 2 ranks: lane 0 fills rank 0's output block 0, lane 1 sends it on."""
    p = Program("lanes", "all_gather", ranks=2, chunks=1, order="lanes")
    h = p.copy(p.input(0), p.output(0, 0), lane=0)
    p.copy(p.input(1), p.output(1, 1), lane=0)
    p.copy(p.input(1), p.output(0, 1), lane=0)
    p.copy(p.output(0, 0), p.output(1, 0), lane=1, after=() if race else (h,))
    return p


def test_read_before_write():
    check(two_lanes(race=False))
    check_fails(two_lanes(race=True), r"^rank 0, step 0 \(lane 1\): reads output chunk 0 that rank 0, step 0 "
                                      r"\(lane 0\) writes, without waiting for that step \(read before write\)$")


def test_read_of_nothing():
    p = Program("x", "all_reduce", ranks=2, chunks=1)
    p.reduce(p.input(0), p.output(1))
    check_fails(p, r"^rank 1, step 0 \(lane 0\): reads output chunk 0 before any step writes it "
                   r"\(read before write\)$")


def test_write_write_race():
    p = Program("ww", "all_gather", ranks=2, chunks=1, order="lanes")
    p.copy(p.input(0), p.output(0, 0), lane=0)
    p.copy(p.input(1), p.output(1, 1), lane=0)
    p.copy(p.input(0), p.output(1, 0), lane=0)
    p.copy(p.input(1), p.output(0, 1), lane=0)
    p.copy(p.input(0), p.output(0, 0), lane=1)
    check_fails(p, r"^rank 0, step 0 \(lane 1\): writes output chunk 0 that rank 0, step 0 \(lane 0\) also "
                   r"writes, and nothing orders the two \(write-write race\)$")


def test_read_write_race():
    """A write that may land while another lane still reads the old value."""
    p = Program("rw", "all_reduce", ranks=2, chunks=1, inplace=True, order="lanes")
    p.send(p.input(0), 1, lane=0)
    p.recv(p.input(1), 0, reduce=True, lane=0)
    p.send(p.input(1), 0, lane=1)
    p.recv(p.input(0), 1, lane=1)
    check_fails(p, r"read-write race|read before write")


def test_unmatched_receive():
    p = Program("x", "all_reduce", ranks=2, chunks=1, inplace=True, order="lanes")
    p.recv(p.input(0), 1, reduce=True)
    check_fails(p, r"^rank 0, step 0 \(lane 0\): receive from rank 1 \(message 0 on lane 0\) has no matching "
                   r"send \(unmatched receive\)$")


def test_unmatched_send():
    p = Program("x", "all_reduce", ranks=2, chunks=1, inplace=True)
    p.send(p.input(0), 1, lane=1)
    check_fails(p, r"^rank 0, step 0 \(lane 1\): send to rank 1 \(message 0 on lane 1\) is never received")


def test_cycle():
    p = Program("x", "all_reduce", ranks=2, chunks=1, inplace=True)
    p.recv(p.input(0), 1, reduce=True)
    p.send(p.input(0), 1)
    p.recv(p.input(1), 0)
    p.send(p.input(1), 0)
    check_fails(p, r"^rank 0, step 1 \(lane 0\): deadlock: .* in a cycle: rank 0, step 1 \(lane 0\) \[send input "
                   r"chunk 0 to rank 1\] -> rank 1, step 0 .* -> rank 1, step 1 .* -> rank 0, step 0 \(lane 0\) "
                   r"\[receive and reduce into input chunk 0 from rank 1\] -> back to the first$")


def exchange(depth, messages):
    """Both ranks send `messages` messages before receiving any: fine while the channel holds them."""
    p = Program("x", "all_gather", ranks=2, chunks=messages, channel_depth=depth, order="lanes")
    for r in range(2):
        p.copy(p.input(r, 0, messages), p.output(r, r * messages, messages))
        for c in range(messages):
            p.send(p.input(r, c), 1 - r)
        for c in range(messages):
            p.recv(p.output(r, (1 - r) * messages + c), 1 - r)
    return p


def test_channel_depth_deadlock():
    check(exchange(depth=3, messages=3))
    check_fails(exchange(depth=2, messages=3), r"deadlock: .*receive into output.*send input chunk 2 to rank 1")


def test_chunk_out_of_range():
    p = Program("x", "all_reduce", ranks=2, chunks=2, inplace=True)
    p.reduce(p.input(0, 1, 2), p.input(1, 1, 2))
    check_fails(p, r"^rank 0, step 0 \(lane 0\): input chunk 2 is out of range: the input has chunks 0-1 "
                   r"\(the step uses 1-2\)$")


def test_wrong_collective():
    ir = ring_all_reduce(4)
    check(ir, collective="all_reduce")
    check_fails(ir, r"^program 'ring_all_reduce' is a schedule of all_reduce, but all_gather was asked for "
                    r"\(wrong collective\)$", collective="all_gather")


def test_wrong_rank_count():
    check_fails(ring_all_reduce(4), r"built for 4 ranks, but the group has 8 \(wrong rank count\)", ranks=8)
    d = ring_all_reduce(4).lower().to_json()
    d["steps"].pop()
    check_fails(IR.from_json(d), r"declares 4 ranks but has steps for 3 \(wrong rank count\)")


def test_scratch_overflow():
    p = Program("x", "all_reduce", ranks=2, chunks=2, scratch=1)
    p.copy(p.input(0, 0, 2), p.scratch(1, 0, 2))
    check_fails(p, r"^rank 1, step 0 \(lane 0\): scratch chunk 1 is beyond the declared scratch of 1 chunks "
                   r"\(scratch overflow")


def test_chunks_that_do_not_add_up():
    p = Program("x", "all_reduce", ranks=2, chunks=2, inplace=True)
    p.reduce(p.input(0, 0), p.input(1, 1))
    check_fails(p, r"^rank 1, step 0 \(lane 0\): reduces r0:c0 into input chunk 1, which holds r1:c1: chunks of "
                   r"different positions do not add up$")


def test_no_reduction_in_a_copy_collective():
    p = Program("x", "all_gather", ranks=2, chunks=1, inplace=True)
    p.copy(p.input(0), p.output(0, 0))
    p.reduce(p.input(1), p.output(0, 0))
    check_fails(p, r"^rank 0, step 1 \(lane 0\): reduces into output chunk 0, but all_gather does not reduce$")


def test_never_written_output():
    p = Program("x", "all_gather", ranks=2, chunks=1)
    p.copy(p.input(0), p.output(0, 0))
    check_fails(p, r"^rank 0: output chunk 1 is never written, but all_gather needs r1:c0 there$")


def test_pieces_named():
    """With pieces, a chunk is named with its piece."""
    p = Program("x", "all_reduce", ranks=2, chunks=1, inplace=True)
    p.reduce(p.input(0), p.input(1), pieces=2)
    check_fails(p, r"^rank 0: output chunk 0 \(piece 0 of chunk 0\) holds r0 \(missing rank 1\) but all_reduce needs "
                   r"r0\+r1 \(no step writes it\)$")


def test_tampered_ir():
    """The checker reads the IR, whatever made it: a JSON edited by hand or a synthesizer."""
    d = json.loads(ring_all_reduce(3).lower().dumps())
    d["steps"][1][0][1]["seq"] = 7
    check_fails(IR.from_json(d), r"message 7 from rank 0 on lane 0 comes where message 0 is next")
    d["steps"][1][0].append({"op": "recv", "dst": ["in", 0, 1], "peer": 2, "seq": 0})
    d["steps"][1][0][1]["seq"] = 0
    check_fails(IR.from_json(d), r"^rank 1, step 8 \(lane 0\): receive from rank 2 \(message 0 on lane 0\) "
                                 r"has no matching send \(unmatched receive\)$")
    d = json.loads(ring_all_reduce(3).lower().dumps())
    d["steps"][2][0][0]["deps"] = [[3, 0]]
    check_fails(IR.from_json(d), r"depends on step 0 of lane 3, which rank 2 does not have")
    d = json.loads(ring_all_reduce(3).lower().dumps())
    d["steps"][0][0][1]["dst"] = ["in", 1, 1]  # the receive lands in the wrong chunk
    check_fails(IR.from_json(d), r"different positions|holds|read before write")


def test_dropped_lane_deps_are_found():
    """The hierarchical all_reduce runs its two phases on two lanes, ordered by deps the lowering
    adds; without them the checker finds the races."""
    ir = resolve("hierarchical")(8, per_host=4).lower()
    assert any(s.deps for r in ir.steps for lane in r for s in lane)
    d = json.loads(ir.dumps())
    for r in d["steps"]:
        for lane in r:
            for s in lane:
                s.pop("deps", None)
    check_fails(IR.from_json(d), r"race|read before write")


def test_ir_round_trip_and_digest():
    ir = ring_all_reduce(4, pieces=2).lower()
    again = IR.from_json(ir.dumps())
    assert again.dumps() == ir.dumps() and again.digest() == ir.digest()
    assert ir.digest() == ring_all_reduce(4, pieces=2).lower().digest()  # stable across builds
    assert ir.digest() != ring_all_reduce(4).lower().digest()
    assert len(ir.digest()) == 64 and 0 <= ir.digest64() < 2**64
    assert json.loads(ir.dumps())["format"] == "pycoll-schedule/1"
    with pytest.raises(ScheduleError, match="format"):
        IR.from_json({"format": "other"})


def test_language_errors():
    with pytest.raises(ScheduleError, match="unknown collective"):
        Program("x", "all_sum", ranks=2)
    with pytest.raises(ScheduleError, match="needs a root"):
        Program("x", "broadcast", ranks=2)
    with pytest.raises(ScheduleError, match="unknown buffer"):
        Program("x", "all_reduce", ranks=2).copy(Program("x", "all_reduce", ranks=2).input(0),
                                                   __import__("pycollectives.schedule").schedule.Ref(1, "tmp", 0))
    p = Program("x", "all_reduce", ranks=2, chunks=2)
    with pytest.raises(ScheduleError, match="2 chunks into 1"):
        p.copy(p.input(0, 0, 2), p.output(1, 0))
    with pytest.raises(ScheduleError, match="do not nest"):
        with p.pipelined(2):
            with p.pipelined(2):
                pass
    p.copy(p.input(0), p.output(5))
    with pytest.raises(ScheduleError, match="names rank 5"):
        p.lower()


def test_register_and_lookup():
    assert pycollectives.register_algorithm is register_algorithm
    register_algorithm("test_ring_sched", ring_all_reduce)
    try:
        ir = lookup("test_ring_sched", "all_reduce", 6)
        assert ir.ranks == 6 and ir is lookup("test_ring_sched", "all_reduce", 6)
        with pytest.raises(ScheduleError, match="wrong collective"):
            lookup("test_ring_sched", "all_gather", 4)
        with pytest.raises(ValueError, match="already registered"):
            register_algorithm("test_ring_sched", lambda n: ring_all_reduce(n))
    finally:
        unregister_algorithm("test_ring_sched")
    with pytest.raises(ValueError, match="built-in"):
        register_algorithm("ring", ring_all_reduce)
    with pytest.raises(ScheduleError, match=r"algorithm 'bad' at 2 ranks: .*missing rank"):
        register_algorithm("bad", lambda n: ring_without(n, skip=(0, 1)), ranks=(2, 3))
    assert "bad" not in pycollectives.schedule.registered()


def test_lookup_by_module_name():
    name = "pycollectives.schedule.examples.bruck:bruck_all_gather"
    ir = lookup(name, "all_gather", 5)
    assert ir.name == "bruck_all_gather" and name in pycollectives.schedule.registered()
    with pytest.raises(ScheduleError, match="cannot import"):
        lookup("no_such_module_xyz:f", "all_reduce", 2)
    with pytest.raises(ScheduleError, match="has no"):
        lookup("pycollectives.schedule.examples.bruck:nothing", "all_reduce", 2)
    with pytest.raises(ScheduleError, match="unknown algorithm"):
        lookup("nothing_at_all", "all_reduce", 2)


def test_tutorial_in_the_docs():
    """docs/schedules.md shows real output: its ring, its check, its broken ring's message."""
    import os

    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs", "schedules.md")
    with open(path) as fh:
        doc = fh.read()
    blocks = re.findall(r"```python\n(.*?)```", doc, re.S)
    ns = {}
    for b in blocks:
        if "def my_ring" in b or "def my_broken_ring" in b:
            exec(b, ns)
    ir = check(ns["my_ring"](4))
    assert f">>> ir.num_steps(), ir.digest()[:16]\n{(ir.num_steps(), ir.digest()[:16])!r}\n" in doc
    for s in ir.steps[1][0][:4]:
        assert f"\n{s.to_json()!r}\n" in doc
    with pytest.raises(ScheduleError) as e:
        check(ns["my_broken_ring"](4))
    assert f"\npycollectives.schedule.errors.ScheduleError: {e.value}\n" in doc


def test_what_an_engine_reads():
    """Per rank: its lanes, its channels and slot sizes, the element range of every chunk."""
    ir = resolve("hierarchical")(8, per_host=4, pieces=2).lower()
    mine = ir.for_rank(5)
    assert mine["rank"] == 5 and mine["digest"] == ir.digest() and len(mine["steps"]) == ir.lanes
    json.dumps(mine)
    ch = ir.channels()
    assert ch[(5, 6, 0)] == {"messages": 12, "max_chunks": 2}  # 2 pieces x 6 steps; a group of H=2 chunks
    assert ch[(5, 1, 1)]["max_chunks"] == 1  # across hosts, to rank 1: single chunks, on lane 1
    ir = ring_all_reduce(3).lower()
    assert [ir.chunk_bounds("in", c, 7) for c in range(3)] == [(0, 3), (3, 6), (6, 7)]
    assert ir.chunk_bounds("scratch", 1, 7) == (3, 6)
    ag = resolve("ring_all_gather")(2).lower()
    assert ag.chunk_bounds("out", 1, 5) == (5, 10) and ag.chunk_bounds("out", 0, 0) == (0, 0)


def test_identical_results_on_every_rank():
    """identical=True: every rank's output is a copy of one reduction (bitwise equal floats)."""
    def direct(n):  # every rank adds the others' inputs itself, each in its own order
        p = Program("direct", "all_reduce", ranks=n, chunks=1)
        for r in range(n):
            p.copy(p.input(r), p.output(r))
        for k in range(1, n):
            for r in range(n):
                p.reduce(p.input((r + k) % n), p.output(r))
        return p

    for name in EXAMPLES:
        check(resolve(name)(4), identical=True)
    check(direct(3))
    check(direct(2), identical=True)  # a + b and b + a are the same bits
    check_fails(direct(3), r"^rank 1, step 4 \(lane 0\): output chunk 0 is reduced in another order than on "
                           r"rank 0: the results may differ in their last bits \(not identical\)$", identical=True)
