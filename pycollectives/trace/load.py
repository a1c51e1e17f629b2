"""Reading flight-recorder dumps: one file per rank, as pycoll writes them (JSON) or as torch's
own recorder writes them (pickle), and the few accessors the analyzer and the timeline share."""
from __future__ import annotations

import json
import os
import pickle
import re
from dataclasses import dataclass

__all__ = ["RankDump", "Dumps", "load_dumps"]

# Bytes per element of the dtype names the recorders write (c10's names).
DTYPE_BYTES = {
    "Float": 4, "Double": 8, "Half": 2, "BFloat16": 2, "Int": 4, "Long": 8, "Short": 2, "Char": 1, "Byte": 1,
    "Bool": 1, "ComplexHalf": 4, "ComplexFloat": 8, "ComplexDouble": 16, "UInt16": 2, "UInt32": 4, "UInt64": 8,
    "Float8_e4m3fn": 1, "Float8_e5m2": 1, "Float8_e4m3fnuz": 1, "Float8_e5m2fnuz": 1, "QInt8": 1, "QUInt8": 1,
    "QInt32": 4,
}


@dataclass
class RankDump:
    """One rank's dump. `data` is the file's content as written."""

    rank: int
    path: str
    data: dict

    @property
    def entries(self) -> list:
        return self.data.get("entries") or []

    @property
    def pg_config(self) -> dict:
        return self.data.get("pg_config") or {}

    @property
    def pg_status(self) -> dict:
        return self.data.get("pg_status") or {}

    @property
    def hostname(self) -> str:
        return str(self.data.get("hostname") or "")

    @property
    def pid(self):
        return self.data.get("pid")

    @property
    def world_size(self) -> int:
        ws = self.data.get("world_size")
        return ws if isinstance(ws, int) else 0

    @property
    def dump_reason(self) -> str:
        return str(self.data.get("dump_reason") or "")

    @property
    def dump_time_ns(self):
        t = self.data.get("dump_time_ns")
        return t if isinstance(t, int) else None

    @property
    def wrapped(self) -> bool:
        """Whether the ring dropped older entries (record ids start at 1)."""
        ids = [e.get("record_id") for e in self.entries if isinstance(e.get("record_id"), int)]
        return bool(ids) and min(ids) > 1


class Dumps(list):
    """The dumps of a job, one per rank, sorted by rank. `skipped` lists (path, why) of the files
    in the folder that were not read as dumps of a rank."""

    def __init__(self, items=(), where: str = "", skipped=None):
        super().__init__(items)
        self.where = where
        self.skipped = list(skipped or [])


class _PlainUnpickler(pickle.Unpickler):
    """Reads only plain data (dicts, lists, strings, numbers): a torch dump holds nothing else,
    and a file that asks for any class is not loaded."""

    def find_class(self, module, name):
        raise pickle.UnpicklingError(f"refusing {module}.{name}")


_TRAILING_RANK = re.compile(r"(\d+)$")


def _parse(path: str):
    """The dump in `path` as a dict, or (None, why)."""
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as e:
        return None, str(e)
    head = raw.lstrip()[:1]
    if head == b"{":
        try:
            data = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as e:
            return None, f"not valid JSON ({e})"
        if data.get("backend") != "pycoll" or not isinstance(data.get("entries"), list):
            return None, "JSON without \"backend\": \"pycoll\" and an \"entries\" list"
        return data, ""
    if raw[:1] == b"\x80":  # a pickle (torch's recorder writes protocol 2 or later)
        try:
            import io

            data = _PlainUnpickler(io.BytesIO(raw)).load()
        except Exception as e:  # noqa: BLE001 (any unreadable pickle is just not a dump)
            return None, f"not a plain-data pickle ({e})"
        if not isinstance(data, dict) or not isinstance(data.get("entries"), list) or "pg_config" not in data:
            return None, "a pickle without torch's dump layout"
        data = dict(data)
        data.setdefault("backend", "torch")
        return data, ""
    return None, "neither JSON nor a pickle"


def load_dumps(where) -> Dumps:
    """Every rank's dump in folder `where` (or the files of a list of paths), sorted by rank.

    A file counts when its JSON has "backend": "pycoll" and an "entries" list, or it is a torch
    flight-recorder pickle. The rank is the dump's "rank", else the digits the file name ends in.
    Two dumps of one rank: the later one (dump_time_ns) is kept."""
    if isinstance(where, (str, os.PathLike)):
        where = os.fspath(where)
        if os.path.isdir(where):
            paths = [os.path.join(where, n) for n in sorted(os.listdir(where))]
            paths = [p for p in paths if os.path.isfile(p)]
        elif os.path.isfile(where):
            paths = [where]
        else:
            raise FileNotFoundError(f"{where}: no such folder or file")
        label = where
    else:
        paths = [os.fspath(p) for p in where]
        label = ", ".join(paths)
    by_rank: dict[int, RankDump] = {}
    skipped = []
    for path in paths:
        data, why = _parse(path)
        if data is None:
            skipped.append((path, why))
            continue
        rank = data.get("rank")
        if not isinstance(rank, int) or rank < 0:
            m = _TRAILING_RANK.search(os.path.basename(path))
            if not m:
                skipped.append((path, "no rank in the dump or the file name"))
                continue
            rank = int(m.group(1))
        d = RankDump(rank=rank, path=path, data=data)
        old = by_rank.get(rank)
        if old is not None:
            keep, drop = (d, old) if (d.dump_time_ns or 0) >= (old.dump_time_ns or 0) else (old, d)
            skipped.append((drop.path, f"an older dump of rank {rank} than {keep.path}"))
            d = keep
        by_rank[rank] = d
    return Dumps([by_rank[r] for r in sorted(by_rank)], where=label, skipped=skipped)


# ---- accessors of one entry, shared by the analyzer and the timeline ----


def op_name(entry: dict) -> str:
    """"pycoll:all_reduce" -> "all_reduce"; torch's "nccl:send 0->1" -> "send"."""
    name = str(entry.get("profiling_name") or "")
    if ":" in name:
        name = name.split(":", 1)[1]
    return name.split(" ", 1)[0] or "?"


def is_p2p(entry: dict) -> bool:
    if "is_p2p" in entry:
        return bool(entry["is_p2p"])
    return op_name(entry) in ("send", "recv")


def group_name(entry: dict) -> str:
    pg = entry.get("process_group")
    if isinstance(pg, (list, tuple)) and pg:
        return str(pg[0])
    return str(entry.get("pg_id", "?"))


def group_desc(entry: dict) -> str:
    pg = entry.get("process_group")
    if isinstance(pg, (list, tuple)) and len(pg) > 1:
        return str(pg[1])
    return ""


def parse_ranks(value):
    """pg_config's "ranks" ("[0, 1, 2]" or a list) as a list of ints, or None."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return None
    if isinstance(value, (list, tuple)) and value and all(isinstance(r, int) for r in value):
        return list(value)
    return None


def peer_of(entry: dict, members=None) -> int:
    """The global rank at the other end of a send/recv, or -1."""
    peer = entry.get("peer")
    if isinstance(peer, int) and peer >= 0:
        return peer
    # torch's names: "nccl:send 0->1", "nccl:recv 1<-0" (ranks of the group).
    name = str(entry.get("profiling_name") or "")
    m = re.search(r"(\d+)(->|<-)(\d+)", name)
    if not m:
        return -1
    other = int(m.group(3))
    if members and 0 <= other < len(members):
        return members[other]
    return other


def state(entry: dict) -> str:
    """scheduled, started, completed, or failed (completed with an error)."""
    s = str(entry.get("state") or "?")
    return "failed" if s == "completed" and entry.get("error") else s


def tensor_bytes(sizes, dtypes) -> int | None:
    total = 0
    for i, shape in enumerate(sizes or []):
        dt = dtypes[i] if i < len(dtypes or []) else None
        per = DTYPE_BYTES.get(dt)
        if per is None:
            return None
        n = 1
        for s in shape:
            n *= int(s)
        total += n * per
    return total


def numel(sizes) -> int:
    total = 0
    for shape in sizes or []:
        n = 1
        for s in shape:
            n *= int(s)
        total += n
    return total
