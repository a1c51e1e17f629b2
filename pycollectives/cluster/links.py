"""The network of a cluster: a switch namespace with a bridge, and per host a network namespace
whose veth pair ends in that bridge. Both ends of each pair are shaped on egress (tc tbf at the
link rate), so a host sends and receives at most the rate, as through a full-duplex NIC.

Names carry the run id (``pcl-<pid>-<hex>-sw``, ``pcl-<pid>-<hex>-h<i>``): parallel runs never
collide, and a run whose process is gone is recognised as a leftover (``cleanup_leftovers``).
Every interface and qdisc lives inside these namespaces, none in the caller's: deleting the
namespaces (after killing what runs in them) removes everything.
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from typing import List, Optional, Sequence

from .privileges import ClusterError

PREFIX = "pcl-"
IFNAME = "pcl0"            # each host's end of its veth pair (GLOO_SOCKET_IFNAME, NCCL_SOCKET_IFNAME)
BRIDGE = "br0"
SUBNET_BITS = 24
MAX_HOSTS = 250
_OURS = re.compile(r"^pcl-(\d+)-([0-9a-f]+)-(sw|probe|h\d+)$")


def address(host: int) -> str:
    """Host ``host``'s address on the cluster's private subnet (host 0 holds the rendezvous)."""
    return f"10.200.0.{host + 1}"


def sh(args: Sequence[str], check: bool = True, timeout: float = 30) -> subprocess.CompletedProcess:
    p = subprocess.run(list(args), capture_output=True, text=True, timeout=timeout)
    if check and p.returncode != 0:
        raise ClusterError(f"pycoll-cluster: `{' '.join(args)}` failed: {p.stderr.strip() or p.returncode}")
    return p


# TCP of every simulated host. Autocorking holds a socket's small writes back until the packets it
# queued before have left the machine; behind the shaped veth they wait in tbf, and 2-4% of
# back-to-back hierarchical all_gathers (2 x 2 ranks, 1 Gbit/s) stalled 30-55 ms on a flow's held-back
# tail. With it off, none took over 11 ms in 400 (docs/cluster.md).
HOST_SYSCTLS = {"net/ipv4/tcp_autocorking": "0"}


def set_host_sysctls(ns: str) -> List[str]:
    """Writes HOST_SYSCTLS in namespace ``ns`` where the kernel keeps them per namespace; returns
    the ones it left alone (the kernel has no such setting, or one shared with this machine's)."""
    skipped = []
    for key, value in HOST_SYSCTLS.items():
        path = f"/proc/sys/{key}"
        try:
            with open(path) as fh:
                mine = fh.read().strip()
        except OSError:
            skipped.append(key)
            continue
        p = sh(["ip", "netns", "exec", ns, "sh", "-c", f"echo {value} > {path}"], check=False)
        with open(path) as fh:
            now = fh.read().strip()
        if now != mine:  # one setting for every namespace: put this machine's back
            with open(path, "w") as fh:
                fh.write(mine)
            skipped.append(key)
        elif p.returncode != 0:
            skipped.append(key)
    return skipped


def tbf_burst(rate_bps: int) -> int:
    """Bytes of the token bucket: 1 ms at the rate, at least 64 KiB (a whole GSO frame of veth)."""
    return max(64 * 1024, rate_bps // 8 // 1000)


def shaping_commands(dev: str, rate_bps: Optional[int], delay_ms: float = 0, jitter_ms: float = 0,
                     loss_pct: float = 0) -> List[List[str]]:
    """tc arguments that shape ``dev``'s egress: tbf at the rate; with a delay, jitter or loss,
    netem at the root and the tbf below it (netem only where the kernel has it: see netem_available)."""
    cmds = []
    parent = ["root", "handle", "1:"]
    if delay_ms or jitter_ms or loss_pct:
        netem = ["qdisc", "add", "dev", dev, "root", "handle", "1:", "netem"]
        if delay_ms or jitter_ms:
            netem += ["delay", f"{delay_ms:g}ms"] + ([f"{jitter_ms:g}ms"] if jitter_ms else [])
        if loss_pct:
            netem += ["loss", f"{loss_pct:g}%"]
        cmds.append(netem)
        parent = ["parent", "1:1", "handle", "10:"]
    if rate_bps:
        cmds.append(["qdisc", "add", "dev", dev] + parent +
                    ["tbf", "rate", f"{rate_bps}bit", "burst", str(tbf_burst(rate_bps)), "latency", "50ms"])
    return cmds


def run_id() -> str:
    return f"{os.getpid()}-{os.urandom(3).hex()}"


def netem_available(rid: str):
    """(True, "") when the kernel has netem (tried on a veth pair in a scratch namespace), else
    (False, tc's message)."""
    ns = f"{PREFIX}{rid}-probe"
    try:
        sh(["ip", "netns", "add", ns])
        sh(["ip", "-n", ns, "link", "add", "d0", "type", "veth", "peer", "name", "d1"])
        p = sh(["tc", "-n", ns, "qdisc", "add", "dev", "d0", "root", "netem", "delay", "1ms"], check=False)
        return p.returncode == 0, p.stderr.strip()
    finally:
        delete_namespace(ns)


def namespace_pids(ns: str) -> List[int]:
    p = sh(["ip", "netns", "pids", ns], check=False)
    return [int(x) for x in p.stdout.split() if x.isdigit()]


def delete_namespace(ns: str) -> None:
    """Kill what still runs in ``ns`` (its interfaces live as long as a process holds it), then delete it."""
    for _ in range(50):
        pids = namespace_pids(ns)
        if not pids:
            break
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.02)
    sh(["ip", "netns", "del", ns], check=False)


def list_namespaces() -> List[str]:
    p = sh(["ip", "netns", "list"], check=False)
    return [line.split()[0] for line in p.stdout.splitlines() if line.strip()]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def ours(names: Sequence[str], rid: Optional[str] = None) -> List[str]:
    """Our namespaces among ``names`` (of run ``rid`` only, when given)."""
    out = []
    for n in names:
        m = _OURS.match(n)
        if m and (rid is None or f"{m.group(1)}-{m.group(2)}" == rid):
            out.append(n)
    return out


def cleanup_leftovers(everything: bool = False) -> List[str]:
    """Delete the namespaces of runs whose process is gone (``everything``: of every run); returns
    their names."""
    gone = []
    for n in ours(list_namespaces()):
        if everything or not _alive(int(_OURS.match(n).group(1))):
            delete_namespace(n)
            gone.append(n)
    return gone


class Network:
    """The namespaces and links of one run. ``build`` records what it made as it goes, so that
    ``teardown`` removes a half-built network too."""

    def __init__(self, rid: str, hosts: int, rate_bps: Optional[int], delay_ms: float = 0, jitter_ms: float = 0,
                 loss_pct: float = 0):
        if not 1 <= hosts <= MAX_HOSTS:
            raise ClusterError(f"pycoll-cluster: --hosts {hosts}: from 1 to {MAX_HOSTS}")
        self.rid, self.rate_bps = rid, rate_bps
        self.netem = (delay_ms, jitter_ms, loss_pct)
        self.switch = f"{PREFIX}{rid}-sw"
        self.hosts = [f"{PREFIX}{rid}-h{i}" for i in range(hosts)]
        self.made: List[str] = []

    def _ns(self, name: str) -> None:
        sh(["ip", "netns", "add", name])
        self.made.append(name)
        sh(["ip", "-n", name, "link", "set", "lo", "up"])

    def _shape(self, ns: str, dev: str, netem: bool) -> None:
        for cmd in shaping_commands(dev, self.rate_bps, *(self.netem if netem else ())):
            sh(["tc", "-n", ns] + cmd)

    def build(self) -> None:
        self._ns(self.switch)
        sh(["ip", "-n", self.switch, "link", "add", BRIDGE, "type", "bridge"])
        sh(["ip", "-n", self.switch, "link", "set", BRIDGE, "up"])
        for i, ns in enumerate(self.hosts):
            self._ns(ns)
            port = f"h{i}"
            sh(["ip", "-n", ns, "link", "add", IFNAME, "type", "veth", "peer", "name", port, "netns", self.switch])
            sh(["ip", "-n", ns, "addr", "add", f"{address(i)}/{SUBNET_BITS}", "dev", IFNAME])
            sh(["ip", "-n", ns, "link", "set", IFNAME, "up"])
            skipped = set_host_sysctls(ns)
            for key in skipped if i == 0 else ():  # said once: every host's kernel is this one
                print(f"pycoll-cluster: {key.replace('/', '.')} left as this machine has it "
                      "(not a setting of its own in each network namespace here)", file=sys.stderr)
            sh(["ip", "-n", self.switch, "link", "set", port, "master", BRIDGE])
            sh(["ip", "-n", self.switch, "link", "set", port, "up"])
            # The rate on both ends; a delay or loss once per direction, as the host sends.
            self._shape(ns, IFNAME, netem=True)             # host -> switch
            self._shape(self.switch, port, netem=False)     # switch -> host

    def exec_prefix(self, host: int) -> List[str]:
        """The command prefix that runs a program inside host ``host``'s network namespace."""
        return ["ip", "netns", "exec", self.hosts[host]]

    def teardown(self) -> None:
        for ns in reversed(self.made):
            delete_namespace(ns)
        self.made.clear()
