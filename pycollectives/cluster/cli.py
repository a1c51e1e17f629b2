"""pycoll-cluster: run a torch.distributed program on simulated hosts of this machine, joined by
network links shaped to a chosen rate.

    pycoll-cluster --hosts 2 --nproc-per-host 2 --link 1gbit -- python train.py ARGS
    pycoll-cluster --cleanup
"""
from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys

from . import links, privileges
from .privileges import ClusterError
from .rates import parse_rate
from .runner import ClusterSpec, _die_with_parent, run

EPILOG = """\
Each host is a network namespace with its own mount namespace (a private /dev/shm) and hostname;
its veth pair ends in a bridge, and both ends are shaped with tc tbf to --link. The ranks get
torchrun's environment (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR=host 0, MASTER_PORT) and
PYCOLL_HOSTID, NCCL_HOSTID, GLOO_SOCKET_IFNAME, NCCL_SOCKET_IFNAME of their host.
Needs root, or unprivileged user namespaces. docs/cluster.md says more.
exit status: 0 when every rank exited with 0; 1 when one failed (the message names it); 2 bad
arguments or a cluster that cannot be built; 128+N when stopped by signal N.
"""


def _nonneg(kind):
    def parse(text):
        try:
            v = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}")
        if v < 0:
            raise argparse.ArgumentTypeError(f"expected a number >= 0, got {text}")
        return v
    return parse


def _rate(text):
    try:
        parse_rate(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc))
    return text


def build_parser():
    p = argparse.ArgumentParser(prog="pycoll-cluster", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=EPILOG)
    p.add_argument("--hosts", type=int, default=2, help="simulated hosts (default: 2)")
    p.add_argument("--nproc-per-host", type=int, default=1, help="ranks per host (default: 1)")
    p.add_argument("--link", type=_rate, default=None,
                   help="rate of each host's link, each way, as tc writes it: 100mbit, 1gbit, 10gbit "
                        "(default: not shaped)")
    p.add_argument("--delay", type=_nonneg(float), default=0.0, help="one-way delay in ms (needs netem)")
    p.add_argument("--jitter", type=_nonneg(float), default=0.0, help="delay jitter in ms (needs netem)")
    p.add_argument("--loss", type=_nonneg(float), default=0.0, help="packet loss in %% (needs netem)")
    p.add_argument("--cpus-per-host", type=_nonneg(int), default=0,
                   help="pin host h's ranks to the h-th block of this many CPUs (default: 0, no pinning)")
    p.add_argument("--gpus-per-host", type=_nonneg(int), default=0,
                   help="host h sees the h-th block of this many GPUs as CUDA_VISIBLE_DEVICES (default: 0, "
                        "unchanged); ranks may share a GPU (LOCAL_RANK %% count)")
    p.add_argument("--master-port", type=int, default=29500, help="rendezvous port on host 0 (default: 29500)")
    p.add_argument("--measure", type=_nonneg(float), default=1.0,
                   help="seconds of the TCP transfer that measures the link before the ranks start (0: none)")
    p.add_argument("--cleanup", action="store_true",
                   help="remove what runs that no longer exist left behind (namespaces, links, processes) and exit")
    p.add_argument("--in-userns", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- program and its arguments")
    return p


def _enter_userns(argv):
    """Run this command again inside a user namespace where we are root, with its own network and
    mount namespaces (and a tmpfs on /run for ip netns): what it builds vanishes with it.

    The run inside stops and cleans up as a run as root does: SIGINT, SIGTERM and SIGHUP to this
    process are passed on to it (once: it has a session of its own, so a terminal's Ctrl-C reaches
    this process only), and it gets SIGTERM if this process is killed."""
    cmd = ["unshare", "--user", "--map-root-user", "--net", "--mount", "--propagation", "private", "--",
           sys.executable, "-m", "pycollectives.cluster", "--in-userns"] + list(argv)
    handlers, early, inner = {}, [], None

    def forward(signum, frame):
        if inner is None:
            early.append(signum)  # passed on once the run inside has started
        elif inner.poll() is None:
            inner.send_signal(signum)

    try:
        for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            handlers[s] = signal.signal(s, forward)
        inner = subprocess.Popen(cmd, start_new_session=True, preexec_fn=_die_with_parent(signal.SIGTERM))
        if early:
            inner.send_signal(early[0])
        code = inner.wait()
    finally:
        for s, h in handlers.items():
            signal.signal(s, h)
        if inner is not None and inner.poll() is None:  # this process failed: the run must not outlive it
            inner.kill()
            inner.wait()
    return 128 - code if code < 0 else code


def spec_from_args(a) -> ClusterSpec:
    if a.hosts < 1 or a.nproc_per_host < 1:
        raise ClusterError("pycoll-cluster: --hosts and --nproc-per-host must be at least 1")
    return ClusterSpec(hosts=a.hosts, nproc_per_host=a.nproc_per_host, link=a.link, delay_ms=a.delay,
                       jitter_ms=a.jitter, loss_pct=a.loss, cpus_per_host=a.cpus_per_host,
                       gpus_per_host=a.gpus_per_host, master_port=a.master_port, measure_s=a.measure)


def main(argv=None, probe=privileges.probe):
    argv = list(sys.argv[1:] if argv is None else argv)
    a = build_parser().parse_args(argv)
    command = a.command[1:] if a.command[:1] == ["--"] else a.command
    try:
        if a.in_userns:
            subprocess.run(["mount", "-t", "tmpfs", "pycoll-cluster-run", "/run"], check=True)
            os.makedirs("/run/netns", exist_ok=True)
        elif probe() == "userns":
            return _enter_userns(argv)
        if a.cleanup:
            gone = links.cleanup_leftovers()
            print(f"pycoll-cluster: removed {len(gone)} namespaces" + (f": {', '.join(gone)}" if gone else ""))
            return 0
        spec = spec_from_args(a)
        if not command:
            raise ClusterError("pycoll-cluster: no command to run: pycoll-cluster [options] -- python train.py ...")
        if shutil.which(command[0]) is None and not os.path.exists(command[0]):
            raise ClusterError(f"pycoll-cluster: {command[0]}: no such program")
        return run(spec, command)
    except ClusterError as exc:
        print(str(exc) if str(exc).startswith("pycoll-cluster") else f"pycoll-cluster: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
