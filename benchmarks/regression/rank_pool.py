"""A pool of live ranks that time regression cases on request.

The ranks stay up across cases (starting a group costs seconds); each request goes to every rank
and the pool returns when all have answered. Timing happens inside the ranks (timing.time_calls),
so the request's own round trip is never part of a measured time.

    pool = RankPool(world=2, device="cpu", library_root=REPO_ROOT)
    pool.prepare(case); us = pool.time(case["name"], calls=200); pool.close()

`library_root` is the tree whose `pycollectives` the ranks import (put first on PYTHONPATH);
the harness is always this working tree's (harness.py).
"""
import os
import shutil
import subprocess
import sys
import tempfile
import time
from multiprocessing.connection import Listener

from harness import HERE


class PoolError(RuntimeError):
    pass


class RankPool:
    def __init__(self, world, device, library_root, label="", timeout_s=300, env=None):
        self.world, self.device, self.label = world, device, label or os.path.basename(library_root)
        self.timeout_s = timeout_s
        self.library_root = os.path.abspath(library_root)
        self.dir = tempfile.mkdtemp(prefix="pycoll-pool-")
        address = os.path.join(self.dir, "pool.sock")
        key = os.urandom(16)
        self.listener = Listener(address, family="AF_UNIX", authkey=key)
        child_env = dict(os.environ, **(env or {}))
        child_env["PYTHONPATH"] = os.pathsep.join(
            [self.library_root, HERE] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])
        child_env["PYCOLL_POOL_KEY"] = key.hex()
        child_env["PYTHONUNBUFFERED"] = "1"
        self.procs, self.logs = [], []
        for rank in range(world):
            log = os.path.join(self.dir, f"rank{rank}.log")
            self.logs.append(log)
            with open(log, "w") as fh:
                self.procs.append(subprocess.Popen(
                    [sys.executable, os.path.join(HERE, "rank_server.py"), "--rank", str(rank), "--world", str(world),
                     "--device", device, "--store", os.path.join(self.dir, "store"), "--address", address,
                     "--timeout-s", str(timeout_s)],
                    env=child_env, stdout=fh, stderr=subprocess.STDOUT, cwd=self.dir))
        self.conns = [None] * world
        self.info = []
        try:
            self._accept()
            self.round_trip_s = self._measure_round_trip()
        except BaseException:
            self.close()
            raise

    def _accept(self):
        self.listener._listener._socket.settimeout(120)
        accepted = []
        for _ in range(self.world):  # every rank first: a rank's Client() returns only once accepted
            try:
                accepted.append(self.listener.accept())
            except OSError as exc:
                raise PoolError(f"{self.label}: a rank did not connect: {exc}\n{self._tails()}") from None
        infos = [(conn, self._reply(conn)) for conn in accepted]
        for conn, info in infos:
            self.conns[info["rank"]] = conn
        self.info = [info for _, info in sorted(infos, key=lambda ci: ci[1]["rank"])]
        for info in self.info:
            if os.path.commonpath([info["library"], self.library_root]) != self.library_root:
                raise PoolError(f"{self.label}: rank {info['rank']} imported pycollectives from {info['library']}, "
                                f"not from {self.library_root}")

    def _measure_round_trip(self, n=50):
        """Seconds one request costs on its own (the median of n, after a warm one)."""
        self.request("ping")
        times = []
        for _ in range(n):
            t0 = time.perf_counter()
            self.request("ping")
            times.append(time.perf_counter() - t0)
        return sorted(times)[n // 2]

    def _reply(self, conn):
        t0 = time.monotonic()
        while not conn.poll(1.0):
            dead = [r for r, p in enumerate(self.procs) if p.poll() is not None]
            if dead or time.monotonic() - t0 > self.timeout_s:
                why = f"rank(s) {dead} exited" if dead else f"no answer in {self.timeout_s} s"
                raise PoolError(f"{self.label}: {why}\n{self._tails()}")
        status, value = conn.recv()
        if status != "ok":
            raise PoolError(f"{self.label}: {value}")
        return value

    def _tails(self, lines=15):
        out = []
        for r, log in enumerate(self.logs):
            try:
                with open(log) as fh:
                    tail = fh.read().splitlines()[-lines:]
            except OSError:
                tail = []
            out.append(f"--- rank {r} ---\n" + "\n".join(tail))
        return "\n".join(out)

    def request(self, *msg):
        """Sends msg to every rank; the ranks' answers, in rank order."""
        for conn in self.conns:
            conn.send(msg)
        return [self._reply(conn) for conn in self.conns]

    # -- what the cases use --------------------------------------------------------------------
    def prepare(self, case):
        self.request("prepare", case)

    def drop(self, name):
        self.request("drop", name)

    def estimate(self, name, calls):
        return self.request("estimate", name, calls)[0]

    def time(self, name, calls, delay_us=0.0):
        """Microseconds per call of `calls` calls, the slowest rank's."""
        return self.request("time", name, calls, float(delay_us))[0]

    def calls_per_round(self, name, round_s, max_calls=100_000):
        """Calls that fill about `round_s` seconds, and never fewer than make the request's own
        cost (its measured round trip) under 2% of a round. Sized from the fastest of three ~20 ms
        samples, not from the first (cold) calls: on the 2-core machine some calls run at two
        speeds 4x apart for seconds at a time, and the slow one would shrink every timing 4x."""
        first = self.estimate(name, 2)
        n = max(1, min(10_000, int(0.02 / max(first, 1e-7))))
        est = min(self.estimate(name, n) for _ in range(3))
        floor_s = self.round_trip_s / 0.02
        return max(1, min(max_calls, round(max(round_s, floor_s) / max(est, 1e-7)))), est

    def card(self):
        return self.info[0]["card"] if self.info else "?"

    def close(self):
        try:
            for conn in self.conns:
                if conn is not None:
                    conn.send(("quit",))
            for conn in self.conns:
                if conn is not None and conn.poll(30):
                    conn.recv()
        except (OSError, EOFError):
            pass
        for p in self.procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
        self.listener.close()
        shutil.rmtree(self.dir, ignore_errors=True)
