"""What this process may do to build a cluster: as root, everything; as another user, the same
inside an unprivileged user namespace (the run re-executes itself there, see cli.py); with
neither, nothing, and the error says which is missing."""
from __future__ import annotations

import os
import shutil
import subprocess


class ClusterError(RuntimeError):
    """A cluster cannot be built or run; the message says why and what to do."""


def _read(path: str) -> str:
    try:
        with open(path) as fh:
            return fh.read().strip()
    except OSError:
        return ""


def userns_works():
    """(True, "") when this user can make a user namespace with a network and a mount namespace
    (tried: ``unshare --user --map-root-user --net --mount true``), else (False, why)."""
    if _read("/proc/sys/kernel/unprivileged_userns_clone") == "0":
        return False, "unprivileged user namespaces are turned off (kernel.unprivileged_userns_clone = 0)"
    if _read("/proc/sys/user/max_user_namespaces") == "0":
        return False, "user namespaces are turned off (user.max_user_namespaces = 0)"
    if not shutil.which("unshare"):
        return False, "the unshare command (util-linux) is not installed"
    try:
        p = subprocess.run(["unshare", "--user", "--map-root-user", "--net", "--mount", "true"],
                           capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError) as exc:
        return False, f"unshare --user failed: {exc}"
    if p.returncode != 0:
        return False, f"unshare --user --map-root-user --net --mount failed: {p.stderr.strip() or p.returncode}"
    return True, ""


def tools_missing():
    """The commands a cluster needs that are not on PATH."""
    return [t for t in ("ip", "tc", "unshare", "mount") if not shutil.which(t)]


def probe(geteuid=None, userns=None) -> str:
    """"root" or "userns" (how this run builds its namespaces), else ClusterError saying which of
    the two is missing. ``geteuid`` and ``userns`` replace os.geteuid and userns_works (tests)."""
    missing = tools_missing()
    if missing:
        raise ClusterError(f"pycoll-cluster needs the commands {', '.join(missing)} (iproute2, util-linux)")
    uid = (geteuid or os.geteuid)()
    if uid == 0:
        return "root"
    ok, why = (userns or userns_works)()
    if ok:
        return "userns"
    raise ClusterError(f"pycoll-cluster needs root or unprivileged user namespaces to make network namespaces: "
                       f"this process is not root (uid {uid}), and {why}. Run it as root (sudo), or allow user "
                       f"namespaces (sysctl kernel.unprivileged_userns_clone=1 or user.max_user_namespaces > 0).")
