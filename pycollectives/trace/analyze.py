"""The hang analyzer: matches every group's ops across the ranks' dumps by sequence number and
says, in a few lines, which rank is missing from which op, which op, size or dtype differs, which
rank left no dump, and which ops failed."""
from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field

from .load import (Dumps, RankDump, group_desc, group_name, is_p2p, load_dumps, numel, op_name, parse_ranks,
                   peer_of, state)

__all__ = ["Problem", "Report", "analyze"]

# Ops whose inputs have the same sizes on every rank, and those whose outputs do. Other ops (the
# all_to_all family, unknown ones) are compared by name and dtype only.
_SAME_INPUT = {
    "all_reduce", "allreduce", "broadcast", "reduce", "all_gather", "allgather", "all_gather_into_tensor",
    "_allgather_base", "gather", "all_reduce_coalesced", "allreduce_coalesced", "all_gather_coalesced",
    "allgather_coalesced", "allgather_into_tensor_coalesced", "all_reduce_barrier", "sparse_all_reduce",
}
_SAME_OUTPUT = {"reduce_scatter", "reduce_scatter_tensor", "_reduce_scatter_base", "scatter",
                "reduce_scatter_tensor_coalesced"}


@dataclass
class Problem:
    """One finding. kind: "missing" (ranks absent from an op others entered), "p2p" (a send or recv
    without its other half), "mismatch" (op, sizes or dtypes differ), "no_dump", "error"."""

    kind: str
    text: str
    group: str | None = None
    op: str | None = None
    seq: int | None = None
    ranks: list = field(default_factory=list)


@dataclass
class Report:
    problems: list
    notes: list
    ranks: list
    groups: list
    matched: int
    where: str = ""

    @property
    def ok(self) -> bool:
        return not self.problems

    def text(self) -> str:
        lines = [f"pycoll-trace: {_plural(len(self.ranks), 'dump')} (ranks {_ranks(self.ranks)}), "
                 f"{_plural(len(self.groups), 'group')}"]
        lines += [p.text for p in self.problems]
        lines += ["note: " + n for n in self.notes]
        if self.problems:
            lines.append(f"{_plural(len(self.problems), 'problem')} found")
        else:
            lines.append(f"no problem found: {_plural(len(self.ranks), 'rank')}, "
                         f"{_plural(len(self.groups), 'group')}, {_plural(self.matched, 'op')} matched")
        return "\n".join(lines)


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def _ranks(ranks) -> str:
    return ", ".join(str(r) for r in sorted(ranks))


def _who(ranks) -> str:
    ranks = sorted(ranks)
    return ("rank " if len(ranks) == 1 else "ranks ") + _ranks(ranks)


def _shapes(sizes) -> str:
    sizes = list(sizes or [])
    shown = ", ".join("[" + ", ".join(str(s) for s in shape) + "]" for shape in sizes[:3])
    if len(sizes) > 3:
        shown += f", ... ({len(sizes)} tensors)"
    return shown or "[]"


def _dtypes(entry) -> tuple:
    seen = []
    for dt in list(entry.get("input_dtypes") or []) + list(entry.get("output_dtypes") or []):
        if dt not in seen:
            seen.append(dt)
    return tuple(seen)


def _signature(entry) -> tuple:
    """What must agree across ranks at one sequence number, and how to show it."""
    op = op_name(entry)
    if op in _SAME_OUTPUT:
        sizes = entry.get("output_sizes")
    else:
        sizes = entry.get("input_sizes")
    key_sizes = _shapes(sizes) if (op in _SAME_INPUT or op in _SAME_OUTPUT) else None
    dts = _dtypes(entry)
    shown = f"{op} {_shapes(sizes)} {', '.join(dts) or '(no tensors)'}"
    return (op, key_sizes, dts), shown


class _Group:
    def __init__(self, name):
        self.name = name
        self.desc = ""
        self.members = None  # global ranks, from pg_config
        self.seen_on = set()  # ranks whose dump names the group

    @property
    def label(self) -> str:
        return f"group {self.name} ({self.desc})" if self.desc else f"group {self.name}"


class _RankView:
    """One rank's ops of one group."""

    def __init__(self, dump: RankDump, grp: _Group, entries):
        self.dump = dump
        self.rank = dump.rank
        self.has_group = grp.name in dump.pg_config or bool(entries)
        self.all = entries
        self.coll = {}
        for e in entries:
            s = e.get("collective_seq_id") or 0
            if not is_p2p(e) and s > 0:
                self.coll[s] = e
        self.p2p = sorted((e for e in entries if is_p2p(e)), key=lambda e: e.get("p2p_seq_id") or 0)
        status = dump.pg_status.get(grp.name) or {}
        self.status = status
        held = list(self.coll)
        self.min_held = min(held) if held else None
        enq = status.get("last_enqueued_collective")
        self.newest = max(held + [enq if isinstance(enq, int) else 0])
        # With nothing of this group left in a wrapped ring and no status, nothing is known.
        self.blind = dump.wrapped and not held and not isinstance(enq, int)

    def knows_absent(self, seq: int) -> bool:
        """Whether this rank certainly never entered collective `seq` (it lies beyond its newest)."""
        return not self.blind and seq > self.newest and seq not in self.coll

    def last_op_text(self) -> str:
        if not self.has_group:
            return "it has not created this group"
        if self.newest == 0:
            return "it has no op in this group"
        e = self.coll.get(self.newest)
        if e is not None:
            st = state(e)
        else:  # wrapped out of the ring: the group's counters say how far it got
            st = ("completed" if (self.status.get("last_completed_collective") or 0) >= self.newest else
                  "started" if (self.status.get("last_started_collective") or 0) >= self.newest else "scheduled")
        return f"its last op in this group is #{self.newest} ({st}){call_site(e)}"

    def p2p_complete(self) -> bool:
        """Whether this rank still holds every send/recv of the group (the ring did not drop any)."""
        if not self.dump.wrapped:
            return True
        return bool(self.p2p) and (self.p2p[0].get("p2p_seq_id") or 0) == 1

    def newest_entry_text(self) -> str:
        if not self.all:
            return "it has no op in this group" if self.has_group else "it has not created this group"
        e = max(self.all, key=lambda x: x.get("record_id") or 0)
        seq = e.get("p2p_seq_id") if is_p2p(e) else e.get("collective_seq_id")
        return f"its last op in this group is {op_name(e)} #{seq} ({state(e)}){call_site(e)}"


def call_site(e) -> str:
    """", called from f (file:line)": the innermost frame of the entry's stack (PYCOLL_FR_STACKS=1)
    outside torch.distributed and this package, or "" when the entry has none."""
    import os

    own = os.path.dirname(os.path.dirname(os.path.abspath(__file__))).replace("\\", "/") + "/"
    for f in (e or {}).get("frames") or ():
        path = str(f.get("filename", "")).replace("\\", "/")
        if "/torch/distributed/" in path or path.startswith(own):
            continue
        return f", called from {f.get('name')} ({path}:{f.get('line')})"
    return ""


def _groups(dumps: Dumps):
    groups: dict[str, _Group] = {}
    for d in dumps:
        for name, cfg in d.pg_config.items():
            g = groups.setdefault(str(name), _Group(str(name)))
            g.seen_on.add(d.rank)
            cfg = cfg or {}
            g.desc = g.desc or str(cfg.get("desc") or "")
            if g.members is None:
                g.members = parse_ranks(cfg.get("ranks"))
        for e in d.entries:
            g = groups.setdefault(group_name(e), _Group(group_name(e)))
            g.seen_on.add(d.rank)
            g.desc = g.desc or group_desc(e)
    world = max([d.world_size for d in dumps] + [0])
    for g in groups.values():
        if g.members is None:
            g.members = list(range(world)) if g.desc == "default_pg" and world else sorted(g.seen_on)
    return groups


def analyze(dumps) -> Report:
    """Analyzes the dumps of a job (a folder, or what load_dumps returned)."""
    if not isinstance(dumps, Dumps):
        dumps = load_dumps(dumps)
    by_rank = {d.rank: d for d in dumps}
    groups = _groups(dumps)
    per_rank_group = defaultdict(list)
    for d in dumps:
        for e in d.entries:
            per_rank_group[(d.rank, group_name(e))].append(e)

    hang, mismatch, no_dump, errors, notes = [], [], [], [], []
    matched = 0

    # (c) ranks of a group, or of the world, that left no dump.
    world = max([d.world_size for d in dumps] + [0])
    expected = set(range(world))
    member_of = defaultdict(list)
    for g in groups.values():
        for r in g.members:
            expected.add(r)
            member_of[r].append(g.label)
    for r in sorted(expected - set(by_rank)):
        where = f" (member of {', '.join(member_of[r])})" if member_of[r] else ""
        no_dump.append(Problem("no_dump", f"rank {r} left no dump (dead, or the dump did not reach it){where}",
                               ranks=[r]))

    for g in sorted(groups.values(), key=lambda g: (len(g.name), g.name)):
        views = {r: _RankView(by_rank[r], g, per_rank_group[(r, g.name)]) for r in g.members if r in by_rank}
        if not views:
            continue
        m, more_mm = _collectives(g, views, hang, mismatch)
        matched += m
        matched += _p2p(g, views, hang, mismatch)
        if more_mm:
            mismatch[-1].text += f" (and {_plural(more_mm, 'more mismatched op')} after it in this group)"
        # Every rank entered it, none finished: where a hang inside one op shows.
        stuck = [s for s in sorted(set().union(*[v.coll for v in views.values()]))
                 if all(s in v.coll and state(v.coll[s]) != "completed" for v in views.values())]
        if stuck:
            s = stuck[0]
            notes.append(f"{g.label}: {op_name(next(iter(views.values())).coll[s])} #{s}: entered by every rank "
                         f"with a dump, completed by none")

    # (d) ops that failed: the first per rank and group, at most 8 lines.
    err_lines = []
    for d in dumps:
        firsts = {}
        counts = Counter()
        for e in d.entries:
            if e.get("error"):
                key = group_name(e)
                counts[key] += 1
                firsts.setdefault(key, e)
        for key, e in firsts.items():
            g = groups.get(key)
            seq = e.get("p2p_seq_id") if is_p2p(e) else e.get("collective_seq_id")
            more = f" (and {_plural(counts[key] - 1, 'more error')} in this group)" if counts[key] > 1 else ""
            err_lines.append(Problem("error", f"rank {d.rank}: {g.label if g else 'group ' + key}: {op_name(e)} "
                                              f"#{seq} failed: {e['error']}{more}",
                                     group=key, op=op_name(e), seq=seq, ranks=[d.rank]))
    if len(err_lines) > 8:
        rest = len(err_lines) - 8
        err_lines = err_lines[:8]
        err_lines[-1].text += f" (and {rest} more ranks or groups with errors)"
    errors += err_lines

    reasons = defaultdict(list)
    for d in dumps:
        reasons[d.dump_reason or "(no reason)"].append(d.rank)
    if len(reasons) > 1 or any(r != "on demand" for r in reasons):
        notes.insert(0, "dump reasons: " + "; ".join(f"{_who(rs)}: {_short(reason)}"
                                                    for reason, rs in sorted(reasons.items(), key=lambda x: x[1])))
    for path, why in dumps.skipped:
        if "older dump" in why:
            notes.append(f"skipped {path}: {why}")

    return Report(problems=hang + mismatch + no_dump + errors, notes=notes, ranks=sorted(by_rank),
                  groups=sorted(groups), matched=matched, where=dumps.where)


def _short(text: str, n: int = 120) -> str:
    return text if len(text) <= n else text[: n - 3] + "..."


def _collectives(g: _Group, views: dict, hang: list, mismatch: list):
    matched = 0
    found_missing = False
    more_mm = 0
    first_mm = True
    seqs = sorted(set().union(*[v.coll for v in views.values()]))
    for s in seqs:
        present = {r: v.coll[s] for r, v in views.items() if s in v.coll}
        absent = [r for r, v in views.items() if v.knows_absent(s)]
        if absent and present and not found_missing:
            found_missing = True
            op = Counter(op_name(e) for e in present.values()).most_common(1)[0][0]
            states = {r: state(e) for r, e in present.items()}
            if len(set(states.values())) == 1:
                entered = f"{_who(present)} entered it ({next(iter(states.values()))})"
            else:
                entered = ("ranks " + ", ".join(f"{r} ({states[r]})" for r in sorted(states)) + " entered it")
            missing = "; ".join(f"rank {r} never did: {views[r].last_op_text()}" for r in absent)
            hang.append(Problem("missing", f"{g.label}: {op} #{s}: {entered}, {missing}", group=g.name, op=op,
                                seq=s, ranks=absent))
        sigs = defaultdict(list)
        shown = {}
        for r, e in present.items():
            key, text = _signature(e)
            sigs[key].append(r)
            shown[key] = text
        if len(sigs) > 1:
            if first_mm:
                first_mm = False
                ops = "/".join(sorted({k[0] for k in sigs}))
                parts = [f"{_who(rs)} called {shown[k]}" for k, rs in sorted(sigs.items(), key=lambda x: min(x[1]))]
                mismatch.append(Problem("mismatch", f"{g.label}: {ops} #{s}: " + ", ".join(parts), group=g.name,
                                        op=ops, seq=s, ranks=sorted(present)))
            else:
                more_mm += 1
        elif not absent and len(present) == len(views):
            matched += 1
    return matched, more_mm


def _p2p(g: _Group, views: dict, hang: list, mismatch: list) -> int:
    """Pairs the k-th send from a to b with the k-th recv on b from a. Where a ring dropped some of
    them, only the unfinished ones are paired."""
    sends = defaultdict(list)
    recvs = defaultdict(list)
    for r, v in views.items():
        for e in v.p2p:
            peer = peer_of(e, g.members)
            if peer < 0:
                continue
            if op_name(e) == "send":
                sends[(r, peer)].append(e)
            elif op_name(e) == "recv":
                recvs[(peer, r)].append(e)  # keyed (src, dst) as the send is
    matched = 0
    missing_done = mismatch_done = False
    for src, dst in sorted(set(sends) | set(recvs)):
        if src not in views or dst not in views:
            continue  # a rank without a dump is reported as such
        S, R = sends[(src, dst)], recvs[(src, dst)]
        if not (views[src].p2p_complete() and views[dst].p2p_complete()):
            S = [e for e in S if state(e) != "completed"]
            R = [e for e in R if state(e) != "completed"]
        for k in range(max(len(S), len(R))):
            if k < len(S) and k < len(R):
                a, b = S[k], R[k]
                da, db = _dtypes(a), _dtypes(b)
                na, nb = numel(a.get("input_sizes")), numel(b.get("output_sizes") or b.get("input_sizes"))
                if (da != db or na != nb) and not mismatch_done:
                    mismatch_done = True
                    mismatch.append(Problem(
                        "mismatch", f"{g.label}: send #{a.get('p2p_seq_id')} rank {src} -> rank {dst} and its recv "
                        f"#{b.get('p2p_seq_id')} differ: rank {src} sent {_shapes(a.get('input_sizes'))} "
                        f"{', '.join(da)}, rank {dst} received into "
                        f"{_shapes(b.get('output_sizes') or b.get('input_sizes'))} {', '.join(db)}",
                        group=g.name, op="send", seq=a.get("p2p_seq_id"), ranks=[src, dst]))
                else:
                    matched += 1
                continue
            if missing_done:
                continue
            missing_done = True
            if k < len(S):
                e = S[k]
                rest = [x for x in recvs[(src, dst)]]
                last = (f"its last recv from rank {src} is #{rest[-1].get('p2p_seq_id')} ({state(rest[-1])})"
                        if rest else f"it has no recv from rank {src}")
                hang.append(Problem(
                    "p2p", f"{g.label}: send #{e.get('p2p_seq_id')} rank {src} -> rank {dst} ({state(e)}): rank {dst} "
                    f"never posted the matching recv: {last}; {views[dst].newest_entry_text()}",
                    group=g.name, op="send", seq=e.get("p2p_seq_id"), ranks=[dst]))
            else:
                e = R[k]
                rest = sends[(src, dst)]
                last = (f"its last send to rank {dst} is #{rest[-1].get('p2p_seq_id')} ({state(rest[-1])})"
                        if rest else f"it has no send to rank {dst}")
                hang.append(Problem(
                    "p2p", f"{g.label}: recv #{e.get('p2p_seq_id')} rank {dst} <- rank {src} ({state(e)}): rank {src} "
                    f"never posted the matching send: {last}; {views[src].newest_entry_text()}",
                    group=g.name, op="recv", seq=e.get("p2p_seq_id"), ranks=[src]))
    return matched
