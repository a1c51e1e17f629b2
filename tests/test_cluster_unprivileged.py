"""pycoll-cluster run by an unprivileged user, end to end: uid and gid 65534, no supplementary
groups, no capabilities, in the machine's own user namespace. pycoll-cluster then makes its own
user, network and mount namespaces (unprivileged user namespaces), or, where the kernel forbids
them, refuses with a message saying so.

The tests are started by root (as CI runs them) and drop to uid 65534 with setpriv. The Python
they run may live where uid 65534 cannot enter (pyenv under /root, mode 700): each run happens in
a private mount namespace of its own where every such directory is covered by a world-traversable
one holding bind mounts of just the entries on the way to the interpreter, its prefix and this
repository. The paths stay the same (the interpreter's RUNPATH to libpython, the editable install,
sys.path), the machine's directories are not touched, and the mounts go with the run's processes.
"""

import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time

import pytest

from pycollectives.cluster import links

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOBODY = 65534
NS_KINDS = ("user", "net", "mnt", "uts")

needs_root = pytest.mark.skipif(
    os.geteuid() != 0 or not all(shutil.which(t) for t in ("setpriv", "unshare", "mount", "ip", "tc")),
    reason="needs root (to drop to uid 65534) and setpriv, unshare, mount, ip, tc")

# What the ranks run: an all_reduce on pycoll, checked; each rank writes what it saw to OUT/rank<r>.json.
RANK_SCRIPT = r'''
import json, os, sys
import torch
import torch.distributed as dist
import pycollectives

dist.init_process_group("pycoll")
rank, world = dist.get_rank(), dist.get_world_size()
x = torch.arange(65536, dtype=torch.float32) * (rank + 1)
dist.all_reduce(x)
ok = torch.equal(x, torch.arange(65536, dtype=torch.float32) * (world * (world + 1) // 2))
dist.destroy_process_group()
with open(os.path.join(sys.argv[1], f"rank{rank}.json"), "w") as fh:
    json.dump({"rank": rank, "world": world, "ok": ok, "hostname": os.uname().nodename,
               "uid_map": open("/proc/self/uid_map").read().split(),
               "ns": {k: os.readlink(f"/proc/self/ns/{k}") for k in %r},
               "pycollectives": pycollectives.__file__, "extension": pycollectives._C.__file__,
               "link": os.environ.get("PYCOLL_LINK"), "measured": os.environ.get("PYCOLL_LINK_MEASURED")}, fh)
''' % (NS_KINDS,)


def _closed_dirs(path):
    """The directories on the way to ``path`` (itself included) that others may not enter."""
    out, d = [], "/"
    for name in os.path.realpath(path).strip("/").split("/") + [None]:
        if os.path.isdir(d) and not os.stat(d).st_mode & stat.S_IXOTH:
            out.append((d, name))
        if name is None:
            break
        d = os.path.join(d, name)
    return out


class Nobody:
    """Runs commands as uid 65534 in a private mount namespace made by root, where the
    interpreter and this repository are reachable (see the module's docstring)."""

    def __init__(self):
        self.tmp = tempfile.mkdtemp(prefix="pycoll-unprivileged-")
        os.chmod(self.tmp, 0o755)
        self.home = os.path.join(self.tmp, "home")  # HOME, the ranks' script and results: uid 65534's
        os.mkdir(self.home)
        os.chown(self.home, NOBODY, NOBODY)
        covers = {}
        for path in {sys.executable, os.path.realpath(sys.executable), sys.prefix, sys.base_prefix, ROOT}:
            closed = _closed_dirs(path)
            assert len(closed) <= 1, f"more than one closed directory on the way to {path}: {closed}"
            for d, name in closed:
                assert name is not None, f"{path} itself is closed to others"
                covers.setdefault(d, set()).add(name)
        lines = []
        for i, (d, names) in enumerate(sorted(covers.items())):
            cover = os.path.join(self.tmp, f"cover{i}")
            os.mkdir(cover, 0o755)
            for name in sorted(names):
                src = os.path.join(d, name)
                if os.path.isdir(src):
                    os.mkdir(os.path.join(cover, name), 0o755)
                else:
                    open(os.path.join(cover, name), "w").close()
                lines.append(f"mount --bind '{src}' '{cover}/{name}'")
            lines.append(f"mount --rbind '{cover}' '{d}'")
        self.covers = sorted(covers)
        self.mounts = "\n".join(lines)
        self.env = dict(os.environ, HOME=self.home, USER="nobody", LOGNAME="nobody", PYTHONPATH=ROOT,
                        PYTHONDONTWRITEBYTECODE="1")
        self.env.pop("TMPDIR", None)

    def popen(self, argv, forbid_userns=False, **kw):
        """``argv`` as uid 65534. ``forbid_userns``: inside a user namespace of root's (uids 0 and
        65534 mapped to themselves) whose user.max_user_namespaces is 0, as where the kernel has
        user namespaces turned off, without changing the machine's setting."""
        script = "set -e\n"
        if forbid_userns:
            script += "echo 0 > /proc/sys/user/max_user_namespaces\n"
        script += self.mounts + "\n"
        script += f"exec setpriv --reuid {NOBODY} --regid {NOBODY} --clear-groups --inh-caps=-all -- \"$@\"\n"
        cmd = ["sh", "-c", script, "sh"] + list(argv)
        if forbid_userns:  # the shell is started again once the user namespace has its uid and gid maps
            cmd = ["unshare", "--user", "--mount", "--propagation", "private", "--", "sh", "-c",
                   "read go && exec \"$@\"", "sh"] + cmd
        else:
            cmd = ["unshare", "--mount", "--propagation", "private", "--"] + cmd
        p = subprocess.Popen(cmd, env=self.env, cwd=ROOT, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             stdin=subprocess.PIPE if forbid_userns else subprocess.DEVNULL, **kw)
        if forbid_userns:
            mine = os.readlink("/proc/self/ns/user")
            deadline = time.monotonic() + 10
            while os.readlink(f"/proc/{p.pid}/ns/user") == mine:
                assert time.monotonic() < deadline, "unshare --user did not make its user namespace"
                time.sleep(0.01)
            for kind in ("uid", "gid"):
                with open(f"/proc/{p.pid}/{kind}_map", "w") as fh:
                    fh.write(f"0 0 1\n{NOBODY} {NOBODY} 1\n")
            p.stdin.write("go\n")
            p.stdin.close()
            p.stdin = None
        return p

    def run(self, argv, timeout, **kw):
        p = self.popen(argv, **kw)
        try:
            out, err = p.communicate(timeout=timeout)
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()
        return p.returncode, out, err

    def cluster(self, args, command):
        return [sys.executable, "-m", "pycollectives.cluster"] + list(args) + ["--"] + list(command)

    def close(self):
        shutil.rmtree(self.tmp, ignore_errors=True)


@pytest.fixture
def nobody():
    n = Nobody()
    try:
        yield n
    finally:
        n.close()


def _owned_by_nobody(directory, prefix=""):
    out = []
    for name in os.listdir(directory):
        try:
            if name.startswith(prefix) and os.lstat(os.path.join(directory, name)).st_uid == NOBODY:
                out.append(name)
        except FileNotFoundError:
            pass
    return sorted(out)


def _leftovers():
    """What an unprivileged run could leave: processes of uid 65534 of pycoll-cluster, namespaces,
    interfaces or qdiscs of ours in root's view, uid 65534's files in /dev/shm and its run
    directories in /tmp, tmpfs mounts of ours."""
    out = {"namespaces": links.ours(links.list_namespaces())}
    ps = subprocess.run(["ps", "-u", str(NOBODY), "-o", "pid=,args="], capture_output=True, text=True).stdout
    out["processes"] = [line for line in ps.splitlines()
                        if "pycollectives.cluster" in line or "agent.py" in line or "pycoll-unprivileged-" in line]
    ip = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    out["links"] = [line for line in ip.splitlines() if "pcl0" in line or "br0" in line]
    tc = subprocess.run(["tc", "qdisc", "show"], capture_output=True, text=True).stdout
    out["qdiscs"] = [line for line in tc.splitlines() if "tbf" in line or "netem" in line]
    out["shm"] = _owned_by_nobody("/dev/shm")
    out["rundirs"] = _owned_by_nobody(tempfile.gettempdir(), "pycoll-cluster-")
    with open("/proc/mounts") as fh:
        out["mounts"] = [line for line in fh if "pycoll-cluster" in line]
    return {k: v for k, v in out.items() if v}


def _processes_in(ns_ids):
    """Processes of this machine inside any of the namespaces ``ns_ids`` ("net:[4026532...]")."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        for kind in NS_KINDS:
            try:
                if os.readlink(f"/proc/{pid}/ns/{kind}") in ns_ids:
                    found.append((int(pid), kind))
            except OSError:
                pass
    return found


def _started(pid):
    with open(f"/proc/{pid}/stat") as fh:
        return fh.read().rsplit(")", 1)[1].split()[19]  # starttime: a pid reused later is not ours


def _tree(pid):
    """{pid: start time} of ``pid`` and its descendants."""
    children = {}
    for p in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{p}/stat") as fh:
                children.setdefault(int(fh.read().rsplit(")", 1)[1].split()[1]), []).append(int(p))
        except OSError:
            pass
    out, todo = {}, [pid]
    while todo:
        q = todo.pop()
        try:
            out[q] = _started(q)
        except OSError:
            continue
        todo += children.get(q, [])
    return out


def _kill(tree):
    for pid, started in tree.items():
        try:
            if _started(pid) == started:
                os.kill(pid, signal.SIGKILL)
        except (OSError, IndexError):
            pass


def _userns_allowed(nobody):
    """Whether uid 65534 may make a user namespace with network and mount namespaces here."""
    rc, _, _ = nobody.run(["unshare", "--user", "--map-root-user", "--net", "--mount", "true"], timeout=30)
    return rc == 0


@needs_root
def test_unprivileged_user_runs_a_2_host_cluster_and_leaves_nothing(nobody):
    before = _leftovers()
    with open(os.path.join(nobody.home, "allreduce.py"), "w") as fh:
        fh.write(RANK_SCRIPT)
    allowed = _userns_allowed(nobody)
    rc, out, err = nobody.run(nobody.cluster(["--hosts", "2", "--nproc-per-host", "1", "--link", "1gbit"],
                                             [sys.executable, os.path.join(nobody.home, "allreduce.py"), nobody.home]),
                              timeout=120)
    if not allowed:  # the kernel forbids unprivileged user namespaces: the refusal says so
        assert rc == 2, (rc, err[-3000:])
        assert "needs root or unprivileged user namespaces" in err and f"not root (uid {NOBODY})" in err, err
        assert _leftovers() == before
        return
    assert rc == 0, (rc, err[-3000:])
    assert "measured" in err, err[-2000:]
    ranks = [json.load(open(os.path.join(nobody.home, f"rank{r}.json"))) for r in range(2)]
    mine = {k: os.readlink(f"/proc/self/ns/{k}") for k in NS_KINDS}
    for r in ranks:
        assert r["ok"] and r["world"] == 2, r
        assert r["hostname"] == f"pcl-host{r['rank']}", r
        # In a user namespace that uid 65534 made (root inside is uid 65534 outside, nothing else mapped).
        assert r["uid_map"] == ["0", str(NOBODY), "1"], r
        assert all(r["ns"][k] != mine[k] for k in NS_KINDS), (r["ns"], mine)
        # pycollectives and its extension from this repository, through the same paths.
        assert r["pycollectives"] == os.path.join(ROOT, "pycollectives", "__init__.py"), r
        assert os.path.dirname(r["extension"]) == os.path.join(ROOT, "pycollectives"), r
        assert r["link"] == "1gbit" and 0.9e9 <= float(r["measured"]) <= 1.1e9, r
    assert ranks[0]["ns"]["user"] == ranks[1]["ns"]["user"]        # one user namespace for the run,
    assert ranks[0]["ns"]["net"] != ranks[1]["ns"]["net"]          # a network namespace per host
    assert ranks[0]["ns"]["mnt"] != ranks[1]["ns"]["mnt"]          # and a mount namespace per host
    ns_ids = {v for r in ranks for v in r["ns"].values()}
    assert _processes_in(ns_ids) == []                             # gone with the run: nothing holds them
    assert _leftovers() == before


@needs_root
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGKILL], ids=["SIGINT", "SIGTERM", "SIGKILL"])
def test_unprivileged_launcher_stopped_by_a_signal_removes_everything(nobody, sig):
    before = _leftovers()
    allowed = _userns_allowed(nobody)
    p = nobody.popen(nobody.cluster(["--hosts", "2", "--link", "100mbit", "--measure", "0"],
                                    [sys.executable, "-c", "import time; print('up', flush=True); time.sleep(300)"]))
    if not allowed:  # the kernel forbids unprivileged user namespaces: the refusal says so
        out, err = p.communicate(timeout=60)
        assert p.returncode == 2 and f"not root (uid {NOBODY})" in err and not out, (p.returncode, out, err)
        return
    tree = {}
    try:
        assert [p.stdout.readline().strip() for _ in range(2)] == ["up", "up"]  # both ranks
        tree = _tree(p.pid)  # the launcher, the run inside its user namespace, the agents, the ranks
        assert len(tree) >= 6, tree
        with open(f"/proc/{p.pid}/status") as fh:  # the launcher itself, unprivileged
            uids = next(line for line in fh if line.startswith("Uid:")).split()[1:]
        assert uids == [str(NOBODY)] * 4, uids
        p.send_signal(sig)
        p.wait(timeout=30)
        try:
            _, err = p.communicate(timeout=30)  # the end of stderr: every process of the run has ended
        except subprocess.TimeoutExpired:
            pytest.fail(f"the run in the launcher's user namespace outlived the launcher ({sig.name}) by 30 s")
    finally:
        _kill(tree)  # what a failed stop left (nothing when it passes)
        if p.poll() is None:
            p.kill()
            p.wait()
    # Killed with SIGKILL, the launcher cannot say anything; the run inside it still stops and cleans up.
    assert p.returncode == (128 + sig if sig != signal.SIGKILL else -sig), (p.returncode, err)
    # The signal passed on, once; after SIGKILL, the parent-death signal (SIGTERM) of the run inside.
    said = signal.SIGTERM if sig == signal.SIGKILL else sig
    assert err.count(": stopping the ranks and removing the cluster") == 1, err
    assert f"{said.name}: stopping the ranks and removing the cluster" in err, err
    deadline = time.monotonic() + 15
    while _leftovers() != before and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _leftovers() == before


@needs_root
def test_unprivileged_user_without_user_namespaces_is_told_why(nobody):
    # user.max_user_namespaces = 0 in a user namespace of root's, as a kernel with them turned off.
    marker = os.path.join(nobody.home, "ran")
    rc, out, err = nobody.run(nobody.cluster(["--hosts", "2", "--link", "1gbit"], ["touch", marker]),
                              forbid_userns=True, timeout=60)
    assert rc == 2, (rc, err[-3000:])
    assert (f"pycoll-cluster needs root or unprivileged user namespaces to make network namespaces: this "
            f"process is not root (uid {NOBODY}), and user namespaces are turned off "
            f"(user.max_user_namespaces = 0)") in err, err
    assert not os.path.exists(marker)
