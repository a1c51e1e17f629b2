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


def _reaches_init():
    """Whether this process's parents lead to pid 1 (not under docker exec or nsenter, whose parent
    lies outside this PID namespace and reads as 0)."""
    pid = os.getpid()
    while pid > 1:
        with open(f"/proc/{pid}/stat") as f:
            pid = int(f.read().rsplit(")", 1)[1].split()[1])
    return pid == 1


@pytest.fixture
def tree():
    """This process (P) with children A and B, each with a child, A1 and B1:
    {"P", "A", "A1", "B", "B1"} -> pid."""
    sleeper = [sys.executable, "-c", "import time; time.sleep(120)"]
    parent = [sys.executable, "-c",
              "import subprocess, sys, time\n"
              f"p = subprocess.Popen({sleeper!r})\n"
              "print(p.pid, flush=True)\n"
              "time.sleep(120)\n"]
    a = subprocess.Popen(parent, stdout=subprocess.PIPE, text=True)
    b = subprocess.Popen(parent, stdout=subprocess.PIPE, text=True)
    grandchildren = []
    try:
        grandchildren = [int(a.stdout.readline()), int(b.stdout.readline())]
        yield {"P": os.getpid(), "A": a.pid, "A1": grandchildren[0], "B": b.pid, "B1": grandchildren[1]}
    finally:
        for p in (a, b):
            p.kill()
            p.wait()
        for pid in grandchildren:
            try:
                os.kill(pid, 9)
            except ProcessLookupError:
                pass


def test_nearest_common_ancestor_of_a_process_tree(tree):
    lca = _C()._test_nearest_common_ancestor
    P, A, A1, B, B1 = tree["P"], tree["A"], tree["A1"], tree["B"], tree["B1"]
    assert lca([A1, B]) == P  # cousins: their grandparent / parent
    assert lca([B, A1]) == P
    assert lca([A, A1]) == A  # a process and its descendant: the process itself
    assert lca([A1, A, B]) == P
    assert lca([A1]) == A1
    assert lca([A, B, P]) == P
    assert lca([A1, B1]) == P
    assert lca([A1, 1]) == (1 if _reaches_init() else 0)  # everything descends from init, if seen
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


def test_scope_1_never_names_an_ancestor_that_started_no_rank(tree):
    """Ranks started apart (here cousins): their common ancestor, a session manager or server in
    real life, would open them to most of the user's processes."""
    tracer, what = _C()._test_choose_ptracer([tree["A1"], tree["B1"]], 1)
    assert tracer == 0 and f"process {tree['P']} (" in what and "nor started one" in what, what
    tracer, _ = _C()._test_choose_ptracer([tree["A1"], tree["B1"], tree["B"]], 1)  # P started B
    assert tracer == tree["P"]


def test_scope_1_never_names_the_hosts_init_nor_a_lost_ancestor(tree):
    tracer, what = _C()._test_choose_ptracer([tree["A1"], 1], 1)
    if not _reaches_init():  # docker exec, nsenter: pid 1 is no ancestor seen from here
        assert tracer == 0 and "no common ancestor" in what, what
    elif os.readlink("/proc/self/ns/pid") == INITIAL_PID_NAMESPACE:
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
