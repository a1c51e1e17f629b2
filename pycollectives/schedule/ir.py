"""The lowered form of a program: what an engine executes and the checker, the simulator and the
reference interpreter read.

For every rank and every lane (a thread on CPU, a thread block on GPU) a list of steps, run in
order. A step touches only buffers of its own rank; regions are (buffer, first chunk, chunk count)
with buffer "in", "out" or "scratch", in units of the IR's chunks (`chunks` per block of one rank's
message; a buffer of B blocks has B * chunks of them). Steps (JSON objects):

- {"op": "send", "src": R, "peer": p, "seq": k}: puts region R into message k of channel
  (this rank -> p, this lane). It has finished when the data has left R (copied into the channel).
- {"op": "recv", "dst": R, "peer": p, "seq": k}: waits for message k of channel (p -> this rank,
  this lane) and copies it into R; {"op": "recv_reduce", ...} reduces it into R (R = R op message).
- {"op": "copy", "src": R1, "dst": R2} and {"op": "reduce", "src": R1, "dst": R2}: local.
- "deps": [[lane, index], ...] (optional): steps of this rank on other lanes that must have
  finished before this one starts.

A channel holds at most `channel_depth` messages: send k may start once receive k - channel_depth
of its channel has finished. A program cut into `pieces` numbers a block's chunks piece first
(IR chunk i * C + c is piece i of the program's chunk c, C = chunks / pieces); nothing in the IR
depends on it, but it keeps a piece of neighbouring chunks one region. Chunk c of a block of E elements is elements
[c * s, min((c + 1) * s, E)) with s = ceil(E / chunks) (the last chunks may be short or empty);
scratch chunk c is elements [c * s, (c + 1) * s) of the scratch buffer; a copy between chunks of
different lengths moves the shorter length. With `inplace`, the input and output alias as
`collectives.storage` says (all_reduce, broadcast, reduce: one buffer; all_gather: the input is
block `rank` of the output; reduce_scatter: the output is block `rank` of the input).

`digest()` is the sha256 of the canonical JSON: ranks compare it in the per-op check word.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import List, Optional, Tuple

from .errors import ScheduleError

FORMAT = "pycoll-schedule/1"
OPS = ("send", "recv", "recv_reduce", "copy", "reduce")

Region = Tuple[str, int, int]  # (buffer, first chunk, chunk count)


class Step(tuple):
    """(op, src, dst, peer, seq, deps): src/dst are Regions or None, peer/seq ints or None,
    deps a tuple of (lane, index)."""
    __slots__ = ()

    def __new__(cls, op, src=None, dst=None, peer=None, seq=None, deps=()):
        return tuple.__new__(cls, (op, src, dst, peer, seq, deps))

    op = property(lambda s: s[0])
    src = property(lambda s: s[1])
    dst = property(lambda s: s[2])
    peer = property(lambda s: s[3])
    seq = property(lambda s: s[4])
    deps = property(lambda s: s[5])

    def reads(self):
        """Regions this step reads."""
        op, src, dst = self[0], self[1], self[2]
        if op == "send" or op == "copy":
            return (src,)
        if op == "reduce":
            return (src, dst)
        if op == "recv_reduce":
            return (dst,)
        return ()

    def writes(self):
        return () if self[0] == "send" else (self[2],)

    def to_json(self) -> dict:
        d = {"op": self[0]}
        if self[1] is not None:
            d["src"] = list(self[1])
        if self[2] is not None:
            d["dst"] = list(self[2])
        if self[3] is not None:
            d["peer"] = self[3]
        if self[4] is not None:
            d["seq"] = self[4]
        if self[5]:
            d["deps"] = [list(x) for x in self[5]]
        return d

    @classmethod
    def from_json(cls, d: dict) -> "Step":
        def region(r):
            if r is None:
                return None
            if not (isinstance(r, (list, tuple)) and len(r) == 3):
                raise ScheduleError(f"a region is [buffer, first chunk, count], not {r!r}")
            return (str(r[0]), int(r[1]), int(r[2]))

        return cls(d["op"], region(d.get("src")), region(d.get("dst")), d.get("peer"), d.get("seq"),
                   tuple((int(a), int(b)) for a, b in d.get("deps", ())))

    def describe(self) -> str:
        op = self[0]
        if op == "send":
            return f"send {_region(self[1])} to rank {self[3]}"
        if op in ("recv", "recv_reduce"):
            verb = "receive into" if op == "recv" else "receive and reduce into"
            return f"{verb} {_region(self[2])} from rank {self[3]}"
        return f"{op} {_region(self[1])} to {_region(self[2])}"


def _region(r) -> str:
    from .collectives import BUFFER_NAMES

    name = BUFFER_NAMES.get(r[0], r[0])
    if r[2] == 1:
        return f"{name} chunk {r[1]}"
    return f"{name} chunks {r[1]}-{r[1] + r[2] - 1}"


@dataclass
class IR:
    """A lowered program. steps[rank][lane] is the list of that lane's Steps."""
    name: str
    collective: str
    ranks: int
    chunks: int  # IR chunks per block (program chunks x pieces)
    steps: List[List[List[Step]]]
    pieces: int = 1  # IR chunks per program chunk
    root: Optional[int] = None
    inplace: bool = False
    scratch: int = 0  # scratch chunks per rank, in IR chunks
    channel_depth: int = 2
    meta: dict = field(default_factory=dict)  # free-form, not part of the digest

    @property
    def lanes(self) -> int:
        return max((len(r) for r in self.steps), default=0)

    def num_steps(self) -> int:
        return sum(len(lane) for r in self.steps for lane in r)

    def to_json(self) -> dict:
        return {
            "format": FORMAT, "name": self.name, "collective": self.collective, "ranks": self.ranks,
            "chunks": self.chunks, "pieces": self.pieces, "root": self.root, "inplace": self.inplace,
            "scratch": self.scratch, "lanes": self.lanes, "channel_depth": self.channel_depth,
            "steps": [[[s.to_json() for s in lane] for lane in r] for r in self.steps],
        }

    def dumps(self, indent=None) -> str:
        if indent is None:
            return json.dumps(self.to_json(), sort_keys=True, separators=(",", ":"))
        return json.dumps(self.to_json(), sort_keys=True, indent=indent)

    @classmethod
    def from_json(cls, d) -> "IR":
        if isinstance(d, (str, bytes)):
            d = json.loads(d)
        if d.get("format") != FORMAT:
            raise ScheduleError(f"not a schedule of format {FORMAT}: format {d.get('format')!r}")
        steps = [[[Step.from_json(s) for s in lane] for lane in r] for r in d["steps"]]
        lanes = int(d.get("lanes", 0))
        for r in steps:  # a rank without steps on the last lanes still has them (empty)
            r.extend([] for _ in range(lanes - len(r)))
        return cls(name=d["name"], collective=d["collective"], ranks=int(d["ranks"]),
                   chunks=int(d["chunks"]), steps=steps, pieces=int(d.get("pieces", 1)),
                   root=d.get("root"), inplace=bool(d.get("inplace", False)),
                   scratch=int(d.get("scratch", 0)), channel_depth=int(d.get("channel_depth", 2)))

    def chunk_bounds(self, buffer: str, chunk: int, numel: int) -> Tuple[int, int]:
        """Elements [start, end) of chunk `chunk` of `buffer`, for a message of `numel` elements
        per block (the layout every engine and the interpreter use)."""
        s = -(-numel // self.chunks)
        if buffer == "scratch":
            return chunk * s, (chunk + 1) * s
        b, j = divmod(chunk, self.chunks)
        return b * numel + min(j * s, numel), b * numel + min((j + 1) * s, numel)

    def channels(self) -> dict:
        """{(src, dst, lane): {"messages": n, "max_chunks": largest message in chunks}}: what an
        engine connects and how large its slots must be (scratch chunks are full size)."""
        out = {}
        for r, lanes in enumerate(self.steps):
            for lane, lst in enumerate(lanes):
                for s in lst:
                    if s.op == "send":
                        c = out.setdefault((r, s.peer, lane), {"messages": 0, "max_chunks": 0})
                        c["messages"] += 1
                        c["max_chunks"] = max(c["max_chunks"], s.src[2])
        return out

    def for_rank(self, rank: int) -> dict:
        """The header and rank `rank`'s lanes only, as JSON: what one engine process executes."""
        d = self.to_json()
        d["rank"] = rank
        d["steps"] = d["steps"][rank]
        d["digest"] = self.digest()
        return d

    def digest(self) -> str:
        """sha256 (hex) of the canonical JSON: equal for equal schedules on every rank."""
        return hashlib.sha256(self.dumps().encode()).hexdigest()

    def digest64(self) -> int:
        """The first 8 bytes of digest() as an unsigned integer, for a check word."""
        return int(self.digest()[:16], 16)
