"""Spawn N real ranks, run a function in each, and report any rank's failure.

    results = run_ranks(world_size, fn, *args, timeout=120, env=None)

`fn` must be a module-level function (it is pickled by reference); it is
called as ``fn(rank, world_size, *args)`` in every rank after
``dist.init_process_group(BACKEND, store=..., rank=rank, world_size=...)``,
and the process group is destroyed when it returns.  The list of the ranks'
return values (which must pickle; tensors travel by value) comes back in
rank order.

Failure handling (the parent never hangs):
  * a rank that raises sends its exception type, message and full traceback
    to the parent; the parent gives the other ranks ``grace`` seconds to
    finish or fail too, kills the rest, and raises ``RankError`` naming the
    rank that failed first, with its traceback, and what every other rank did;
  * a rank that dies (signal, os._exit, segfault) is reported with its exit
    status and whatever faulthandler wrote for it;
  * when ``timeout`` passes, every rank still running is asked for its Python
    stack (SIGUSR1 -> faulthandler), then SIGKILLed, and reported as hung;
  * every child is SIGKILLed in a ``finally``, and each child also dies with
    its parent (PR_SET_PDEATHSIG), so an interrupted pytest leaves nothing.

Start method: "forkserver" with torch preloaded (about 0.1 s per rank instead
of 2-3 s for a fresh interpreter on the CI machine).  The children are forked
from a clean single-threaded server, never from pytest, so this is as safe as
"spawn".  Because torch is already imported in the server, `env` is applied
before the backend (pycollectives) is imported but after torch is: a variable
read by torch at import time needs ``start_method="spawn"``.  Set
PYCOLL_TEST_START_METHOD=spawn to force spawn everywhere.

The backend under test is $PYCOLL_TEST_BACKEND ("pycoll" by default; "gloo"
to develop the suite before the extension builds).  A rank's stdout/stderr go
to a log file whose tail is shown when that rank fails.
"""

import ctypes
import datetime
import faulthandler
import glob
import multiprocessing
import multiprocessing.connection
import os
import pickle
import re
import shutil
import signal
import socket
import sys
import tempfile
import time
import traceback

BACKEND = os.environ.get("PYCOLL_TEST_BACKEND", "pycoll")
IS_GLOO = BACKEND == "gloo"

# Algorithm names the backend accepts in PYCOLL_ALGO and pycollectives.set_algo.
ALGOS = ("ring", "tree", "oneshot", "twoshot", "auto")

SHM_GLOB = "/dev/shm/pycoll*"


class RankError(Exception):
    """One or more ranks failed.  `rank` is the first failing rank (or None
    when every failure was a hang), `exc_type` the name of its exception
    type (or None when it died or hung), `statuses` a dict rank -> status
    string, `pids` the children's pids (all killed by the time this is
    raised)."""

    def __init__(self, message, rank=None, exc_type=None, statuses=None, pids=()):
        super().__init__(message)
        self.rank = rank
        self.exc_type = exc_type
        self.statuses = statuses or {}
        self.pids = list(pids)


def shm_listing():
    """Names under /dev/shm that belong to pycoll (any job)."""
    return set(glob.glob(SHM_GLOB))


def shm_mapped(pid="self"):
    """{path: still_linked} of the pycoll segments process `pid` maps."""
    found = {}
    try:
        with open(f"/proc/{pid}/maps") as f:
            for line in f:
                i = line.find("/dev/shm/pycoll")
                if i >= 0:
                    path = line[i:].rstrip("\n")
                    deleted = path.endswith(" (deleted)")
                    found[path[: -len(" (deleted)")] if deleted else path] = not deleted
    except OSError:  # the process is gone, or not ours to read
        pass
    return found


def shm_leftovers(before):
    """pycoll segments that appeared since `before` and that no living
    process maps: leaked (a concurrent job's segments are mapped by it)."""
    new = shm_listing() - before
    if not new:
        return []
    mapped = set()
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            mapped.update(shm_mapped(pid))
    return sorted(new - mapped)


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def set_algo(algo):
    """Force an algorithm in this rank (no-op for None).  pycoll only."""
    if algo is None:
        return
    import pycollectives

    pycollectives.set_algo(algo)


def quiet():
    """Silence torch's FutureWarning and UserWarning in this rank (its log stays readable)."""
    import warnings

    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", category=UserWarning)


# --------------------------------------------------------------------------
# child side


_keep_open = []  # faulthandler needs its file objects to stay alive


def _die_with_parent():
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    except Exception:
        pass


def _send(conn, msg):
    # Plain pickle, not multiprocessing's: that one would share a tensor's
    # storage through a file descriptor, which dies with this process.
    conn.send_bytes(pickle.dumps(msg))


def _child_main(rank, world_size, fn, args, cfg, conn):
    _die_with_parent()
    # Output to per-rank files: the parent shows their tails on failure.
    log_fd = os.open(cfg["log"] % rank, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(log_fd, 1)
    os.dup2(log_fd, 2)
    os.close(log_fd)
    stack_file = open(cfg["stack"] % rank, "w")
    _keep_open.append(stack_file)
    faulthandler.enable(file=stack_file, all_threads=True)
    faulthandler.register(signal.SIGUSR1, file=stack_file, all_threads=True, chain=False)

    try:
        os.environ.update(cfg["env"])
        os.environ.update(cfg["rank_env"][rank] if cfg["rank_env"] else {})
        os.environ["PYCOLL_TEST_RANK"] = str(rank)
        os.environ["PYCOLL_TEST_LOG"] = cfg["log"] % rank  # this rank's stdout+stderr
        import torch

        torch.set_num_threads(1)  # up to 4 ranks share 2 cores in CI
        import torch.distributed as dist

        if cfg["backend"] == "pycoll":
            import pycollectives  # noqa: F401  (registers "pycoll")

        init = cfg["init"]
        if init is not None:
            kwargs = {}
            if cfg["pg_timeout"] is not None:
                kwargs["timeout"] = cfg["pg_timeout"]
            if cfg["bind_cuda"]:
                # rank r on GPU r % count: several ranks share a GPU where there are fewer GPUs
                kwargs["device_id"] = torch.device("cuda", rank % max(1, torch.cuda.device_count()))
            if init == "file":
                store = dist.FileStore(cfg["store_path"], world_size)
            elif init == "tcp":
                store = dist.TCPStore(
                    "127.0.0.1", cfg["store_port"], world_size, is_master=False,
                    timeout=datetime.timedelta(seconds=60),
                )
            else:
                raise ValueError(f"unknown init {init!r}")
            dist.init_process_group(
                cfg["backend"], store=store, rank=rank, world_size=world_size, **kwargs
            )
        result = fn(rank, world_size, *args)
        if cfg["destroy"] and dist.is_initialized():
            dist.destroy_process_group()
        _send(conn, ("ok", result))
        conn.close()
    except BaseException as e:  # noqa: BLE001 -- everything goes to the parent
        try:
            _send(conn, ("error", type(e).__qualname__, str(e), traceback.format_exc()))
            conn.close()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            # Do not run teardown (it may wait on peers that are gone).
            os._exit(1)
    sys.stdout.flush()
    sys.stderr.flush()


# --------------------------------------------------------------------------
# parent side

_CTX = None


def _context(start_method):
    global _CTX
    method = start_method or os.environ.get("PYCOLL_TEST_START_METHOD", "forkserver")
    if method != "forkserver":
        return multiprocessing.get_context(method)
    if _CTX is None:
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload(["torch", "torch.distributed"])
        _CTX = ctx
    return _CTX


def _tail(path, limit=3000):
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError:
        return ""
    text = data.decode("utf-8", "replace").strip()
    if len(text) > limit:
        text = "...\n" + text[-limit:]
    return text


def _exit_text(code):
    if code is None:
        return "still running"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


def run_ranks(
    world_size,
    fn,
    *args,
    timeout=120,
    env=None,
    init="file",
    pg_timeout=None,
    expect_exit=None,
    destroy=True,
    grace=5.0,
    start_method=None,
    backend=None,
    rank_env=None,
    bind_cuda=False,
):
    """Run ``fn(rank, world_size, *args)`` in `world_size` processes.

    init: "file" (FileStore in a fresh temp dir, the default), "tcp" (a
        TCPStore hosted by this process) or None (fn initialises itself; the
        backend module is still imported first).
    pg_timeout: timedelta passed to init_process_group.
    expect_exit: {rank: exit status} for ranks that are meant to leave
        without returning (os._exit(code) -> code, SIGKILL -> -9).
    destroy: call destroy_process_group after fn returns.
    backend: override $PYCOLL_TEST_BACKEND (e.g. "gloo" for a reference run).
    rank_env: one dict per rank of environment variables set in that rank only (e.g.
        PYCOLL_HOSTID, to place ranks on simulated hosts).
    grace: seconds the other ranks get to finish after a rank fails.
    bind_cuda: init_process_group(device_id=cuda:<rank % GPUs>): the groups' CUDA engines (the world's and
        every new_group's) are made at init, not at each group's first CUDA op.
    Returns the list of return values (None for ranks in expect_exit).
    """
    expect_exit = dict(expect_exit or {})
    tmpdir = tempfile.mkdtemp(prefix="pycoll-test-")
    cfg = {
        "backend": backend or BACKEND,
        "env": {k: str(v) for k, v in (env or {}).items()},
        "rank_env": [{k: str(v) for k, v in e.items()} for e in rank_env] if rank_env else None,
        "init": init,
        "pg_timeout": pg_timeout,
        "destroy": destroy,
        "bind_cuda": bind_cuda,
        "store_path": os.path.join(tmpdir, "store"),
        "store_port": None,
        "log": os.path.join(tmpdir, "rank%d.log"),
        "stack": os.path.join(tmpdir, "rank%d.stack"),
    }
    tcp_store = None
    if init == "tcp":
        import torch.distributed as dist

        tcp_store = dist.TCPStore(
            "127.0.0.1", 0, world_size, is_master=True, wait_for_workers=False,
            timeout=datetime.timedelta(seconds=60),
        )
        cfg["store_port"] = tcp_store.port

    ctx = _context(start_method)
    procs, conns = [], []
    try:
        for rank in range(world_size):
            r_end, w_end = ctx.Pipe(duplex=False)
            p = ctx.Process(
                target=_child_main,
                args=(rank, world_size, fn, args, cfg, w_end),
                name=f"rank{rank}",
                daemon=True,
            )
            p.start()
            w_end.close()
            procs.append(p)
            conns.append(r_end)
        return _supervise(procs, conns, world_size, fn, timeout, grace, expect_exit, cfg)
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
        for p in procs:
            p.join(10)
        for c in conns:
            c.close()
        del tcp_store
        shutil.rmtree(tmpdir, ignore_errors=True)


def _supervise(procs, conns, world_size, fn, timeout, grace, expect_exit, cfg):
    start = time.monotonic()
    deadline = start + timeout
    results = {}  # rank -> value
    errors = {}  # rank -> (seq, type, message, traceback)
    exitcodes = {}  # rank -> exit status once the process is gone
    conn_open = [True] * world_size
    first_error_at = None

    def take(rank):
        nonlocal first_error_at
        try:
            msg = pickle.loads(conns[rank].recv_bytes())
        except (EOFError, OSError):
            conn_open[rank] = False
            return
        if msg[0] == "ok":
            results[rank] = msg[1]
        else:
            errors[rank] = (len(errors),) + tuple(msg[1:])
            if first_error_at is None:
                first_error_at = time.monotonic()

    while len(exitcodes) < world_size:
        now = time.monotonic()
        limit = deadline
        if first_error_at is not None:
            limit = min(limit, first_error_at + grace)
        if now >= limit:
            break
        waitables = {}
        for r in range(world_size):
            if r in exitcodes:
                continue
            waitables[procs[r].sentinel] = ("exit", r)
            if conn_open[r]:
                waitables[conns[r]] = ("msg", r)
        for obj in multiprocessing.connection.wait(list(waitables), timeout=limit - now):
            kind, r = waitables[obj]
            if kind == "msg":
                take(r)
            else:
                while conn_open[r] and conns[r].poll():
                    take(r)
                procs[r].join()
                exitcodes[r] = procs[r].exitcode
                if r not in errors and r not in results and r not in expect_exit:
                    # Died without a word: that is a failure like any other.
                    if first_error_at is None:
                        first_error_at = time.monotonic()

    hung = [r for r in range(world_size) if r not in exitcodes]
    if hung:
        for r in hung:  # ask for Python stacks before killing
            try:
                os.kill(procs[r].pid, signal.SIGUSR1)
            except ProcessLookupError:
                pass
        time.sleep(1.0)
        for r in hung:
            while conn_open[r] and conns[r].poll():
                take(r)
            procs[r].kill()
            procs[r].join(10)

    statuses, failed = {}, []
    elapsed = time.monotonic() - start
    timed_out = first_error_at is None
    for r in range(world_size):
        code = exitcodes.get(r)
        if r in errors:
            _, etype, emsg, _ = errors[r]
            first_line = (emsg.splitlines() or [""])[0][:300]
            statuses[r] = f"raised {etype}: {first_line}"
            failed.append(r)
        elif r in hung:
            if timed_out:
                statuses[r] = f"hung: did not finish within {timeout}s, killed"
            else:
                statuses[r] = f"still running {grace}s after another rank failed, killed"
            failed.append(r)
        elif r in expect_exit:
            if code == expect_exit[r] and r not in results:
                statuses[r] = f"left as expected ({_exit_text(code)})"
            else:
                how = "returned normally" if r in results else _exit_text(code)
                statuses[r] = f"expected to leave with {_exit_text(expect_exit[r])}, but {how}"
                failed.append(r)
        elif r in results and code == 0:
            statuses[r] = "ok"
        elif r in results:
            statuses[r] = f"returned, then {_exit_text(code)} (crash in teardown?)"
            failed.append(r)
        else:
            statuses[r] = f"died without reporting: {_exit_text(code)}"
            failed.append(r)

    if not failed:
        return [results.get(r) for r in range(world_size)]

    # The rank that raised first is usually the cause; then one that died;
    # else the hung ones.
    raised = sorted((errors[r][0], r) for r in failed if r in errors)
    died = [r for r in failed if r not in errors and r not in hung]
    if raised:
        primary = raised[0][1]
    elif died:
        primary = died[0]
    else:
        primary = failed[0]

    name = getattr(fn, "__qualname__", repr(fn))
    lines = [
        f"{name} failed on rank {primary} of {world_size} "
        f"(backend {cfg['backend']}, after {elapsed:.1f}s): {statuses[primary]}"
    ]
    if primary in errors:
        lines += ["", f"--- rank {primary} traceback ---", errors[primary][3].rstrip()]
    lines += ["", "--- all ranks ---"]
    lines += [f"rank {r}: {statuses[r]}" for r in range(world_size)]
    def gist(r):  # an error's text without rank numbers, to skip repeats
        return re.sub(r"\d+", "#", f"{errors[r][1]}: {errors[r][2]}")

    shown = {gist(primary)} if primary in errors else set()
    for r in failed:
        detail = r == primary or r not in errors or gist(r) not in shown
        if r != primary and r in errors and detail:
            shown.add(gist(r))
            lines += ["", f"--- rank {r} traceback ---", errors[r][3].rstrip()]
        if not detail:
            continue
        stack = _tail(cfg["stack"] % r)
        if stack:
            lines += ["", f"--- rank {r} stack (faulthandler) ---", stack]
        log = _tail(cfg["log"] % r)
        if log:
            lines += ["", f"--- rank {r} output (tail) ---", log]
    raise RankError(
        "\n".join(lines),
        rank=primary if primary in errors or primary in died else None,
        exc_type=errors[primary][1] if primary in errors else None,
        statuses=statuses,
        pids=[p.pid for p in procs],
    )
