"""One cluster run: build the network, measure the link, start one agent per host (which starts
the host's ranks with torchrun's environment), watch them, and remove everything at the end: on
a normal exit, on SIGINT/SIGTERM/SIGHUP, and when a rank fails (the others are stopped; the exit
status is 1 and the message names the rank)."""
from __future__ import annotations

import ctypes
import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import Callable, Dict, List, Optional

from ..package_settings import LINK, LINK_MEASURED
from . import links
from .privileges import ClusterError
from .rates import canonical, human, parse_rate

HERE = os.path.dirname(os.path.abspath(__file__))
AGENT = os.path.join(HERE, "agent.py")
LINKRATE = os.path.join(HERE, "linkrate.py")


@dataclasses.dataclass
class ClusterSpec:
    hosts: int
    nproc_per_host: int = 1
    link: Optional[str] = None          # "1gbit"; None: veth pairs without shaping
    delay_ms: float = 0.0
    jitter_ms: float = 0.0
    loss_pct: float = 0.0
    cpus_per_host: int = 0              # 0: every host may use every CPU
    gpus_per_host: int = 0              # 0: CUDA_VISIBLE_DEVICES left as it is
    master_port: int = 29500
    measure_s: float = 1.0              # seconds of the TCP transfer that measures the link; 0: none
    grace_s: float = 3.0                # SIGTERM -> SIGKILL of the ranks left when one fails
    verbose: bool = False

    @property
    def world(self) -> int:
        return self.hosts * self.nproc_per_host

    @property
    def rate_bps(self) -> Optional[int]:
        return parse_rate(self.link) if self.link else None


def _die_with_parent(sig):
    def fn():
        ctypes.CDLL(None, use_errno=True).prctl(1, int(sig), 0, 0, 0)  # PR_SET_PDEATHSIG
    return fn


def check_netem(spec: ClusterSpec, rid: str, probe: Callable = links.netem_available) -> None:
    """A delay, jitter or loss needs netem: refused, never dropped, where the kernel lacks it."""
    asked = [f"--{n} {v:g}" for n, v in (("delay", spec.delay_ms), ("jitter", spec.jitter_ms), ("loss", spec.loss_pct))
             if v]
    if not asked:
        return
    ok, why = probe(rid)
    if not ok:
        raise ClusterError(f"pycoll-cluster: {', '.join(asked)} needs the netem qdisc, which this kernel does not have "
                           f"(tc: {why or 'netem unavailable'}; it comes with CONFIG_NET_SCH_NETEM, module sch_netem). "
                           f"Only the rate can be shaped here (tbf): drop {' and '.join(asked)}.")


def cpu_sets(hosts: int, per_host: int) -> List[Optional[List[int]]]:
    """Host h's CPUs: the h-th block of ``per_host`` of this process's CPUs (wrapping around)."""
    if per_host <= 0:
        return [None] * hosts
    cpus = sorted(os.sched_getaffinity(0))
    return [[cpus[(h * per_host + k) % len(cpus)] for k in range(per_host)] for h in range(hosts)]


def gpu_sets(hosts: int, per_host: int) -> List[Optional[str]]:
    """Host h's CUDA_VISIBLE_DEVICES: the h-th block of ``per_host`` of the GPUs visible now."""
    if per_host <= 0:
        return [None] * hosts
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    ids = [v.strip() for v in visible.split(",") if v.strip()] if visible else None
    need = hosts * per_host
    if ids is not None and len(ids) < need:
        raise ClusterError(f"pycoll-cluster: --gpus-per-host {per_host} x {hosts} hosts needs {need} GPUs; "
                           f"CUDA_VISIBLE_DEVICES={visible} names {len(ids)}")
    ids = ids or [str(i) for i in range(need)]
    return [",".join(ids[h * per_host + k] for k in range(per_host)) for h in range(hosts)]


def gpus_per_host_seen(spec: ClusterSpec) -> int:
    """How many GPUs each simulated host sees: --gpus-per-host, else every GPU visible here (0 without CUDA)."""
    if spec.gpus_per_host > 0:
        return spec.gpus_per_host
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return len([v for v in visible.split(",") if v.strip()])
    try:
        import torch
        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception:  # noqa: BLE001  (no usable CUDA: no GPUs to share)
        return 0


def rank_env(spec: ClusterSpec, rid: str, host: int, local: int, measured_bps: Optional[float],
             gpus: Optional[str], host_gpus: int = 0) -> Dict[str, str]:
    """What torchrun sets for a rank, plus the simulated host's identity and interface. Where the
    host's ranks outnumber its GPUs (``host_gpus``), ranks share GPUs (local rank % count): NCCL
    refuses two ranks of one host on one GPU, so each such rank is an NCCL host of its own."""
    hostid = f"pycoll-cluster-{rid}-host{host}"
    nccl_hostid = f"{hostid}-rank{local}" if 0 < host_gpus < spec.nproc_per_host else hostid
    env = {
        "RANK": str(host * spec.nproc_per_host + local), "WORLD_SIZE": str(spec.world),
        "LOCAL_RANK": str(local), "LOCAL_WORLD_SIZE": str(spec.nproc_per_host),
        "GROUP_RANK": str(host), "GROUP_WORLD_SIZE": str(spec.hosts),
        "ROLE_RANK": str(host * spec.nproc_per_host + local), "ROLE_WORLD_SIZE": str(spec.world),
        "ROLE_NAME": "default", "TORCHELASTIC_RUN_ID": f"pycoll-cluster-{rid}",
        "MASTER_ADDR": links.address(0), "MASTER_PORT": str(spec.master_port),
        "PYCOLL_HOSTID": hostid, "NCCL_HOSTID": nccl_hostid,
        "GLOO_SOCKET_IFNAME": links.IFNAME, "NCCL_SOCKET_IFNAME": links.IFNAME,
    }
    env.setdefault("NCCL_IB_DISABLE", os.environ.get("NCCL_IB_DISABLE", "1"))  # only the shaped link
    if "OMP_NUM_THREADS" not in os.environ and spec.nproc_per_host > 1:
        env["OMP_NUM_THREADS"] = "1"   # as torchrun
    if spec.link:
        env[LINK.name] = canonical(spec.link)
    if measured_bps:
        env[LINK_MEASURED.name] = str(int(measured_bps))
    if gpus is not None:
        env["CUDA_VISIBLE_DEVICES"] = gpus
    return env


class _Stop(Exception):
    def __init__(self, signum):
        super().__init__(signum)
        self.signum = signum


class Cluster:
    def __init__(self, spec: ClusterSpec, log=None, rid: Optional[str] = None):
        self.spec = spec
        self.rid = rid or links.run_id()
        self.log = log or (lambda msg: print(f"pycoll-cluster: {msg}", file=sys.stderr, flush=True))
        self.net = links.Network(self.rid, spec.hosts, spec.rate_bps, spec.delay_ms, spec.jitter_ms, spec.loss_pct)
        self.agents: List[subprocess.Popen] = []
        self.rundir: Optional[str] = None
        self.measured_bps: Optional[float] = None

    # -- pieces ---------------------------------------------------------------------------------
    def measure(self) -> Optional[float]:
        """Bits per second of one TCP stream from host 1 to host 0 (None with one host)."""
        if self.spec.hosts < 2 or self.spec.measure_s <= 0:
            return None
        port = 29400
        server = subprocess.Popen(self.net.exec_prefix(0) + [sys.executable, LINKRATE, "serve", links.address(0),
                                                             str(port)], stdout=subprocess.PIPE, text=True)
        try:
            if server.stdout.readline().strip() != "ready":
                raise ClusterError("pycoll-cluster: the link measurement's receiver did not start")
            links.sh(self.net.exec_prefix(1) + [sys.executable, LINKRATE, "send", links.address(0), str(port),
                                                str(self.spec.measure_s)], timeout=self.spec.measure_s + 30)
            out, _ = server.communicate(timeout=30)
            return float(out.strip().splitlines()[-1])
        finally:
            if server.poll() is None:
                server.kill()
                server.wait()

    def start_agents(self, command: List[str]) -> None:
        spec = self.spec
        cpus, gpus = cpu_sets(spec.hosts, spec.cpus_per_host), gpu_sets(spec.hosts, spec.gpus_per_host)
        host_gpus = gpus_per_host_seen(spec)
        hosts_file = os.path.join(self.rundir, "hosts")
        with open(hosts_file, "w") as fh:
            fh.write("127.0.0.1 localhost\n" + "".join(f"{links.address(h)} pcl-host{h}\n" for h in range(spec.hosts)))
        for h in range(spec.hosts):
            hs = {"host": h, "hostname": f"pcl-host{h}", "command": command, "cwd": os.getcwd(),
                  "status": os.path.join(self.rundir, f"host{h}.status"), "cpus": cpus[h], "grace_s": spec.grace_s,
                  "hosts_file": hosts_file,
                  "ranks": [{"rank": h * spec.nproc_per_host + l,
                             "env": rank_env(spec, self.rid, h, l, self.measured_bps, gpus[h], host_gpus)}
                            for l in range(spec.nproc_per_host)]}
            path = os.path.join(self.rundir, f"host{h}.json")
            with open(path, "w") as fh:
                json.dump(hs, fh)
            argv = self.net.exec_prefix(h) + ["unshare", "--mount", "--uts", "--propagation", "private", "--",
                                              sys.executable, AGENT, path]
            # A session of its own: a terminal's Ctrl-C reaches this process only, which stops the agents.
            self.agents.append(subprocess.Popen(argv, start_new_session=True,
                                                preexec_fn=_die_with_parent(signal.SIGTERM)))

    def statuses(self) -> List[dict]:
        out = []
        for h in range(self.spec.hosts):
            try:
                with open(os.path.join(self.rundir, f"host{h}.status")) as fh:
                    out += [dict(json.loads(line), host=h) for line in fh if line.strip()]
            except OSError:
                pass
        return out

    def first_failure(self) -> Optional[dict]:
        bad = [s for s in self.statuses() if s["code"] != 0]
        return min(bad, key=lambda s: s["t"]) if bad else None

    def stop_agents(self, timeout: float) -> None:
        for a in self.agents:
            if a.poll() is None:
                a.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for a in self.agents:
            try:
                a.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                a.kill()
                a.wait()

    def supervise(self) -> int:
        """0 when every rank exited with 0; else 1, naming the rank that failed first."""
        while True:
            codes = [a.poll() for a in self.agents]
            if all(c == 0 for c in codes):
                return 0
            if any(c not in (None, 0) for c in codes) or self.first_failure():
                break
            time.sleep(0.05)
        self.stop_agents(self.spec.grace_s + 5)
        f = self.first_failure()
        if f is None:
            self.log("a host's agent failed before its ranks ended (see above)")
            return 1
        local = f["rank"] - f["host"] * self.spec.nproc_per_host
        how = f"exited with status {f['code']}" if f["code"] is not None else \
            f"was killed by signal {signal.Signals(f['signal']).name}"
        self.log(f"rank {f['rank']} (host {f['host']}, local rank {local}) {how}; the other ranks were stopped")
        return 1

    # -- the run --------------------------------------------------------------------------------
    def describe(self) -> str:
        s = self.spec
        link = f"links of {canonical(s.link)} each way" if s.link else "unshaped links"
        extra = ", ".join(f"{n} {v:g}{u}" for n, v, u in (("delay", s.delay_ms, " ms"), ("jitter", s.jitter_ms, " ms"),
                                                              ("loss", s.loss_pct, "%")) if v)
        text = f"{s.hosts} hosts x {s.nproc_per_host} ranks, {link}" + (f" ({extra})" if extra else "")
        if self.measured_bps:
            text += f"; measured {human(self.measured_bps)} (TCP, host 1 -> host 0)"
        return text

    def run(self, command: List[str], netem_probe: Callable = links.netem_available) -> int:
        if not command:
            raise ClusterError("pycoll-cluster: no command to run (give it after --)")
        check_netem(self.spec, self.rid, netem_probe)
        gone = links.cleanup_leftovers()
        if gone:
            self.log(f"removed {len(gone)} namespaces left by runs that no longer exist")
        handlers = {}

        def on_signal(signum, frame):
            raise _Stop(signum)

        for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            handlers[s] = signal.signal(s, on_signal)
        try:
            self.rundir = tempfile.mkdtemp(prefix=f"pycoll-cluster-{self.rid}-")
            self.net.build()
            self.measured_bps = self.measure()
            self.log(self.describe())
            self.start_agents(command)
            return self.supervise()
        except _Stop as stop:
            self.log(f"{signal.Signals(stop.signum).name}: stopping the ranks and removing the cluster")
            return 128 + stop.signum
        finally:
            try:
                for s in handlers:  # a second Ctrl-C must not cut the clean-up short
                    signal.signal(s, signal.SIG_IGN)
                self.stop_agents(self.spec.grace_s + 5)
                self.net.teardown()
                if self.rundir:
                    shutil.rmtree(self.rundir, ignore_errors=True)
            finally:
                for s, h in handlers.items():
                    signal.signal(s, h)


def run(spec: ClusterSpec, command: List[str], **kwargs) -> int:
    return Cluster(spec, **kwargs).run(command)
