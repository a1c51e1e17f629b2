"""Large CPU collectives over tensors in shared memory (tensor.share_memory_()): every rank maps
its peers' files and reads their buffers in place (csrc/cpu/shared_storage.h,
PYCOLL_CPU_SHARED_TENSORS).

Results are checked against plain torch for every dtype and reduce op, across 1-4 ranks, odd
sizes (slices and lanes end unevenly), in place and out of place, every root; the debug log is
checked for the path that ran: "mapped in place" where every buffer an op reads is shared, the
staged "pipelined" path where one is not, where two ranks pass the same memory, where a rank may
not open its peers' files (test hook) and with PYCOLL_CPU_SHARED_TENSORS=off.
"""
import datetime
import os
import re
import sys
import time

import pytest
import torch
import torch.distributed as dist

from cpu_collectives_util import Cases, reduce_ops
from ranks import quiet, run_ranks
from reference import DTYPES, dist_op, gen, reduce_ref

pytestmark = pytest.mark.pycoll_only

PIPELINE_BYTES = 300 << 10  # above the size from which large ops may read in place
PLAN_LINE = re.compile(r"\[pycoll \d+/\d+\] (allreduce|reduce_scatter|allgather|broadcast) .*plan=([a-z ]+) lanes=")
DENIED = "peers' shared-memory tensors cannot be mapped"
MAPPED = "mapped in place"


class Plans:
    """The plans the debug log shows since the last call (this rank's log only)."""

    def __init__(self):
        self.path = os.environ["PYCOLL_TEST_LOG"]
        self.pos = os.path.getsize(self.path)

    def since(self, op=None):
        """Plans of `op` (the log's name: allreduce, reduce_scatter, allgather, broadcast), or of all."""
        sys.stderr.flush()
        with open(self.path, "rb") as f:
            f.seek(self.pos)
            data = f.read()
        self.pos += len(data)
        return [m.group(2) for m in PLAN_LINE.finditer(data.decode(errors="replace")) if op in (None, m.group(1))]


def _elems(dtype, nbytes):
    return nbytes // torch.empty((), dtype=dtype).element_size()


def _shared(t, share):
    return t.share_memory_() if share else t


def _premul_factor(cases):
    g = torch.Generator().manual_seed(cases.seed())
    return 0.25 + 1.75 * torch.rand((), generator=g, dtype=torch.float64).item()


LOG_NAMES = {"all_reduce": "allreduce", "reduce_scatter": "reduce_scatter", "all_gather": "allgather",
             "broadcast": "broadcast"}


def _check_plan(cases, plans, expected, what):
    got = plans.since(LOG_NAMES[what])
    cases.expect(got == [expected] if expected else MAPPED not in got, f"{what}: plans {got}, expected {expected}")


def _all_reduce_counting_votes(cases, plans, rank, ws, t, i, expected):
    """All-reduces the shared buffer t, filled with rank's data for case i, and checks the result
    against plain torch and the op's plan; returns how many votes on mapping the op took."""
    from pycollectives import _C

    xs = [gen(torch.float32, "SUM", (t.numel(),), cases.keyed_seed(r, i)) for r in range(ws)]
    t.copy_(xs[rank])
    votes = _C._test_shared_votes()
    dist.all_reduce(t)
    ref, bound = reduce_ref(xs, "SUM", torch.float32)
    cases.check("all_reduce", t, ref, bound)
    _check_plan(cases, plans, expected, "all_reduce")
    return _C._test_shared_votes() - votes


def _all_ops(cases, plans, rank, ws, share, expected, dtypes=DTYPES, big=False, broadcast_expected=None,
             premul_expected="pipelined"):
    """Every op that may read in place, with `share` deciding whether this rank's tensors are shared;
    `expected`: the plan every op logs; broadcast_expected(root): a broadcast's, if it differs;
    premul_expected: a PREMUL_SUM all_reduce's where `expected` reads in place."""
    for dtype in dtypes:
        n = _elems(dtype, PIPELINE_BYTES) + 3 if not big else 3_000_017
        ops = reduce_ops(dtype) if not big else ["SUM"]
        for op in ops:
            with cases.case(op="all_reduce", dtype=dtype, reduce=op, n=n):
                xs = [gen(dtype, op, (n,), cases.seed(r)) for r in range(ws)]
                factor = _premul_factor(cases) if op == "PREMUL_SUM" else None
                t = _shared(xs[rank].clone(), share)
                dist.all_reduce(t, op=dist_op(op, factor))
                ref, bound = reduce_ref(xs, op, dtype, factor)
                cases.check("all_reduce", t, ref, bound)
                cases.check_identical(t)
                # PREMUL_SUM scales a copy of the input first: staged unless the copy is shared (the
                # shared CPU allocator made it).
                _check_plan(cases, plans, premul_expected if op == "PREMUL_SUM" and expected else expected,
                            "all_reduce")
        m = _elems(dtype, PIPELINE_BYTES) // ws + 5 if not big else big_m(ws)
        for op in ("SUM", "MAX") if not big else ("SUM",):
            for in_place in (False, True):
                with cases.case(op="reduce_scatter", dtype=dtype, reduce=op, m=m, in_place=in_place):
                    inputs = [gen(dtype, op, (ws * m,), cases.seed(r)) for r in range(ws)]
                    mine = _shared(inputs[rank].clone(), share)
                    got = mine.narrow(0, rank * m, m) if in_place else torch.empty(m, dtype=dtype)
                    dist.reduce_scatter_tensor(got, mine, op=dist_op(op))
                    ref, bound = reduce_ref([b[rank * m:(rank + 1) * m] for b in inputs], op, dtype)
                    cases.check("reduce_scatter", got, ref, bound)
                    _check_plan(cases, plans, expected, "reduce_scatter")
        for in_place in (False, True):
            with cases.case(op="all_gather", dtype=dtype, m=m, in_place=in_place):
                xs = [gen(dtype, "data", (m,), cases.seed(r)) for r in range(ws)]
                if in_place:
                    out = _shared(torch.zeros(ws * m, dtype=dtype), share)
                    out.narrow(0, rank * m, m).copy_(xs[rank])
                    dist.all_gather_into_tensor(out, out.narrow(0, rank * m, m))
                else:
                    out = torch.empty(ws * m, dtype=dtype)
                    dist.all_gather_into_tensor(out, _shared(xs[rank].clone(), share))
                cases.check("all_gather", out, torch.cat(xs))
                _check_plan(cases, plans, expected, "all_gather")
        for root in range(ws):
            with cases.case(op="broadcast", dtype=dtype, n=n, root=root):
                x = gen(dtype, "data", (n,), cases.seed(root))
                b = _shared(x.clone() if rank == root else torch.zeros(n, dtype=dtype), share)
                dist.broadcast(b, src=root)
                cases.check("broadcast", b, x)
                _check_plan(cases, plans, broadcast_expected(root) if broadcast_expected else expected, "broadcast")


def big_m(ws):
    return 3_000_017 // ws + 1


def _collectives_rank(rank, ws, seed):
    quiet()
    cases = Cases("shared tensors", rank, ws, seed)
    plans = Plans()
    expected = MAPPED if ws > 1 else None
    _all_ops(cases, plans, rank, ws, True, expected)
    # Several MiB: slices of unequal length over several lanes.
    _all_ops(cases, plans, rank, ws, True, expected, dtypes=(torch.float32, torch.bfloat16), big=True)
    # The same buffers again and again, as a training loop does (after the first op on a buffer
    # the ranks know every peer holds it mapped and skip the vote), two of them in turn.
    n = _elems(torch.float32, PIPELINE_BYTES) * 2 + 1
    bufs = [torch.empty(n).share_memory_() for _ in range(2)]
    for i in range(6):
        with cases.case(op="reused all_reduce", i=i):
            voted = _all_reduce_counting_votes(cases, plans, rank, ws, bufs[i % 2], i, expected)
            # Each buffer's first op votes. The cache is full from the ops above, so mapping the
            # second buffer evicts an old file, which makes every rank forget what it knew was
            # mapped: the first buffer votes once more (i == 2); from then on nobody votes.
            if i < 3:
                cases.expect(voted <= (1 if ws > 1 else 0), f"{voted} votes, expected at most 1")
            else:
                cases.expect(voted == 0, f"{voted} votes, expected none")
    # Below the size from which ops read in place: unchanged.
    with cases.case(op="small all_reduce"):
        xs = [gen(torch.float32, "SUM", (1000,), cases.seed(r)) for r in range(ws)]
        t = xs[rank].clone().share_memory_()
        dist.all_reduce(t)
        ref, bound = reduce_ref(xs, "SUM", torch.float32)
        cases.check("small all_reduce", t, ref, bound)
        cases.expect(MAPPED not in plans.since(), "a small all_reduce read in place")
    # A shared tensor that is not contiguous travels as a contiguous copy: staged.
    if ws > 1:
        with cases.case(op="broadcast strided"):
            x = gen(torch.float32, "data", (2, 300 << 8), cases.seed(0))
            b = (x.clone() if rank == 0 else torch.zeros_like(x)).share_memory_().t()
            dist.broadcast(b, src=0)
            cases.check("broadcast strided", b, x.t())
            cases.expect(MAPPED not in plans.since(), "a strided broadcast read in place")
    return cases.finish()


@pytest.mark.parametrize("ws", [1, 2, 3, 4])
def test_shared_tensors_read_in_place(ws, seed):
    run_ranks(ws, _collectives_rank, seed, timeout=600,
              env={"PYCOLL_CPU_THREADS": "3", "PYCOLL_DEBUG": "INFO"})


def _mixed_rank(rank, ws, seed, shared_ranks, expected, broadcast_reads_shared_roots):
    quiet()
    cases = Cases("shared tensors, mixed", rank, ws, seed)
    bcast = (lambda root: MAPPED if root in shared_ranks else expected) if broadcast_reads_shared_roots else None
    _all_ops(cases, Plans(), rank, ws, rank in shared_ranks, expected, dtypes=(torch.float32, torch.int8),
             broadcast_expected=bcast)
    return cases.finish()


@pytest.mark.parametrize("ws", [2, 3])
def test_one_private_rank_stages_everywhere(ws, seed):
    """The last rank's tensors are private: nobody can read them in place, so every rank stages;
    a broadcast reads only the root's buffer, so it reads in place from the other roots."""
    run_ranks(ws, _mixed_rank, seed, set(range(ws - 1)), "pipelined", True, timeout=300,
              env={"PYCOLL_DEBUG": "INFO"})


def test_setting_off_stages(seed):
    run_ranks(2, _mixed_rank, seed, {0, 1}, "pipelined", False, timeout=300,
              env={"PYCOLL_DEBUG": "INFO", "PYCOLL_CPU_SHARED_TENSORS": "off"})


def test_setting_off_on_one_rank_stages_everywhere(seed):
    """A rank whose setting says off stages, and so do its peers (no rank waits for its vote)."""
    run_ranks(3, _mixed_rank, seed, {0, 1, 2}, "pipelined", False, timeout=300, env={"PYCOLL_DEBUG": "INFO"},
              rank_env=[{}, {"PYCOLL_CPU_SHARED_TENSORS": "off"}, {}])


def _large_one_lane_rank(rank, ws, seed, expected_all_gather_16mib):
    """With one thread per rank a 16 MiB all_gather stages (faster there, cpu_engine.cpp), an 8 MiB
    one and a 16 MiB broadcast read in place; with more threads the 16 MiB all_gather reads in place."""
    quiet()
    cases = Cases("shared tensors, large", rank, ws, seed)
    plans = Plans()
    for mib, expected in ((8, MAPPED), (16, expected_all_gather_16mib)):
        m = (mib << 20) // 4 // ws
        with cases.case(op="all_gather", mib=mib):
            xs = [gen(torch.float32, "data", (m,), cases.seed(r)) for r in range(ws)]
            out = torch.empty(ws * m)
            dist.all_gather_into_tensor(out, xs[rank].clone().share_memory_())
            cases.check("all_gather", out, torch.cat(xs))
            got = plans.since("allgather")
            cases.expect(got == [expected], f"plans {got}, expected {expected}")
    with cases.case(op="broadcast", mib=16):
        x = gen(torch.float32, "data", ((16 << 20) // 4,), cases.seed(0))
        b = (x.clone() if rank == 0 else torch.zeros_like(x)).share_memory_()
        dist.broadcast(b, src=0)
        cases.check("broadcast", b, x)
        got = plans.since("broadcast")
        cases.expect(got == [MAPPED], f"plans {got}, expected {MAPPED}")
    return cases.finish()


@pytest.mark.parametrize("threads,expected", [("1", "pipelined"), ("2", MAPPED)])
def test_large_all_gather_with_one_thread_stages(threads, expected, seed):
    run_ranks(2, _large_one_lane_rank, seed, expected, timeout=300,
              env={"PYCOLL_DEBUG": "INFO", "PYCOLL_CPU_THREADS": threads})


def _denied_rank(rank, ws, seed, deny_on):
    quiet()
    from pycollectives import _C

    if rank == deny_on:
        _C._set_test_deny_shared_open(True)
    cases = Cases("shared tensors, denied", rank, ws, seed)
    _all_ops(cases, Plans(), rank, ws, True, "pipelined", dtypes=(torch.float32,))
    sys.stderr.flush()
    with open(os.environ["PYCOLL_TEST_LOG"], errors="replace") as f:
        log = f.read()
    cases.expect(log.count(DENIED) == 1, f"{log.count(DENIED)} lines say the files cannot be mapped, expected 1")
    return cases.finish()


@pytest.mark.parametrize("ws", [2, 3])
def test_denied_on_one_rank_stages_everywhere(ws, seed):
    """One rank may not open its peers' files: every rank stages, and each says so once."""
    run_ranks(ws, _denied_rank, seed, ws - 1, timeout=300, env={"PYCOLL_DEBUG": "INFO"})


def _same_file_rank(rank, ws, seed):
    """Both ranks' inputs are views of one shared file (rank 0's, reopened by rank 1 through /proc):
    disjoint views read in place, overlapping ones stage."""
    quiet()
    cases = Cases("shared tensors, one file", rank, ws, seed)
    plans = Plans()
    m = _elems(torch.float32, PIPELINE_BYTES) + 7
    data = gen(torch.float32, "data", (ws * m,), cases.seed(0))
    if rank == 0:
        base = data.clone().share_memory_()
        fd, size = base.untyped_storage()._share_fd_cpu_()
        where = [os.getpid(), fd, size]
    else:
        where = [None, None, None]
    dist.broadcast_object_list(where, src=0)
    if rank != 0:
        fd = os.open(f"/proc/{where[0]}/fd/{where[1]}", os.O_RDWR)
        storage = torch.UntypedStorage._new_shared_fd_cpu(fd, where[2])
        base = torch.empty(0).set_(storage)
    for overlap, expected in ((False, MAPPED), (True, "pipelined")):
        with cases.case(op="all_gather", overlap=overlap):
            mine = base.narrow(0, 0 if overlap else rank * m, m)
            out = torch.empty(ws * m)
            dist.all_gather_into_tensor(out, mine)
            ref = data[:m].repeat(ws) if overlap else data
            cases.check("all_gather", out, ref)
            got = plans.since()
            cases.expect(got == [expected], f"plans {got}, expected {expected}")
        dist.barrier()
    return cases.finish()


def test_two_ranks_passing_one_file(seed):
    run_ranks(2, _same_file_rank, seed, timeout=120, env={"PYCOLL_DEBUG": "INFO"})


def _many_buffers_rank(rank, ws, seed):
    """More shared tensors than a rank keeps mapped per peer (PeerFileMaps::kMapsPerPeer, 8): ten
    in turn, twice over, then ten fresh ones. Results stay correct (a buffer whose mapping was
    evicted is mapped again), and at most 8 of each peer's files stay mapped here."""
    quiet()
    cases = Cases("shared tensors, many buffers", rank, ws, seed)
    pids = [None] * ws
    dist.all_gather_object(pids, os.getpid())
    plans = Plans()
    m = _elems(torch.float32, PIPELINE_BYTES)
    ring = [torch.empty(ws * m).share_memory_() for _ in range(10)]
    for i in range(30):
        with cases.case(op="reduce_scatter", i=i):
            inputs = [gen(torch.float32, "SUM", (ws * m,), cases.seed(r)) for r in range(ws)]
            mine = ring[i % 10] if i < 20 else torch.empty(ws * m).share_memory_()
            mine.copy_(inputs[rank])
            got = torch.empty(m)
            dist.reduce_scatter_tensor(got, mine)
            ref, bound = reduce_ref([b[rank * m:(rank + 1) * m] for b in inputs], "SUM", torch.float32)
            cases.check("reduce_scatter", got, ref, bound)
            _check_plan(cases, plans, MAPPED, "reduce_scatter")
            del mine
    with open("/proc/self/maps") as f:
        maps = f.read()
    for r, pid in enumerate(pids):
        if r != rank:
            held = len(set(re.findall(rf"/torch_{pid}_\S+", maps)))
            cases.expect(0 < held <= 8, f"{held} of rank {r}'s files are mapped here, expected 1-8")
    return cases.finish()


@pytest.mark.parametrize("ws", [2, 3])
def test_peer_mappings_are_bounded(ws, seed):
    run_ranks(ws, _many_buffers_rank, seed, timeout=300, env={"PYCOLL_DEBUG": "INFO"})


def _inplace_ring_rank(rank, ws, seed):
    """In-place all_reduces over as many shared buffers as a rank keeps mapped per peer (8), in
    turn: each peer's file is mapped once, writable (all_reduce writes into the peers' outputs and
    reads their inputs, one buffer here), so all 8 stay mapped and after the first round nobody
    votes. Mapped twice (read-only for the input, writable for the output), they would not fit,
    and every op would evict, map again and vote."""
    quiet()
    cases = Cases("shared tensors, in-place ring", rank, ws, seed)
    pids = [None] * ws
    dist.all_gather_object(pids, os.getpid())
    plans = Plans()
    n = _elems(torch.float32, PIPELINE_BYTES) * 2 + 1
    ring = [torch.empty(n).share_memory_() for _ in range(8)]
    for i in range(24):
        with cases.case(op="all_reduce", i=i):
            voted = _all_reduce_counting_votes(cases, plans, rank, ws, ring[i % 8], i, MAPPED)
            if i >= 8:
                cases.expect(voted == 0, f"{voted} votes in round {i // 8 + 1}, expected none")
    with open("/proc/self/maps") as f:
        maps = f.read()
    for r, pid in enumerate(pids):
        if r != rank:
            lines = re.findall(rf"^\S+ (\S+) .*/torch_{pid}_\S+", maps, re.M)
            cases.expect(len(lines) == 8, f"{len(lines)} mappings of rank {r}'s 8 files here, expected 8")
            cases.expect(all(p.startswith("rw") for p in lines), f"rank {r}'s files mapped {sorted(set(lines))}")
    return cases.finish()


@pytest.mark.parametrize("ws", [2, 3])
def test_inplace_all_reduce_maps_each_peer_file_once(ws, seed):
    run_ranks(ws, _inplace_ring_rank, seed, timeout=300, env={"PYCOLL_DEBUG": "INFO"})


def _dies_rank(rank, ws):
    quiet()
    plans = Plans()
    x = torch.ones(ws << 18).share_memory_()  # 1 MiB per rank's block
    out = torch.empty(1 << 18)
    dist.reduce_scatter_tensor(out, x)
    assert plans.since("reduce_scatter") == [MAPPED]
    if rank == ws - 1:
        os._exit(17)
    t0 = time.monotonic()
    try:
        for _ in range(3):
            dist.reduce_scatter_tensor(out, x)
    except RuntimeError as e:
        took = time.monotonic() - t0
        assert took < 20, f"raised only after {took:.1f}s: {e}"
        assert re.search(r"rank \d exited|timed out", str(e)), str(e)
        return took
    raise AssertionError("a reduce_scatter with a dead peer did not raise")


@pytest.mark.parametrize("ws", [2, 3])
def test_peer_dying_between_shared_ops_raises(ws):
    """A peer whose buffers this rank has mapped exits: the next op raises within the timeout (the
    mappings keep its memory valid, so nothing faults)."""
    run_ranks(ws, _dies_rank, pg_timeout=datetime.timedelta(seconds=5), expect_exit={ws - 1: 17}, timeout=60,
              env={"PYCOLL_DEBUG": "INFO"})
