"""The simulator: the time of a schedule from per-link alpha-beta parameters, at any rank count,
with the bytes on every link and the busiest one named.

    r = simulate("ring", ranks=1024, size=64 << 20, link="nvlink")
    r = simulate(my_factory, ranks=256, hosts=32, link="nvlink", network="400gbit")
    pycoll-sim ring --ranks 1024 --link nvlink --size 64MiB
    pycoll-sim hierarchical --ranks 4096 --hosts 512 --link nvlink --net 400gbit

The model. Ranks sit on hosts (`hosts`, equal numbers of ranks each); between two ranks of a
host a message crosses the intra-host link, between hosts the network. Every rank has one port
out and one in on the intra-host link; every host has `nics` network ports each way (rank r uses
NIC r % nics; by default one per rank). With `lane_ports` every lane of a rank has its own port
pair on the intra-host link instead (the CPU engine: a lane is a thread, and each core copies at
its own rate; a rank's lanes do not share one port). A message of b bytes on a link (alpha, beta) takes the
sender's and the receiver's ports for b * beta seconds, first come first served, and arrives
alpha + b * beta after it starts; the send step then has finished. A receive that reduces, and a
local reduction, takes b * gamma; a receive or local copy b * copy_gamma (both 0 by default, the
textbook's alpha-beta model). Steps run in their lanes' order, after their `deps` and after
receive k - channel_depth of their channel (a send), as the engines run them. A link may have a
second pair (alpha, beta) for messages of collectives larger than its `cache` bytes (out of
cache).

Programs of one lane per rank written with copies and reductions take a fast path in numpy
arrays (fastsim.py: the ring at 4,096 ranks in about 30 s); the others, and those whose ports
serve several senders at once, the event simulation of the lowered IR (`_Sim`).

The result has the time, the longest chain of messages ("steps": 2(N-1) for the ring all_reduce),
the bytes each rank sends (2(N-1)/N of the message for the ring all_reduce), and per link port
the bytes and the busy time; `busiest` names the port with the most busy time.
"""
from __future__ import annotations

import argparse
import heapq
import importlib
import inspect
import json
import re
import sys
from dataclasses import dataclass, field
from typing import Dict, Optional

from . import collectives
from .errors import ScheduleError
from .ir import IR


@dataclass
class Link:
    """alpha (s) and beta (s/byte); large_* apply to collectives larger than `cache` bytes."""
    name: str
    alpha: float
    beta: float
    cache: Optional[int] = None
    large_alpha: Optional[float] = None
    large_beta: Optional[float] = None

    def params(self, total_bytes: int):
        if self.cache is not None and total_bytes > self.cache:
            return (self.large_alpha if self.large_alpha is not None else self.alpha,
                    self.large_beta if self.large_beta is not None else self.beta)
        return self.alpha, self.beta

    def describe(self) -> str:
        s = f"{self.name}: alpha {_fmt_time(self.alpha)}, {_fmt_bw(1 / self.beta)}"
        if self.cache is not None:
            a, b = self.params(self.cache + 1)
            s += f"; above {_fmt_bytes(self.cache)}: alpha {_fmt_time(a)}, {_fmt_bw(1 / b)}"
        return s


# Round figures of each link's usable rate per direction and latency of one message, for
# comparisons on paper; pass measured ones (alpha=...,beta=...) for predictions.
LINKS = {
    "nvlink": Link("nvlink", 2e-6, 1 / 300e9),     # NVLink 4 through NVSwitch, per GPU
    "pcie": Link("pcie", 5e-6, 1 / 24e9),          # PCIe 4.0 x16
    "100gbit": Link("100gbit", 5e-6, 1 / 12e9),    # 100 Gb/s RDMA NIC
    "400gbit": Link("400gbit", 5e-6, 1 / 48e9),    # 400 Gb/s RDMA NIC
}

_UNITS_T = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "ns": 1e-9}
_UNITS_B = {"b": 1, "k": 1e3, "kb": 1e3, "m": 1e6, "mb": 1e6, "g": 1e9, "gb": 1e9, "kib": 1 << 10,
            "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40}


def parse_size(text) -> int:
    """64MiB, 1G, 4096 -> bytes."""
    m = re.fullmatch(r"\s*([0-9.]+(?:e[0-9+-]+)?)\s*([a-zA-Z]*)\s*", str(text))
    if not m or m.group(2).lower() not in _UNITS_B and m.group(2):
        raise ValueError(f"not a size: {text!r} (e.g. 4096, 64KiB, 1GiB)")
    return int(float(m.group(1)) * _UNITS_B.get(m.group(2).lower(), 1))


def _parse_time(text) -> float:
    m = re.fullmatch(r"([0-9.]+(?:e[0-9+-]+)?)([a-z]*)", text)
    if not m or (m.group(2) and m.group(2) not in _UNITS_T):
        raise ValueError(f"not a time: {text!r} (e.g. 2us, 1.5e-6)")
    return float(m.group(1)) * _UNITS_T.get(m.group(2), 1.0)


def _parse_bw(text) -> float:
    """12GB/s, 100Gbit, 3e11 -> bytes/s."""
    m = re.fullmatch(r"([0-9.]+(?:e[0-9+-]+)?)([a-z]*?)(bit)?(/s)?", text.lower())
    if not m:
        raise ValueError(f"not a bandwidth: {text!r} (e.g. 12GB/s, 100Gbit)")
    scale = {"": 1, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12, "kb": 1e3, "mb": 1e6, "gb": 1e9, "tb": 1e12,
             "b": 1}.get(m.group(2))
    if scale is None:
        raise ValueError(f"not a bandwidth: {text!r}")
    return float(m.group(1)) * scale / (8 if m.group(3) else 1)


def parse_link(text) -> Link:
    """A preset (nvlink, pcie, 100gbit, 400gbit) or alpha=..,beta=.. (or bw=..), with optional
    cache=.., large_alpha=.., large_beta=.. (or large_bw=..) for out-of-cache sizes."""
    if isinstance(text, Link):
        return text
    if text in LINKS:
        return LINKS[text]
    kv = {}
    for part in str(text).split(","):
        k, sep, v = part.partition("=")
        if not sep:
            raise ValueError(f"unknown link {text!r}: a preset ({', '.join(LINKS)}) or alpha=..,beta=..")
        kv[k.strip()] = v.strip()
    try:
        alpha = _parse_time(kv.pop("alpha"))
        beta = _parse_time(kv.pop("beta")) if "beta" in kv else 1 / _parse_bw(kv.pop("bw"))
    except KeyError:
        raise ValueError(f"link {text!r} needs alpha= and beta= (s/byte) or bw= (bytes/s)") from None
    link = Link("custom", alpha, beta)
    if "cache" in kv:
        link.cache = parse_size(kv.pop("cache"))
    if "large_alpha" in kv:
        link.large_alpha = _parse_time(kv.pop("large_alpha"))
    if "large_beta" in kv:
        link.large_beta = _parse_time(kv.pop("large_beta"))
    if "large_bw" in kv:
        link.large_beta = 1 / _parse_bw(kv.pop("large_bw"))
    if "name" in kv:
        link.name = kv.pop("name")
    if kv:
        raise ValueError(f"link {text!r}: unknown keys {', '.join(kv)}")
    return link


@dataclass
class Topology:
    """`ranks` on `hosts` hosts (ranks // hosts each, consecutive ranks together)."""
    ranks: int
    link: Link = field(default_factory=lambda: LINKS["nvlink"])
    hosts: int = 1
    network: Optional[Link] = None
    nics: Optional[int] = None  # network ports per host, each way (default: one per rank)
    gamma: float = 0.0          # s/byte of a reduction
    copy_gamma: float = 0.0     # s/byte of a local copy or of moving a received message
    lane_ports: bool = False    # one intra-host port pair per lane, not per rank (CPU threads)

    def __post_init__(self):
        self.link = parse_link(self.link)
        if self.hosts < 1 or self.ranks % self.hosts:
            raise ValueError(f"{self.ranks} ranks do not divide into {self.hosts} hosts")
        if self.hosts > 1:
            self.network = parse_link(self.network or "400gbit")
        self.per_host = self.ranks // self.hosts
        self.nics = self.nics or self.per_host

    def describe(self) -> str:
        if self.hosts == 1:
            return f"{self.ranks} ranks on {self.link.describe()}" + (", a port per lane" if self.lane_ports else "")
        return (f"{self.hosts} hosts x {self.per_host} ranks; in a host {self.link.describe()}; "
                f"between hosts {self.network.describe()} ({self.nics} NICs per host)")


@dataclass
class Result:
    name: str
    collective: str
    ranks: int
    size: int                 # bytes of one rank's message (one block)
    time: float               # seconds
    steps: int                # messages on the longest chain
    messages: int
    bytes_sent: Dict[int, int]  # per rank
    links: Dict[str, dict]    # port -> {"link", "bytes", "busy"}
    busiest: str
    topology: str

    @property
    def max_bytes_per_rank(self) -> int:
        return max(self.bytes_sent.values(), default=0)

    def summary(self) -> str:
        by_link: Dict[str, int] = {}
        for v in self.links.values():
            by_link[v["link"]] = by_link.get(v["link"], 0) + v["bytes"]
        b = self.links.get(self.busiest, {"bytes": 0, "busy": 0.0, "link": "-"})
        ratio = self.max_bytes_per_rank / self.size if self.size else 0.0
        lines = [
            f"{self.name}: {self.collective} of {_fmt_bytes(self.size)} per rank on {self.topology}",
            f"  time            {_fmt_time(self.time)}",
            f"  steps           {self.steps} messages on the longest chain, {self.messages} messages in all",
            f"  sent per rank   {_fmt_bytes(self.max_bytes_per_rank)} at most ({ratio:.4f} x the message)",
            "  bytes per link  " + ", ".join(f"{k} {_fmt_bytes(v)}" for k, v in sorted(by_link.items())),
            f"  busiest port    {self.busiest}: {_fmt_bytes(b['bytes'])}, busy {_fmt_time(b['busy'])}"
            + (f" ({100 * b['busy'] / self.time:.0f}% of the time)" if self.time else ""),
        ]
        return "\n".join(lines)

    def to_json(self) -> dict:
        return {"name": self.name, "collective": self.collective, "ranks": self.ranks, "size": self.size,
                "time": self.time, "steps": self.steps, "messages": self.messages,
                "max_bytes_per_rank": self.max_bytes_per_rank, "busiest": self.busiest,
                "links": self.links, "topology": self.topology}


def _fmt_time(t: float) -> str:
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if t >= scale:
            return f"{t / scale:.3f} {unit}"
    return f"{t / 1e-9:.1f} ns"


def _fmt_bytes(b: float) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if b >= scale:
            return f"{b / scale:.2f} {unit}"
    return f"{int(b)} B"


def _fmt_bw(bps: float) -> str:
    return f"{bps / 1e9:.1f} GB/s"


def _build(program, ranks: Optional[int] = None, hosts: int = 1, **kwargs):
    """A Program or an IR from an IR, a Program, a JSON file, a factory, an example's name or
    module:function (a factory's Program is not lowered yet)."""
    from .language import Program, _no_gc

    if isinstance(program, (IR, Program)):
        return program
    if isinstance(program, str):
        if program.endswith(".json"):
            with open(program) as fh:
                return IR.from_json(fh.read())
        from .registry import resolve

        program = resolve(program)
    if not callable(program):
        raise ScheduleError(f"not a program: {program!r}")
    if ranks is None:
        raise ScheduleError("a program factory needs ranks=")
    try:
        params = inspect.signature(program).parameters
    except (TypeError, ValueError):
        params = {}
    if hosts > 1 and "per_host" in params and "per_host" not in kwargs:
        kwargs["per_host"] = ranks // hosts
    with _no_gc():
        return program(ranks, **kwargs)


def load_program(program, ranks: Optional[int] = None, hosts: int = 1, **kwargs) -> IR:
    """An IR from an IR, a Program, a JSON file, a factory, an example's name or module:function."""
    from .language import Program, _no_gc

    built = _build(program, ranks, hosts, **kwargs)
    if isinstance(built, Program):
        with _no_gc():
            return built.lower()
    return built


def simulate(program, ranks: Optional[int] = None, *, size: int = 1 << 20, dtype_bytes: int = 4,
             topology: Optional[Topology] = None, link="nvlink", hosts: int = 1, network=None,
             nics: Optional[int] = None, gamma: float = 0.0, copy_gamma: float = 0.0, lane_ports: bool = False,
             **program_kwargs) -> Result:
    """Simulates one call of `program` with a message of `size` bytes per rank (see the module's docstring).

    A Program (or a factory's, or a shipped example's) of one lane per rank is simulated from its
    steps as written, in numpy arrays (fastsim.py); other programs, an IR, and programs whose
    ports serve several senders at once (fastsim.py says when) by the event simulation of the IR."""
    from .language import Program, _no_gc

    built = _build(program, ranks, hosts, **program_kwargs)
    n = built.ranks
    if ranks is not None and n != ranks:
        raise ScheduleError(f"program {built.name!r} was built for {n} ranks, not {ranks}")
    if topology is None:
        topology = Topology(n, link=link, hosts=hosts, network=network, nics=nics, gamma=gamma,
                            copy_gamma=copy_gamma, lane_ports=lane_ports)
    elif topology.ranks != n:
        raise ScheduleError(f"topology of {topology.ranks} ranks for a program of {n}")
    if isinstance(built, Program):
        with _no_gc():
            res = _fast(built, topology, size, dtype_bytes)
        if isinstance(res, Result):
            return res
        with _no_gc():
            built = res if res is not None else built.lower()
    with _no_gc():
        return _Sim(built, topology, size, dtype_bytes).run()


def _fast(p, topo: Topology, size: int, dtype_bytes: int):
    """The Result from fastsim, or the IR it lowered (ports shared: the event simulation runs
    it), or None (not a program for fastsim)."""
    from .fastsim import FastSim, Unsupported

    try:
        out = FastSim(p, topo, size, dtype_bytes).run()
    except Unsupported:
        return None
    if isinstance(out, IR):
        return out
    end, steps, messages, sent, pbytes, pbusy, pfirst, pfirst_node = out
    N, nics = p.ranks, topo.nics
    used = [int(i) for i in (pfirst != float("inf")).nonzero()[0]]
    used.sort(key=lambda i: (pfirst[i], pfirst_node[i]))  # the order the event simulation meets them

    def port_name(i):
        if i < 2 * N:
            lane = " lane 0" if topo.lane_ports else ""
            return f"rank {i % N}{lane} {'out' if i < N else 'in'} ({topo.link.name})"
        j = i - 2 * N
        way, j = ("out", j) if j < topo.hosts * nics else ("in", j - topo.hosts * nics)
        return f"host {j // nics} NIC {j % nics} {way} ({topo.network.name})"

    links = {}
    for i in used:
        kind = topo.link.name if i < 2 * N else topo.network.name
        links[port_name(i)] = {"link": kind, "bytes": int(pbytes[i]), "busy": float(pbusy[i])}
    busiest = max(links, key=lambda k: (links[k]["busy"], links[k]["bytes"]), default="-")
    return Result(name=p.name, collective=p.collective, ranks=N, size=size, time=end, steps=steps,
                  messages=messages, bytes_sent={r: int(b) for r, b in enumerate(sent)}, links=links,
                  busiest=busiest, topology=topo.describe())


class _Sim:
    def __init__(self, ir: IR, topo: Topology, size: int, dtype_bytes: int):
        self.ir, self.topo, self.size = ir, topo, size
        E = size // dtype_bytes
        K = ir.chunks
        s = -(-E // K) if K else 0
        self.chunk_bytes = [max(0, min((j + 1) * s, E) - min(j * s, E)) * dtype_bytes for j in range(K)]
        self.scratch_bytes = s * dtype_bytes
        self.cum_bytes = [0]
        for b in self.chunk_bytes:
            self.cum_bytes.append(self.cum_bytes[-1] + b)
        blocks_out = collectives.blocks(ir.collective, "out", ir.ranks)
        blocks_in = collectives.blocks(ir.collective, "in", ir.ranks)
        total = size * max(blocks_in, blocks_out)
        self.intra = topo.link.params(total)
        self.net = topo.network.params(total) if topo.network else None

    def region_bytes(self, reg) -> int:
        buf, start, count = reg
        if buf == "scratch":
            return count * self.scratch_bytes
        K, cb = self.ir.chunks, self.chunk_bytes
        if count == 1:
            return cb[start % K]
        cum, block = self.cum_bytes, self.cum_bytes[-1]  # sum of chunk bytes from start, by prefix sums
        end = start + count
        return (end // K - start // K) * block + cum[end % K] - cum[start % K]

    def run(self) -> Result:
        ir, topo = self.ir, self.topo
        N = ir.ranks
        per_host = topo.per_host
        # Node numbering and static arrays.
        base = {}
        steps = []
        rank_of = []
        for r, lanes in enumerate(ir.steps):
            for l, lst in enumerate(lanes):
                base[(r, l)] = len(steps)
                steps.extend(lst)
                rank_of.extend([r] * len(lst))
        n_nodes = len(steps)
        lane_of = [0] * n_nodes
        for (r, l), b in base.items():
            for i in range(len(ir.steps[r][l])):
                lane_of[b + i] = l
        sends = {}
        for n, s in enumerate(steps):
            if s[0] == "send":
                sends.setdefault((rank_of[n], s[3], lane_of[n]), {})[s[4]] = n
        succ = [[] for _ in range(n_nodes)]
        indeg = [0] * n_nodes
        recvs = {}
        match = [-1] * n_nodes
        for n, s in enumerate(steps):
            r, l = rank_of[n], lane_of[n]
            if n > base[(r, l)]:
                succ[n - 1].append(n)
                indeg[n] += 1
            for dl, di in s[5]:
                succ[base[(r, dl)] + di].append(n)
                indeg[n] += 1
            if s[0] in ("recv", "recv_reduce"):
                sn = sends.get((s[3], r, l), {}).get(s[4])
                if sn is None:
                    raise ScheduleError(f"rank {r}: a receive from rank {s[3]} has no send (run check())")
                match[n] = sn
                succ[sn].append(n)
                indeg[n] += 1
                recvs[(s[3], r, l, s[4])] = n
        D = ir.channel_depth
        for (src, dst, l), by_seq in sends.items():
            for seq, sn in by_seq.items():
                if seq >= D:
                    rn = recvs.get((src, dst, l, seq - D))
                    if rn is not None:
                        succ[rn].append(sn)
                        indeg[sn] += 1

        ready_at = [0.0] * n_nodes
        depth = [0] * n_nodes
        finish = [0.0] * n_nodes
        arrive = {}
        port_free: Dict[tuple, float] = {}
        port_bytes: Dict[tuple, int] = {}
        port_busy: Dict[tuple, float] = {}
        sent = [0] * N
        gamma, copy_gamma = topo.gamma, topo.copy_gamma
        intra, net = self.intra, self.net
        nics = topo.nics
        # A send and its receive share the lane number (channels are per lane).
        lane_key = lane_of if topo.lane_ports else [0] * n_nodes
        heap = [(0.0, n) for n in range(n_nodes) if indeg[n] == 0]
        heapq.heapify(heap)
        done = 0
        end = 0.0
        messages = 0
        while heap:
            t, n = heapq.heappop(heap)
            done += 1
            s = steps[n]
            op = s[0]
            r = rank_of[n]
            if op == "send":
                b = self.region_bytes(s[1])
                peer = s[3]
                if r // per_host == peer // per_host:
                    (alpha, beta), po, pi = intra, ("out", r, lane_key[n]), ("in", peer, lane_key[n])
                else:
                    (alpha, beta) = net
                    po = ("nic out", r // per_host, r % per_host % nics)
                    pi = ("nic in", peer // per_host, peer % per_host % nics)
                occ = b * beta
                start = max(t, port_free.get(po, 0.0), port_free.get(pi, 0.0))
                port_free[po] = port_free[pi] = start + occ
                port_bytes[po] = port_bytes.get(po, 0) + b
                port_bytes[pi] = port_bytes.get(pi, 0) + b
                port_busy[po] = port_busy.get(po, 0.0) + occ
                port_busy[pi] = port_busy.get(pi, 0.0) + occ
                f = start + occ
                arrive[n] = start + alpha + occ
                sent[r] += b
                messages += 1
            elif op == "recv" or op == "recv_reduce":
                b = self.region_bytes(s[2])
                f = t + b * (gamma if op == "recv_reduce" else copy_gamma)
            else:
                b = self.region_bytes(s[2])
                f = t + b * (gamma if op == "reduce" else copy_gamma)
            finish[n] = f
            if f > end:
                end = f
            dn = depth[n]
            for m in succ[n]:
                if match[m] == n:
                    tm = arrive.pop(n)
                    if dn + 1 > depth[m]:
                        depth[m] = dn + 1
                else:
                    tm = f
                    if dn > depth[m]:
                        depth[m] = dn
                if tm > ready_at[m]:
                    ready_at[m] = tm
                indeg[m] -= 1
                if indeg[m] == 0:
                    heapq.heappush(heap, (ready_at[m], m))
        if done != n_nodes:
            raise ScheduleError(f"the schedule deadlocks after {done} of {n_nodes} steps (run check())")

        def port_name(p):
            if p[0] in ("out", "in"):
                lane = f" lane {p[2]}" if topo.lane_ports else ""
                return f"rank {p[1]}{lane} {p[0]} ({topo.link.name})"
            return f"host {p[1]} NIC {p[2]} {p[0].split()[1]} ({topo.network.name})"

        links = {}
        for p, b in port_bytes.items():
            kind = topo.link.name if p[0] in ("out", "in") else topo.network.name
            links[port_name(p)] = {"link": kind, "bytes": b, "busy": port_busy[p]}
        busiest = max(links, key=lambda k: (links[k]["busy"], links[k]["bytes"]), default="-")
        return Result(name=ir.name, collective=ir.collective, ranks=N, size=self.size, time=end,
                      steps=max(depth, default=0), messages=messages, bytes_sent=dict(enumerate(sent)),
                      links=links, busiest=busiest, topology=topo.describe())


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="pycoll-sim", description="Simulates a schedule's time from "
                                 "alpha-beta link parameters (pycollectives.schedule.simulate).")
    ap.add_argument("program", help="an example's name (ring, rabenseifner, bruck, double_tree, "
                    "hierarchical, ...), module:function, or an IR .json file")
    ap.add_argument("--ranks", type=int, required=True)
    ap.add_argument("--size", default="64MiB", help="bytes of one rank's message (default 64MiB)")
    ap.add_argument("--dtype-bytes", type=int, default=4)
    ap.add_argument("--link", default="nvlink", help="in a host: nvlink, pcie, 100gbit, 400gbit or "
                    "alpha=..,beta=.. (or bw=..), optionally cache=..,large_alpha=..,large_beta=..")
    ap.add_argument("--hosts", type=int, default=1)
    ap.add_argument("--net", default="400gbit", help="between hosts (with --hosts > 1), as --link")
    ap.add_argument("--nics", type=int, default=None, help="network ports per host (default: one per rank)")
    ap.add_argument("--gamma", type=float, default=0.0, help="seconds per byte reduced")
    ap.add_argument("--lane-ports", action="store_true", help="a port pair per lane in a host, not per rank "
                    "(the CPU engine, whose lanes are threads)")
    ap.add_argument("--pieces", type=int, default=None, help="the program's pieces= (pipelining), if it takes one")
    ap.add_argument("--check", action="store_true", help="check the program first")
    ap.add_argument("--json", action="store_true", help="print the result as JSON")
    args = ap.parse_args(argv)
    try:
        prog = _build(args.program, args.ranks, args.hosts, **({"pieces": args.pieces} if args.pieces else {}))
        if args.check:
            from .check import check

            check(load_program(prog), ranks=args.ranks)
        res = simulate(prog, args.ranks, size=parse_size(args.size), dtype_bytes=args.dtype_bytes,
                       link=args.link, hosts=args.hosts, network=args.net if args.hosts > 1 else None,
                       nics=args.nics, gamma=args.gamma, lane_ports=args.lane_ports)
    except (ScheduleError, ValueError, ImportError, AttributeError) as e:
        print(f"pycoll-sim: {e}", file=sys.stderr)
        return 2
    print(json.dumps(res.to_json(), indent=1) if args.json else res.summary())
    return 0


if __name__ == "__main__":
    sys.exit(main())
