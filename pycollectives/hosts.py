"""Which host each rank of a group is on, and the inter-host sub-groups a group across hosts uses.

When a group is made, every rank publishes its host identity through the group's Store:
``PYCOLL_HOSTID`` if set (as NCCL's ``NCCL_HOSTID``), else the hostname plus the kernel's boot id.
Locality is never inferred from ``LOCAL_WORLD_SIZE`` or the device count. A group on one host
runs today's engines unchanged; a group across hosts gets Gloo sub-groups, made here on a
``PrefixStore`` of the group's Store: one "rail" per local rank (the ranks with that local rank on
every host) when every host has the same number of ranks, and one flat group of all ranks.
"""
from __future__ import annotations

import os
import socket
import sys
from dataclasses import dataclass, field
from typing import List

import torch.distributed as dist

_KEY = "pycoll/host/"


def host_identity() -> str:
    """This process's host: PYCOLL_HOSTID, else hostname + boot id (two boots are two hosts)."""
    hid = os.environ.get("PYCOLL_HOSTID", "").strip()
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


def _debug(message: str) -> None:
    if os.environ.get("PYCOLL_DEBUG", "").upper() in ("INFO", "DEBUG", "TRACE"):
        print(f"[pycoll] {message}", file=sys.stderr, flush=True)


def make_backend(native, store, rank: int, size: int, timeout, group_name: str):
    """The pycoll backend object of one group: one host as before, else with its host layout."""
    hosts = exchange(store, rank, size) if size > 1 else HostMap.from_ids([host_identity()])
    kind = hosts.kind
    if kind == "one-host":
        return native(store, rank, size, timeout, group_name)
    me = hosts.host_of[rank]
    local = hosts.local_rank(rank)
    # Inter-host engine: Gloo for CPU tensors (CUDA tensors are staged through host memory across
    # hosts for now). Each sub-group is made by exactly its members, on keys of its own.
    flat = dist.ProcessGroupGloo(dist.PrefixStore("pycoll/flat/", store), rank, size, timeout)
    rail = None
    if kind == "uniform":
        rail = dist.ProcessGroupGloo(dist.PrefixStore(f"pycoll/rail{local}/", store), me, len(hosts.hosts), timeout)
    if kind == "irregular":
        _debug(f"group {group_name}: hosts have {[len(h) for h in hosts.hosts]} ranks, not the same number: "
               f"every op runs flat on the inter-host engine (Gloo)")
    _debug(f"group {group_name}: {len(hosts.hosts)} hosts ({kind}); rank {rank} is local rank {local} of "
           f"{len(hosts.hosts[me])} on host {me} ({hosts.ids[rank]})")
    return native(store, rank, size, timeout, group_name, hosts.ids[rank], me, len(hosts.hosts), hosts.hosts[me],
                  hosts.host_of, kind == "uniform", rail, flat)
