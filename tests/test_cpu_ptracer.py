"""Naming a tracer for the ranks on a host under Yama's ptrace_scope=1 (csrc/common/ptracer.h), so
that sibling ranks may read each other in place with cross-memory attach.

The ancestry is checked on a real process tree built here; the choice for each Yama scope through
the test hook _C._test_choose_ptracer (it names nothing); the engine's own declaration through the
debug log of real ranks. Where this host runs Yama at scope 1 and the tests run without
CAP_SYS_PTRACE, test_cpu_peer_read's in-place cases are the end-to-end check: without the
declaration every sibling read fails there with EPERM.
"""
import os
import subprocess
import sys

import pytest

from ranks import quiet, run_ranks

pytestmark = pytest.mark.pycoll_only

INITIAL_PID_NAMESPACE = "pid:[4026531836]"  # the kernel's PROC_PID_INIT_INO
NAMED = "Yama ptrace_scope=1: named process "


def _C():
    from pycollectives import _C as c

    return c


@pytest.fixture
def tree():
    """This process (P) with children A and B, and A's child A1: {"P", "A", "A1", "B"} -> pid."""
    sleeper = [sys.executable, "-c", "import time; time.sleep(120)"]
    a = subprocess.Popen([sys.executable, "-c",
                          "import subprocess, sys, time\n"
                          f"p = subprocess.Popen({sleeper!r})\n"
                          "print(p.pid, flush=True)\n"
                          "time.sleep(120)\n"], stdout=subprocess.PIPE, text=True)
    b = subprocess.Popen(sleeper)
    try:
        a1 = int(a.stdout.readline())
        yield {"P": os.getpid(), "A": a.pid, "A1": a1, "B": b.pid}
    finally:
        for p in (a, b):
            p.kill()
            p.wait()
        try:
            os.kill(a1, 9)
        except (ProcessLookupError, UnboundLocalError):
            pass


def test_nearest_common_ancestor_of_a_process_tree(tree):
    lca = _C()._test_nearest_common_ancestor
    P, A, A1, B = tree["P"], tree["A"], tree["A1"], tree["B"]
    assert lca([A1, B]) == P  # cousins: their grandparent / parent
    assert lca([B, A1]) == P
    assert lca([A, A1]) == A  # a process and its descendant: the process itself
    assert lca([A1, A, B]) == P
    assert lca([A1]) == A1
    assert lca([A, B, P]) == P
    assert lca([A1, 1]) == 1  # everything descends from init
    assert lca([A1, 2 ** 31]) == 0  # no such process: none found
    assert lca([]) == 0


@pytest.mark.parametrize("scope", [-1, 0, 2, 3])
def test_no_tracer_named_outside_scope_1(tree, scope):
    """No Yama, scope 0 (no restriction) and scopes 2-3 (a declaration does not help) name nothing."""
    assert tuple(_C()._test_choose_ptracer([tree["A1"], tree["B"]], scope)) == (0, "")


def test_scope_1_names_the_nearest_common_ancestor(tree):
    tracer, what = _C()._test_choose_ptracer([tree["A1"], tree["B"]], 1)
    assert tracer == tree["P"]
    with open(f"/proc/{tree['P']}/comm") as f:
        name = f.read().strip()
    assert what.startswith(f"{NAMED}{tree['P']} ({name}), "), what  # with its name from /proc
    assert tuple(_C()._test_choose_ptracer([tree["A1"]], 1)) == (0, "")  # one rank reads no peer


def test_scope_1_never_names_the_hosts_init_nor_a_lost_ancestor(tree):
    tracer, what = _C()._test_choose_ptracer([tree["A1"], 1], 1)
    if os.readlink("/proc/self/ns/pid") == INITIAL_PID_NAMESPACE:
        assert (tracer, "share no ancestor but init" in what) == (0, True), what
    else:  # pid 1 of a container is its launcher: naming it exposes only the container's processes
        assert (tracer, what.startswith(f"{NAMED}1 (")) == (1, True), what
    tracer, what = _C()._test_choose_ptracer([tree["A1"], 2 ** 31], 1)
    assert tracer == 0 and "no common ancestor" in what, what


def _declaration_rank(rank, ws):
    quiet()
    from pycollectives import _C as c
    import torch
    import torch.distributed as dist

    x = torch.ones(1 << 16)
    dist.all_reduce(x)  # the engine's transport, and with it the declaration, comes with the first op
    sys.stderr.flush()
    with open(os.environ["PYCOLL_TEST_LOG"], errors="replace") as f:
        lines = [line for line in f if "Yama ptrace_scope" in line]
    return c._yama_ptrace_scope(), os.getppid(), os.environ.get("PYCOLL_CPU_PEER_READ"), lines


@pytest.mark.parametrize("mode", ["on", "off"])
def test_engine_names_the_ranks_launcher_under_scope_1_only(mode):
    """The ranks (siblings, children of one launcher) name it where Yama runs at scope 1 and
    their setting may read in place; elsewhere, or with PYCOLL_CPU_PEER_READ=off, they log nothing."""
    results = run_ranks(3, _declaration_rank, timeout=120,
                        env={"PYCOLL_CPU_PEER_READ": mode, "PYCOLL_DEBUG": "INFO"})
    for rank, (scope, parent, got_mode, lines) in enumerate(results):
        assert got_mode == mode
        if scope == 1 and mode == "on":
            assert len(lines) == 1 and f"{NAMED}{parent} (" in lines[0], (rank, parent, lines)
        else:
            assert lines == [], (rank, scope, lines)


def test_sibling_ranks_read_each_other_in_place_under_scope_1():
    """End to end where Yama runs at scope 1 (run it without CAP_SYS_PTRACE, e.g. as an unprivileged
    user, for it to mean something): two sibling ranks read each other in place. Without the
    declaration every read between them fails with EPERM there."""
    scope = _C()._yama_ptrace_scope()
    if scope != 1:
        pytest.skip(f"Yama's ptrace_scope here is {scope} (-1: no Yama), not 1: siblings need no tracer named")
    from cross_memory_attach import why_not

    assert why_not() is None
