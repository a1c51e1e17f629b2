"""Synthetic flight-recorder dumps (the layout of docs/tracing.md) for the pycoll-trace tests:
a job of a few ranks whose ops the test lists one by one, written one file per rank."""
import json
import os

T0 = 1_764_000_000_000_000_000  # wall-clock ns of the job's start


class Job:
    def __init__(self, world=3, host="h"):
        self.world = world
        self.host = host
        self.groups = {"0": ("default_pg", list(range(world)))}
        self.entries = {r: [] for r in range(world)}
        self.clock = {r: T0 + 1000 * r for r in range(world)}  # rank r starts r us later
        self.seq = {}  # (rank, group) -> [collective, p2p, op_id]
        self.dump_time = {}

    def group(self, name, desc, ranks):
        self.groups[name] = (desc, list(ranks))

    def op(self, rank, op="all_reduce", group="0", sizes=((1024,),), dtypes=("Float",), state="completed",
           peer=-1, dur_ns=50_000, gap_ns=10_000, thread="pycoll-exec", start=None, out_sizes=None, error="",
           **extra):
        """One op on one rank: the next sequence number of its group; returns the entry."""
        c = self.seq.setdefault((rank, group), [0, 0, 0])
        p2p = op in ("send", "recv")
        c[2] += 1
        if p2p:
            c[1] += 1
        else:
            c[0] += 1
        created = self.clock[rank] + gap_ns if start is None else start
        started = created + 1000
        done = started + dur_ns
        if start is None:
            self.clock[rank] = done
        desc = self.groups[group][0]
        rid = len(self.entries[rank]) + 1
        e = {
            "record_id": rid, "pg_id": list(self.groups).index(group), "process_group": [group, desc],
            "collective_seq_id": 0 if p2p else c[0], "p2p_seq_id": c[1] if p2p else 0, "op_id": c[2],
            "is_p2p": p2p, "profiling_name": "pycoll:" + op,
            "input_sizes": [list(s) for s in sizes], "input_dtypes": list(dtypes),
            "output_sizes": [list(s) for s in (out_sizes if out_sizes is not None else sizes)],
            "output_dtypes": list(dtypes), "state": state, "time_created_ns": created,
            "time_discovered_started_ns": started if state != "scheduled" else None,
            "time_discovered_completed_ns": done if state == "completed" else None,
            "duration_ms": dur_ns / 1e6 if state == "completed" else None, "timeout_ms": 600000,
            "retired": state == "completed", "thread_id": str(1000 + rank), "thread_name": thread, "frames": [],
            "peer": peer, "engine": "cpu", "algorithm": "ring" if not p2p else "", "plan": "", "error": error,
        }
        e.update(extra)
        self.entries[rank].append(e)
        return e

    def coll(self, op="all_reduce", group="0", skip=(), **kw):
        """The same op on every member rank of the group except `skip`."""
        return {r: self.op(r, op, group, **kw) for r in self.groups[group][1] if r not in skip}

    def write(self, folder, ring=None, no_dump=(), reason="on demand", prefix="rank_"):
        """One file per rank, folder/prefix<rank>; `ring` {rank: size} keeps only the newest entries."""
        os.makedirs(folder, exist_ok=True)
        ring = ring or {}
        paths = {}
        for r in range(self.world):
            if r in no_dump:
                continue
            entries = self.entries[r]
            if ring.get(r) is not None:
                entries = entries[-ring[r]:]
            status = {}
            for name in self.groups:
                colls = [e for e in self.entries[r] if e["process_group"][0] == name and not e["is_p2p"]]
                seq = lambda states: max([e["collective_seq_id"] for e in colls if e["state"] in states] + [0])
                status[name] = {"last_enqueued_collective": seq(("scheduled", "started", "completed")),
                                "last_started_collective": seq(("started", "completed")),
                                "last_completed_collective": seq(("completed",))}
            data = {
                "version": "2.10", "backend": "pycoll", "rank": r, "world_size": self.world, "hostname": self.host,
                "pid": 4000 + r, "dump_reason": reason,
                "dump_time_ns": self.dump_time.get(r, max(self.clock.values()) + 1_000_000),
                "pg_config": {n: {"name": n, "desc": d, "ranks": json.dumps(rs)} for n, (d, rs) in self.groups.items()
                              if r in rs},
                "pg_status": {n: s for n, s in status.items() if r in self.groups[n][1]},
                "entries": entries,
            }
            paths[r] = os.path.join(folder, f"{prefix}{r}")
            with open(paths[r], "w") as f:
                json.dump(data, f)
        return paths
