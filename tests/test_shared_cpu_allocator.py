"""The shared CPU allocator (pycollectives.use_shared_cpu_memory, PYCOLL_CPU_ALLOCATOR=shared;
csrc/engines/shared_cpu_allocator.h): large CPU tensors live in memfd files from the moment they
are made, so large collectives read them in place with no share_memory_() call.

Checked: which tensors it places (threshold, views, contiguous copies), reuse and its cap, the
file budget and what happens past it, fork(), nothing left in /dev/shm, the environment switch
and its errors; and, across 1-4 ranks, every op that may read in place against plain torch with
the debug log showing the in-place path, and a DDP step whose buckets it made.
"""
import os
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.distributed as dist

import pycollectives
from pycollectives import _C
from cpu_collectives_util import Cases
from ranks import quiet, run_ranks
from test_cpu_shared_tensors import MAPPED, Plans, _all_ops

MIN = 256 << 10  # the default threshold (PYCOLL_SHARED_CPU_MIN_BYTES)


@pytest.fixture
def allocator():
    """The allocator on in this process for one test, with an empty cache, then off."""
    _C.release_cached_shared_blocks()  # blocks freed after an earlier test ended
    pycollectives.use_shared_cpu_memory()
    try:
        yield
    finally:
        pycollectives.use_shared_cpu_memory(False)
        _C.release_cached_shared_blocks()


def _run_script(body, env=None, rlimit_files=None):
    """Runs `body` in a fresh interpreter (allocator state and fork() stay out of this process);
    rlimit_files: (soft, hard) RLIMIT_NOFILE for it."""
    prelude = "import os, sys, torch, pycollectives\nfrom pycollectives import _C\n"
    if rlimit_files:
        prelude = f"import resource\nresource.setrlimit(resource.RLIMIT_NOFILE, {tuple(rlimit_files)})\n" + prelude
    full_env = dict(os.environ, **(env or {}))
    return subprocess.run([sys.executable, "-c", prelude + textwrap.dedent(body)], env=full_env,
                          capture_output=True, text=True, timeout=60)


def test_places_large_tensors_only_while_on(allocator):
    big, small = torch.empty(MIN // 4), torch.empty(MIN // 4 - 1)
    assert _C._is_peer_mappable(big)
    assert not _C._is_peer_mappable(small)
    assert _C._is_peer_mappable(big[5:])  # a view of a block is in the same file
    assert not _C._is_peer_mappable(torch.empty(0))
    # A contiguous copy of a strided tensor is a new allocation: placed too.
    strided = torch.empty(2, MIN // 4).t()
    assert _C._is_peer_mappable(strided.contiguous())
    stats = pycollectives.shared_cpu_memory_stats()
    assert stats["installed"] and stats["min_bytes"] == MIN
    pycollectives.use_shared_cpu_memory(False)
    assert not _C._is_peer_mappable(torch.empty(MIN // 4))
    assert _C._is_peer_mappable(big)  # made while on: stays shared, and usable
    big.fill_(3)
    assert big.sum().item() == 3 * big.numel()


def test_threshold_and_bad_values(allocator):
    pycollectives.use_shared_cpu_memory(min_bytes=1 << 20)
    assert not _C._is_peer_mappable(torch.empty(MIN // 4))
    assert _C._is_peer_mappable(torch.empty(1 << 18))
    for bad in (0, 1, 4095):
        with pytest.raises(ValueError, match="min_bytes must be at least 4096"):
            pycollectives.use_shared_cpu_memory(min_bytes=bad)
    with pytest.raises(ValueError, match="min_bytes must be at least 4096"):
        _C.install_shared_cpu_allocator(100)  # the native check, for callers below the Python API


def test_cache_is_emptied_when_turned_off(allocator):
    a = torch.ones(MIN)
    pycollectives.use_shared_cpu_memory(False)
    del a  # freed while off: not kept
    stats = pycollectives.shared_cpu_memory_stats()
    assert stats["cached_blocks"] == 0 and stats["live_blocks"] == 0, stats
    pycollectives.use_shared_cpu_memory()
    b = torch.ones(MIN)
    del b
    assert pycollectives.shared_cpu_memory_stats()["cached_blocks"] == 1
    pycollectives.use_shared_cpu_memory(False)  # turning off drops the cache
    assert pycollectives.shared_cpu_memory_stats()["cached_blocks"] == 0


def test_lazy_clone_of_a_block(allocator):
    """torch's lazy (copy-on-write) clone needs a simple DataPtr (context == data)."""
    x = torch.arange(MIN, dtype=torch.float32)
    y = torch._lazy_clone(x)
    y.add_(1)
    assert torch.equal(x, torch.arange(MIN, dtype=torch.float32))
    assert torch.equal(y, torch.arange(MIN, dtype=torch.float32) + 1)


def test_context_manager_restores_what_was_on():
    pycollectives.use_shared_cpu_memory(False)  # whatever PYCOLL_CPU_ALLOCATOR said
    try:
        with pycollectives.shared_cpu_memory():
            inside = torch.empty(MIN)
            with pycollectives.shared_cpu_memory(min_bytes=4 << 20):
                assert not _C._is_peer_mappable(torch.empty(MIN))
                with pycollectives.shared_cpu_memory():  # no min_bytes: keeps 4 MiB
                    assert pycollectives.shared_cpu_memory_stats()["min_bytes"] == 4 << 20
            assert _C._is_peer_mappable(torch.empty(MIN))  # the outer threshold is back
        assert not pycollectives.shared_cpu_memory_stats()["installed"]
        assert _C._is_peer_mappable(inside)
        assert not _C._is_peer_mappable(torch.empty(MIN))
    finally:
        pycollectives.use_shared_cpu_memory(False)
        _C.release_cached_shared_blocks()


def test_freed_blocks_are_reused(allocator):
    before = pycollectives.shared_cpu_memory_stats()
    a = torch.ones(MIN)
    ptr = a.data_ptr()
    del a
    after_free = pycollectives.shared_cpu_memory_stats()
    assert after_free["cached_blocks"] == before["cached_blocks"] + 1
    b = torch.zeros(MIN)  # the same size: the same block (and file) again
    assert b.data_ptr() == ptr
    assert b.sum().item() == 0
    stats = pycollectives.shared_cpu_memory_stats()
    assert stats["reused"] == before["reused"] + 1
    assert stats["live_bytes"] == before["live_bytes"] + MIN * 4
    c = torch.zeros(MIN + 1024)  # another size class (1 MiB + 128 KiB): a new file
    assert c.data_ptr() != ptr
    assert pycollectives.shared_cpu_memory_stats()["made"] == stats["made"] + 1
    del b
    d = torch.zeros(MIN - 1000)  # 4,000 bytes less: the same class (1 MiB), the same block
    assert d.data_ptr() == ptr
    assert pycollectives.shared_cpu_memory_stats()["reused"] == stats["reused"] + 1


def test_cache_is_capped():
    r = _run_script("""
        pycollectives.use_shared_cpu_memory()
        ts = [torch.empty(1 << 20) for _ in range(5)]   # 4 MiB each
        del ts
        s = _C.shared_cpu_allocator_stats()
        assert s["cached_bytes"] <= 10 << 20 and s["cached_blocks"] == 2, s
        assert s["live_blocks"] == 0, s
        print("ok")
    """, env={"PYCOLL_SHARED_CPU_CACHE_BYTES": "10M"})
    assert r.returncode == 0 and "ok" in r.stdout, r.stderr


def test_past_the_file_budget_tensors_are_private():
    """RLIMIT_NOFILE 64 (soft and hard): the allocator may hold 16 files; the rest go to torch's
    allocator, and every tensor works."""
    r = _run_script("""
        pycollectives.use_shared_cpu_memory()
        s = _C.shared_cpu_allocator_stats()
        assert s["file_budget"] == 16, s
        ts = [torch.full((1 << 16,), float(i)) for i in range(20)]
        placed = [_C._is_peer_mappable(t) for t in ts]
        assert placed == [True] * 16 + [False] * 4, placed
        assert [t.sum().item() for t in ts] == [float(i << 16) for i in range(20)]
        s = _C.shared_cpu_allocator_stats()
        assert s["made"] == 16 and s["fallbacks"] == 4, s
        del ts
        # Freed blocks are cached, and a new size may take a cached block's place.
        t = torch.ones(1 << 17)
        assert _C._is_peer_mappable(t), _C.shared_cpu_allocator_stats()
        print("ok")
    """, rlimit_files=(64, 64))
    assert r.returncode == 0 and "ok" in r.stdout, r.stderr


def test_soft_descriptor_limit_is_raised_to_the_hard_one():
    import resource

    hard = min(resource.getrlimit(resource.RLIMIT_NOFILE)[1], 4096)  # a process may lower its hard limit
    r = _run_script(f"""
        import resource
        assert resource.getrlimit(resource.RLIMIT_NOFILE) == (64, {hard})
        pycollectives.use_shared_cpu_memory()
        assert resource.getrlimit(resource.RLIMIT_NOFILE) == ({hard}, {hard})
        assert _C.shared_cpu_allocator_stats()["file_budget"] == {hard // 4}
        print("ok")
    """, rlimit_files=(64, hard))
    assert r.returncode == 0 and "ok" in r.stdout, r.stdout + r.stderr


def test_fork_gives_the_child_private_copies():
    """After fork() the child's copies of live blocks are private (its writes stay its own) and no
    longer peer-mappable; it starts with no cached blocks and never caches an inherited one. The
    parent never reuses a block that was live at the fork: the child still maps its file."""
    r = _run_script("""
        torch.set_num_threads(1)  # no OpenMP pool in the parent: libgomp hangs a forked child that uses it
        pycollectives.use_shared_cpu_memory()
        live = torch.zeros(1 << 16)
        kept = torch.full((1 << 16,), 1.0)
        freed = torch.ones(1 << 16); del freed
        assert _C.shared_cpu_allocator_stats()["cached_blocks"] == 1
        go_r, go_w = os.pipe()
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                s = _C.shared_cpu_allocator_stats()
                assert s["cached_blocks"] == 0, s
                assert not _C._is_peer_mappable(live)
                mine = torch.full((1 << 16,), 7.0)  # a new file, not the parent's cached block
                assert _C._is_peer_mappable(mine)
                assert _C.shared_cpu_allocator_stats()["made"] == s["made"] + 1
                live.fill_(5)
                assert live.eq(5).all()
                del live, mine
                s = _C.shared_cpu_allocator_stats()
                assert s["cached_blocks"] == 1, s   # its own block; the inherited one was dropped
                os.read(go_r, 1)                    # the parent has freed `kept` and allocated again
                assert kept.eq(1).all(), "the parent reused a block the child still maps"
            except BaseException as e:
                print("child:", repr(e), file=sys.stderr)
                code = 1
            os._exit(code)
        del kept                                  # live at the fork: not cached, its file not reused
        assert _C.shared_cpu_allocator_stats()["cached_blocks"] == 1
        again = torch.full((1 << 16,), 9.0)       # takes the block cached before the fork
        other = torch.full((1 << 16,), 9.0)       # a new file
        os.write(go_w, b"x")
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0, "the child failed"
        s = _C.shared_cpu_allocator_stats()
        assert s["reused"] == 1 and s["cached_blocks"] == 0, s
        assert live.eq(0).all(), "the child's write reached the parent"
        assert _C._is_peer_mappable(live)
        print("ok")
    """)
    assert r.returncode == 0 and "ok" in r.stdout, r.stdout + r.stderr


def test_blocks_are_memfd_files():
    """Each block is an unnamed memfd file (nothing in /dev/shm to leak, whatever way the process
    ends), one descriptor per block."""
    r = _run_script("""
        pycollectives.use_shared_cpu_memory()
        ts = [torch.ones(1 << 20) for _ in range(4)]
        targets = [os.readlink(f"/proc/self/fd/{fd}") for fd in os.listdir("/proc/self/fd")
                   if os.path.exists(f"/proc/self/fd/{fd}")]
        print(sum("memfd:pycoll-tensor" in t for t in targets))
    """)
    assert r.returncode == 0 and r.stdout.split() == ["4"], r.stdout + r.stderr


def test_environment_switch():
    r = _run_script("""
        assert _C.shared_cpu_allocator_installed()
        assert _C._is_peer_mappable(torch.empty(1 << 20))
        assert not _C._is_peer_mappable(torch.empty(1 << 17))   # below the 1 MiB asked for
        print("ok")
    """, env={"PYCOLL_CPU_ALLOCATOR": "shared", "PYCOLL_SHARED_CPU_MIN_BYTES": "1M"})
    assert r.returncode == 0 and "ok" in r.stdout, r.stderr
    r = _run_script("pass", env={"PYCOLL_CPU_ALLOCATOR": "sharde"})
    assert r.returncode != 0 and "PYCOLL_CPU_ALLOCATOR" in r.stderr and "sharde" in r.stderr, r.stderr


def _collectives_rank(rank, ws, seed):
    quiet()
    # 64 KiB: the smallest tensors _all_ops passes (a 4-rank all_gather's 75 KiB inputs) are placed.
    pycollectives.use_shared_cpu_memory(min_bytes=64 << 10)
    cases = Cases("shared CPU allocator", rank, ws, seed)
    expected = MAPPED if ws > 1 else None
    # share=False: no share_memory_() call; the allocator alone puts every tensor in shared memory.
    _all_ops(cases, Plans(), rank, ws, False, expected, dtypes=(torch.float32, torch.bfloat16, torch.int32),
             premul_expected=expected)
    return cases.finish()


@pytest.mark.parametrize("ws", [1, 2, 3, 4])
def test_collectives_read_allocated_tensors_in_place(ws, seed):
    run_ranks(ws, _collectives_rank, seed, timeout=600, env={"PYCOLL_CPU_THREADS": "2", "PYCOLL_DEBUG": "INFO"})


def _ddp_rank(rank, ws, seed):
    quiet()
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(seed)
    layers = [torch.nn.Linear(512, 512), torch.nn.ReLU(), torch.nn.Linear(512, 512)]
    ref_model = torch.nn.Sequential(*layers)
    batch = torch.randn(ws * 8, 512, generator=torch.Generator().manual_seed(seed + 1))
    ref_model(batch).square().mean().backward()  # the full batch on one process: the reference
    expected = [p.grad.clone() for p in ref_model.parameters()]
    model = torch.nn.Sequential(*layers)
    for p in model.parameters():
        p.grad = None
    plans = Plans()
    # On for the whole run, not only around DDP(): DDP makes its buckets again, in the order the
    # gradients came, during the second step.
    pycollectives.use_shared_cpu_memory()
    ddp = DDP(model, bucket_cap_mb=1)
    for _ in range(3):
        for p in ddp.parameters():
            p.grad = None
        ddp(batch[rank * 8:(rank + 1) * 8]).square().mean().backward()
    for got, want in zip(ddp.parameters(), expected):
        torch.testing.assert_close(got.grad, want, rtol=1e-4, atol=1e-6)
    got = plans.since("allreduce")  # the bucket all_reduces (1 MiB and more)
    assert len(got) >= 3 and all(p == MAPPED for p in got), got  # at least one per step


@pytest.mark.parametrize("ws", [2, 3])
def test_ddp_buckets_are_read_in_place(ws, seed):
    run_ranks(ws, _ddp_rank, seed, timeout=300, env={"PYCOLL_DEBUG": "INFO"})


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_gpu_copies_and_pinned_memory(allocator):
    """CPU tensors the allocator made copy to and from a GPU; pinned memory is CUDA's, not a file."""
    x = torch.arange(1 << 20, dtype=torch.float32)
    assert _C._is_peer_mappable(x)
    y = x.cuda()
    back = y.cpu()  # a new CPU tensor: the allocator's
    assert _C._is_peer_mappable(back)
    torch.testing.assert_close(back, x)
    pinned = x.pin_memory()
    assert pinned.is_pinned() and not _C._is_peer_mappable(pinned)
    y.copy_(pinned, non_blocking=True)
    torch.cuda.synchronize()
    torch.testing.assert_close(y.cpu(), x)


def _fsdp_rank(rank, ws, seed):
    """FSDP2 (fully_shard) on CPU with the allocator on: its all_gather and reduce_scatter buffers
    are made per step, by the allocator, so both read in place; the parameters after three SGD
    steps equal one process's training on the whole batch."""
    quiet()
    import copy

    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(seed)
    ref = torch.nn.Sequential(torch.nn.Linear(512, 512), torch.nn.ReLU(), torch.nn.Linear(512, 512))
    model = copy.deepcopy(ref)
    pycollectives.use_shared_cpu_memory()
    mesh = init_device_mesh("cpu", (ws,))
    fully_shard(model[0], mesh=mesh)
    fully_shard(model[2], mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    gather_plans, scatter_plans = Plans(), Plans()  # each reads the log once
    for step in range(3):
        batch = torch.randn(ws * 8, 512, generator=torch.Generator().manual_seed(seed + step))
        opt.zero_grad()
        model(batch[rank * 8:(rank + 1) * 8]).square().mean().backward()
        opt.step()
        ref_opt.zero_grad()
        ref(batch).square().mean().backward()
        ref_opt.step()
    for (name, got), want in zip(model.named_parameters(), ref.parameters()):
        torch.testing.assert_close(got.full_tensor(), want.detach(), rtol=1e-4, atol=1e-5, msg=name)
    gathers, scatters = gather_plans.since("allgather"), scatter_plans.since("reduce_scatter")
    assert gathers and all(p == MAPPED for p in gathers), gathers
    assert scatters and all(p == MAPPED for p in scatters), scatters


@pytest.mark.parametrize("ws", [2, 3])
def test_fsdp2_reads_its_buffers_in_place(ws, seed):
    run_ranks(ws, _fsdp_rank, seed, timeout=300, env={"PYCOLL_DEBUG": "INFO"})


class _Samples(torch.utils.data.Dataset):
    """Samples a forked DataLoader worker builds; the worker also writes into a tensor it inherited
    from the rank (a block live at the fork), which must not change the rank's copy."""

    def __init__(self, inherited, n, seed):
        self.inherited, self.n, self.seed = inherited, n, seed

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        self.inherited.fill_(-1.0)
        g = torch.Generator().manual_seed(self.seed * 1000 + i)
        return torch.randn(256, 512, generator=g)  # 512 KiB: the worker's allocator places it


def _dataloader_rank(rank, ws, seed):
    """DDP with the allocator on and a DataLoader whose workers are forked from the rank: every
    step's gradients equal one process's on the whole batch, the bucket all_reduces read in place,
    and the workers' writes into an inherited block stay theirs."""
    quiet()
    import copy
    import multiprocessing

    from torch.nn.parallel import DistributedDataParallel as DDP

    # The harness starts ranks as daemonic processes, which multiprocessing forbids to start
    # children; a rank launched by torchrun is not one.
    multiprocessing.current_process()._config["daemon"] = False
    pycollectives.use_shared_cpu_memory()
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(512, 512), torch.nn.ReLU(), torch.nn.Linear(512, 512))
    ref = copy.deepcopy(model)  # its own parameters and gradients
    ddp = DDP(model, bucket_cap_mb=1)
    inherited = torch.zeros(1 << 17)  # 512 KiB, live when the workers fork
    assert _C._is_peer_mappable(inherited)
    data = _Samples(inherited, 4 * ws, seed)
    loader = torch.utils.data.DataLoader(
        torch.utils.data.Subset(data, range(rank, 4 * ws, ws)), batch_size=2, num_workers=2,
        multiprocessing_context="fork")
    plans = Plans()
    steps = 0
    for i, batch in enumerate(loader):
        x = batch.reshape(-1, 512)
        full = torch.cat([data[j] for j in range(4 * ws) if (j // ws) // 2 == i]).reshape(-1, 512)
        inherited.zero_()  # data[j] above ran in this process and wrote -1
        for p in ddp.parameters():
            p.grad = None
        ddp(x).square().mean().backward()
        ref.zero_grad()
        ref(full).square().mean().backward()
        for got, want in zip(ddp.parameters(), ref.parameters()):
            torch.testing.assert_close(got.grad, want.grad, rtol=1e-4, atol=1e-6)
        assert inherited.eq(0).all(), "a forked worker's write reached the rank"
        steps += 1
    assert steps == 2, steps
    got = plans.since("allreduce")
    assert got and all(p == MAPPED for p in got), got


def test_ddp_with_forked_dataloader_workers(seed):
    run_ranks(2, _dataloader_rank, seed, timeout=300, env={"PYCOLL_DEBUG": "INFO"})
