"""Which host each rank of a group is on, and the inter-host sub-groups a group across hosts uses.

When a group is made, every rank publishes its host identity through the group's Store:
``PYCOLL_HOSTID`` if set (as NCCL's ``NCCL_HOSTID``), else the hostname plus the kernel's boot id.
Locality is never inferred from ``LOCAL_WORLD_SIZE`` or the device count. A group on one host
runs today's engines unchanged; a group across hosts gets sub-groups, made here on a ``PrefixStore``
of the group's Store: one "rail" per local rank (the ranks with that local rank on every host) when
every host has the same number of ranks, and one flat group of all ranks; Gloo ones for CPU
tensors and, where CUDA is available, NCCL ones for CUDA tensors (PYCOLL_INTER_HOST_BACKEND).
"""
from __future__ import annotations

import socket
import sys
from dataclasses import dataclass, field
from typing import List

import torch.distributed as dist

from .config import debug_info
from .package_settings import HOSTID

_KEY = "pycoll/host/"


def host_identity() -> str:
    """This process's host: PYCOLL_HOSTID, else hostname + boot id (two boots are two hosts)."""
    hid = HOSTID.get().strip()
    if hid:
        return hid
    try:
        with open("/proc/sys/kernel/random/boot_id") as fh:
            boot = fh.read().strip()
    except OSError:
        boot = ""
    return f"{socket.gethostname()}/{boot}"


@dataclass
class HostMap:
    """Hosts in the order of their lowest group rank; each host's group ranks ascending."""
    ids: List[str]                       # host identity of every group rank
    hosts: List[List[int]] = field(default_factory=list)
    host_of: List[int] = field(default_factory=list)

    @classmethod
    def from_ids(cls, ids: List[str]) -> "HostMap":
        m = cls(list(ids))
        index = {}
        for r, hid in enumerate(ids):
            if hid not in index:
                index[hid] = len(m.hosts)
                m.hosts.append([])
            m.hosts[index[hid]].append(r)
            m.host_of.append(index[hid])
        return m

    @property
    def kind(self) -> str:
        """one-host, one-rank-per-host, uniform (the same rank count on every host), irregular."""
        if len(self.hosts) == 1:
            return "one-host"
        sizes = {len(h) for h in self.hosts}
        if sizes == {1}:
            return "one-rank-per-host"
        return "uniform" if len(sizes) == 1 else "irregular"

    def local_rank(self, rank: int) -> int:
        return self.hosts[self.host_of[rank]].index(rank)


def exchange(store, rank: int, size: int) -> HostMap:
    """Every rank's host identity, through the group's Store (blocks until all ranks published)."""
    store.set(f"{_KEY}{rank}", host_identity())
    return HostMap.from_ids([store.get(f"{_KEY}{r}").decode() for r in range(size)])


def link_bps() -> int:
    """The rate of the links between hosts in bits per second (PYCOLL_LINK), 0 where unset."""
    from .cluster.rates import parse_rate
    from .package_settings import LINK

    text = LINK.get()
    if not text:
        return 0
    try:
        return parse_rate(text)
    except ValueError as exc:
        raise ValueError(f"pycoll: PYCOLL_LINK={text} is not valid: {exc}") from None


def check_form_constants(store, rank: int, size: int, group_name: str) -> None:
    """Every rank must choose the same form (flat or hierarchical, in one piece or several) for
    each op, or the ranks would wait in different sub-groups: their calibrated tables
    (PYCOLL_COST_MODEL) and their links' rate (PYCOLL_LINK) must agree."""
    from . import _C

    store.set(f"pycoll/hostforms/{rank}", _C.host_form_digest())
    store.set(f"pycoll/hostlink/{rank}", str(link_bps()))
    digests = [store.get(f"pycoll/hostforms/{r}").decode() for r in range(size)]
    differ = [r for r in range(size) if digests[r] != digests[rank]]
    if differ:
        raise ValueError(f"pycoll: group {group_name}: rank {rank} and rank(s) {differ} loaded different tables "
                         f"of forms across hosts (PYCOLL_COST_MODEL; on rank {rank}: "
                         f"{_C.host_form_digest() or 'none'}); every rank must load the same calibration file")
    links = [int(store.get(f"pycoll/hostlink/{r}").decode()) for r in range(size)]
    differ = [r for r in range(size) if links[r] != links[rank]]
    if differ:
        raise ValueError(f"pycoll: group {group_name}: rank {rank} and rank(s) {differ} set different rates of the "
                         f"links between hosts (PYCOLL_LINK: {links[rank] or 'unset'} bit/s on rank {rank}, "
                         f"{links[differ[0]] or 'unset'} on rank {differ[0]}); every rank must set the same")


def _debug(message: str) -> None:
    if debug_info():
        print(f"[pycoll] {message}", file=sys.stderr, flush=True)


def _device_groups(store, rank: int, size: int, timeout, kind: str, me: int, local: int, num_hosts: int):
    """NCCL sub-groups for CUDA tensors between hosts (rail, flat), or (None, None) where CUDA tensors
    go through host memory instead (PYCOLL_INTER_HOST_BACKEND=gloo, or no CUDA here)."""
    from . import _C

    choice = _C.read_setting("PYCOLL_INTER_HOST_BACKEND").strip().lower() or "auto"
    if choice not in ("auto", "nccl", "gloo"):
        raise ValueError(f"PYCOLL_INTER_HOST_BACKEND={choice!r}: expected one of auto, nccl, gloo")
    if choice == "gloo":
        return None, None
    import torch

    usable = torch.cuda.is_available() and dist.is_nccl_available()
    if not usable:
        if choice == "nccl":
            raise RuntimeError("PYCOLL_INTER_HOST_BACKEND=nccl, but this process has no CUDA device or no NCCL")
        return None, None

    def nccl(prefix: str, r: int, n: int):
        opts = dist.ProcessGroupNCCL.Options()
        opts._timeout = timeout
        return dist.ProcessGroupNCCL(dist.PrefixStore(prefix, store), r, n, opts)

    # Communicators connect at their first collective, on the device the rank then uses.
    flat = nccl("pycoll/nccl/flat/", rank, size)
    rail = nccl(f"pycoll/nccl/rail{local}/", me, num_hosts) if kind == "uniform" else None
    return rail, flat


def make_backend(native, store, rank: int, size: int, timeout, group_name: str):
    """The pycoll backend object of one group: one host as before, else with its host layout."""
    hosts = exchange(store, rank, size) if size > 1 else HostMap.from_ids([host_identity()])
    kind = hosts.kind
    if kind == "one-host":
        return native(store, rank, size, timeout, group_name)
    me = hosts.host_of[rank]
    local = hosts.local_rank(rank)
    if kind == "uniform":
        check_form_constants(store, rank, size, group_name)
    # Inter-host engines: Gloo for CPU tensors, NCCL for CUDA tensors (_device_groups). Each
    # sub-group is made by exactly its members, on keys of its own.
    flat = dist.ProcessGroupGloo(dist.PrefixStore("pycoll/flat/", store), rank, size, timeout)
    rail = None
    if kind == "uniform":
        rail = dist.ProcessGroupGloo(dist.PrefixStore(f"pycoll/rail{local}/", store), me, len(hosts.hosts), timeout)
    device_rail, device_flat = _device_groups(store, rank, size, timeout, kind, me, local, len(hosts.hosts))
    wire = "Gloo (CPU tensors), " + ("NCCL (CUDA tensors)" if device_flat is not None else
                                     "CUDA tensors through host memory and Gloo")
    if kind == "irregular":
        _debug(f"group {group_name}: hosts have {[len(h) for h in hosts.hosts]} ranks, not the same number: "
               f"every op runs flat on the inter-host engine ({wire})")
    _debug(f"group {group_name}: {len(hosts.hosts)} hosts ({kind}); rank {rank} is local rank {local} of "
           f"{len(hosts.hosts[me])} on host {me} ({hosts.ids[rank]}); between hosts: {wire}")
    return native(store, rank, size, timeout, group_name, hosts.ids[rank], me, len(hosts.hosts), hosts.hosts[me],
                  hosts.host_of, kind == "uniform", rail, flat, device_rail, device_flat, link_bps())
