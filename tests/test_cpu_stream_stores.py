"""Streaming stores: a large CPU all_gather and a large received message write the user's output
with non-temporal stores (csrc/cpu/kernels/stream_store.h) once it is at least
PYCOLL_CPU_STREAM_STORE_MIN_BYTES per rank. Here that threshold is 4 KiB, so that messages of a few
hundred KiB take the streamed copies, with outputs that start off a 64-byte line and sizes that end
inside one (the copies' unaligned head and tail).

Every case checks the result against a plain torch computation and how many bytes this rank wrote
with streaming stores (`_C._test_streamed_bytes`): exactly its output's, or none where the rule
says plain stores (in-place all_reduce, broadcast, reduce_scatter; the setting above any message).
"""
import os
import platform
import re
import subprocess
import sys

import pytest
import torch
import torch.distributed as dist

from cpu_collectives_util import Cases
from ranks import quiet, run_ranks
from reference import DTYPES, filler, gen

# Elsewhere stream_copy is a plain memcpy and counts nothing.
pytestmark = [pytest.mark.pycoll_only,
              pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="streaming stores are x86-64's")]

STREAM_FROM = 4 << 10
ON = {"PYCOLL_CPU_STREAM_STORE_MIN_BYTES": str(STREAM_FROM)}
OFF = {"PYCOLL_CPU_STREAM_STORE_MIN_BYTES": "1024G"}
# Above the pipelined ops' least message (256 KiB), and odd so that blocks end inside a line.
PER_RANK_BYTES = (320 << 10) + 40


def _streamed():
    from pycollectives import _C

    return _C._test_streamed_bytes()


def _elems(dtype, nbytes):
    return nbytes // torch.empty((), dtype=dtype).element_size()


def _size(dtype):
    return torch.empty((), dtype=dtype).element_size()


def _output(dtype, n, offset):
    """A fresh output of n elements; `offset` elements into a larger tensor, so that for 1-, 2- and
    4-byte dtypes it starts inside a 64-byte line. Returns (view, base)."""
    base = filler(dtype, (n + offset + 3,))
    return base[offset:offset + n], base


def _all_gather_rank(rank, ws, seed, streaming, shared, per_rank_bytes=PER_RANK_BYTES, dtypes=DTYPES,
                     plan=None):
    """all_gather_into_tensor, out of place into aligned and unaligned outputs, and in place: the
    gathered blocks (and this rank's own, out of place) are streamed. `plan`: the one plan the debug
    log must name for every all_gather."""
    quiet()
    cases = Cases("stream stores, all_gather", rank, ws, seed, shared=shared)
    for dtype in dtypes:
        m = _elems(dtype, per_rank_bytes) + 3
        for layout in ("aligned", "offset", "in place"):
            with cases.case(dtype=dtype, m=m, layout=layout):
                blocks = [gen(dtype, "data", (m,), cases.keyed_seed(r)) for r in range(ws)]
                ref = torch.cat(blocks)
                before = _streamed()
                if layout == "in place":
                    out = filler(dtype, (m * ws,))
                    if shared:
                        out.share_memory_()
                    out[rank * m:(rank + 1) * m].copy_(blocks[rank])
                    dist.all_gather_into_tensor(out, out[rank * m:(rank + 1) * m])
                    written = (ws - 1) * m
                    guard = None
                else:
                    out, guard = _output(dtype, m * ws, 1 if layout == "offset" else 0)
                    guard_before = guard.clone()
                    mine = blocks[rank].clone()
                    if shared:
                        mine.share_memory_()
                    dist.all_gather_into_tensor(out, mine)
                    written = ws * m
                if plan == "read in place":
                    # The peers' blocks arrive through the kernel's copy (process_vm_readv), not ours.
                    written = 0 if layout == "in place" else m
                got = _streamed() - before
                cases.check("gathered", out, ref)
                if guard is not None:
                    off = 1 if layout == "offset" else 0
                    cases.check("before the output", guard[:off], guard_before[:off])
                    cases.check("after the output", guard[off + m * ws:], guard_before[off + m * ws:])
                want = written * _size(dtype) if streaming else 0
                cases.expect(got == want, f"{got} bytes streamed, expected {want}")
    if plan is not None:
        sys.stderr.flush()
        with open(os.environ["PYCOLL_TEST_LOG"], errors="replace") as f:
            plans = set(re.findall(r"\] allgather .*plan=(read in place|mapped in place|pipelined) lanes=", f.read()))
        cases.expect(plans == {plan}, f"plans logged {plans}, expected {{{plan!r}}}")
    dist.barrier()
    return cases.finish()


@pytest.mark.parametrize("ws", [2, 3, 4])
def test_all_gather_streams(ws, seed):
    run_ranks(ws, _all_gather_rank, seed, True, False, timeout=300, env=ON)


@pytest.mark.parametrize("ws", [2, 3])
def test_shared_all_gather_streams(ws, seed):
    """Inputs in shared memory: every rank copies the peers' blocks straight out of their files."""
    run_ranks(ws, _all_gather_rank, seed, True, True, timeout=300, env=ON)


def test_read_in_place_all_gather_streams(seed, needs_cross_memory_attach):
    """Reading the peers' inputs with cross-memory attach (PYCOLL_CPU_PEER_READ=on): out of place,
    this rank's own block is streamed into the output; the kernel writes the peers' blocks."""
    env = {**ON, "PYCOLL_CPU_PEER_READ": "on", "PYCOLL_CPU_THREADS": "2", "PYCOLL_DEBUG": "INFO"}
    run_ranks(3, _all_gather_rank, seed, True, False, PER_RANK_BYTES, [torch.float32, torch.int8, torch.float16],
              "read in place", timeout=300, env=env)


def test_all_gather_plain_when_off(seed):
    """The setting above any message: the same ops, the same results, nothing streamed."""
    run_ranks(2, _all_gather_rank, seed, False, False, timeout=300, env=OFF)


def test_all_gather_streams_on_several_lanes(seed):
    """Two threads per rank: each lane streams its part, and the op returns after every lane's
    fence (1.2 MiB per rank: two lanes of at least 128 KiB from 1 MiB of message)."""
    env = {**ON, "PYCOLL_CPU_THREADS": "2"}
    run_ranks(2, _all_gather_rank, seed, True, False, (1200 << 10) + 40, [torch.float32, torch.int8],
              timeout=300, env=env)


def test_default_streams_nothing_below_4_mib(seed):
    """Unset, the threshold is at least 4 MiB on any host: 640 KiB outputs are stored plainly."""
    run_ranks(2, _all_gather_rank, seed, False, False, PER_RANK_BYTES, [torch.float32], timeout=300,
              env={"PYCOLL_CPU_STREAM_STORE_MIN_BYTES": ""})


def _in_place_rank(rank, ws, seed):
    """all_reduce and broadcast work in place, reduce_scatter is left plain (measured no faster):
    none of them streams even above the threshold."""
    quiet()
    cases = Cases("stream stores, in place", rank, ws, seed)
    for dtype in (torch.float32, torch.int64, torch.bfloat16):
        n = _elems(dtype, PER_RANK_BYTES) * ws + ws
        with cases.case(dtype=dtype, n=n):
            xs = [gen(dtype, "SUM", (n,), cases.keyed_seed(r)) for r in range(ws)]
            before = _streamed()
            x = xs[rank].clone()
            dist.all_reduce(x)
            ref = xs[0].to(torch.float64)
            for other in xs[1:]:
                ref = ref + other.to(torch.float64)
            cases.check("all_reduce", x.to(torch.float64), ref, bound=5e-2 if dtype == torch.bfloat16 else 1e-4)
            b = xs[rank].clone()
            dist.broadcast(b, src=ws - 1)
            cases.check("broadcast", b, xs[ws - 1])
            out = filler(dtype, (n // ws,))
            dist.reduce_scatter_tensor(out, xs[rank].clone())
            block = slice(rank * (n // ws), (rank + 1) * (n // ws))
            cases.check("reduce_scatter", out.to(torch.float64), ref[block],
                        bound=5e-2 if dtype == torch.bfloat16 else 1e-4)
            got = _streamed() - before
            cases.expect(got == 0, f"{got} bytes streamed, expected none")
    dist.barrier()
    return cases.finish()


def test_in_place_ops_do_not_stream(seed):
    run_ranks(3, _in_place_rank, seed, timeout=300, env=ON)


def _p2p_rank(rank, ws, seed, shared, streaming):
    """A ring of sends: every dtype, into aligned and unaligned receive buffers. Private tensors
    come through the channel (streamed piece by piece), shared ones by reference (one streamed copy
    out of the sender's file); either way the receiver streams the whole message."""
    quiet()
    if shared:
        # By reference needs ranks without CPUs to spare (cpu/p2p.h), as on the CI machine.
        os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[:ws])
    cases = Cases("stream stores, send/recv", rank, ws, seed, shared=shared)
    nxt, prv = (rank + 1) % ws, (rank - 1) % ws
    for dtype in DTYPES:
        n = _elems(dtype, PER_RANK_BYTES) + 5
        for offset in (0, 1):
            with cases.case(dtype=dtype, n=n, offset=offset):
                mine = gen(dtype, "data", (n,), cases.keyed_seed(rank))
                src = mine.clone().share_memory_() if shared else mine.clone()
                dst, guard = _output(dtype, n, offset)
                guard_before = guard.clone()
                before = _streamed()
                w = dist.isend(src, dst=nxt, tag=3)
                dist.recv(dst, src=prv, tag=3)
                w.wait()
                got = _streamed() - before
                cases.check("received", dst, gen(dtype, "data", (n,), cases.keyed_seed(prv)))
                cases.check("around the receive buffer", torch.cat([guard[:offset], guard[offset + n:]]),
                            torch.cat([guard_before[:offset], guard_before[offset + n:]]))
                want = n * _size(dtype) if streaming else 0
                cases.expect(got == want, f"{got} bytes streamed, expected {want}")
    dist.barrier()
    return cases.finish()


@pytest.mark.parametrize("ws", [2, 3])
def test_channel_receive_streams(ws, seed):
    run_ranks(ws, _p2p_rank, seed, False, True, timeout=300, env=ON)


def test_by_reference_receive_streams(seed):
    env = {**ON, "PYCOLL_P2P_CHANNEL_BYTES": str(64 << 10)}
    run_ranks(2, _p2p_rank, seed, True, True, timeout=300, env=env)


def test_receive_plain_when_off(seed):
    run_ranks(2, _p2p_rank, seed, False, False, timeout=300, env=OFF)


def test_stream_copy_offsets_and_sizes():
    """stream_copy itself: every start of dst and src within a 64-byte line, sizes that end inside
    the head, the body and the tail; the bytes around dst untouched, every byte counted."""
    from pycollectives import _C

    pad = 128
    src_base = torch.randint(0, 256, (1 << 14,), dtype=torch.uint8, generator=torch.Generator().manual_seed(1))
    for nbytes in (0, 1, 15, 16, 63, 64, 65, 127, 128, 129, 1000, 4096 + 17):
        for dst_off in range(64):
            src_off = (dst_off * 7 + nbytes) % 64
            dst_base = torch.full((nbytes + 2 * pad,), 0xA5, dtype=torch.uint8)
            src = src_base[src_off:src_off + nbytes]
            dst = dst_base[dst_off:dst_off + nbytes]
            before = _C._test_streamed_bytes()
            _C._test_stream_copy(dst, src)
            what = f"{nbytes} bytes into offset {dst_off} from offset {src_off}"
            assert torch.equal(dst, src), what
            assert bool((dst_base[:dst_off] == 0xA5).all()), f"{what}: bytes before dst written"
            assert bool((dst_base[dst_off + nbytes:] == 0xA5).all()), f"{what}: bytes after dst written"
            assert _C._test_streamed_bytes() - before == nbytes, what


def _llc_bytes(cpu):
    """The last-level cache as cpu/kernels/stream_store.cpp reads it for a process whose first allowed CPU
    is `cpu`: the highest sysfs level of that CPU with a size that parses and is not 0; None where
    none does (the library then asks sysconf, which this test cannot reproduce)."""
    for index in (4, 3, 2):
        try:
            with open(f"/sys/devices/system/cpu/cpu{cpu}/cache/index{index}/size") as f:
                text = f.read().strip()
        except OSError:
            continue
        match = re.fullmatch(r"(\d+)([KMG]?)", text)
        if match and int(match.group(1)) > 0:
            return int(match.group(1)) << {"": 10, "K": 10, "M": 20, "G": 30}[match.group(2)]
    return None


def _child(ranks, setting, cpus):
    """(cache CPU, threshold) that a fresh process pinned to `cpus` reads, with the setting unset or
    `setting`; it pins itself before the library reads the cache."""
    env = {k: v for k, v in os.environ.items() if k != "PYCOLL_CPU_STREAM_STORE_MIN_BYTES"}
    if setting is not None:
        env["PYCOLL_CPU_STREAM_STORE_MIN_BYTES"] = setting
    code = (f"import os; os.sched_setaffinity(0, {sorted(cpus)}); from pycollectives import _C; "
            f"print(_C._test_cache_cpu(), _C._test_stream_store_min_bytes({ranks}))")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120,
                         check=True)
    cpu, threshold = out.stdout.split()
    return int(cpu), int(threshold)


@pytest.mark.parametrize("ranks", [1, 2, 4, 16])
def test_default_threshold_is_the_ranks_share_of_the_cache_between_4_and_32_mib(ranks):
    """Half the last-level cache over the ranks, never below 4 MiB nor above 32 MiB (a VM's sysfs
    may report the whole socket's cache: 300 MiB on the 16-CPU Xeon; decision 0021); the cache is
    that of the first CPU the process may run on, not cpu0's."""
    allowed = sorted(os.sched_getaffinity(0))
    assert _child(ranks, "3M", allowed)[1] == 3 << 20  # the setting wins, below the default's floor too
    for cpus in (allowed, allowed[-1:]):
        cpu, threshold = _child(ranks, None, cpus)
        assert cpu == cpus[0], f"cache read for CPU {cpu}, the process runs on {cpus}"
        llc = _llc_bytes(cpu)
        if llc is None:
            continue
        want = min(max(llc // 2 // ranks, 4 << 20), 32 << 20)
        assert threshold == want, f"on CPUs {cpus}"
