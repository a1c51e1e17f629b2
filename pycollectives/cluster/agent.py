"""One simulated host: run as a script (``agent.py SPEC.json``) inside the host's network namespace
and a new mount and UTS namespace (``ip netns exec NS unshare --mount --uts --propagation private``).
It mounts a private tmpfs on /dev/shm (the host's shared memory, gone with the namespace), sets
the hostname, starts the host's ranks and watches them: when one fails, the others get SIGTERM
and, after a grace period, SIGKILL. Each rank's end goes to the status file as a JSON line
{"rank", "code", "signal", "t"}; the exit status is 0 when every rank exited with 0.

Imports nothing of pycollectives (no torch): it starts in milliseconds.
"""
import ctypes
import json
import os
import signal
import socket
import subprocess
import sys
import time

PR_SET_PDEATHSIG = 1


def _die_with_parent(sig):
    def fn():
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
    return fn


def main(spec_path):
    with open(spec_path) as fh:
        spec = json.load(fh)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "mode=1777,nosuid,nodev", "pycoll-cluster-shm", "/dev/shm"],
                   check=True)
    socket.sethostname(spec["hostname"])
    if spec.get("hosts_file"):  # every host's name resolves to its address, on this host only
        subprocess.run(["mount", "--bind", spec["hosts_file"], "/etc/hosts"], check=True)
    if spec.get("cpus"):
        os.sched_setaffinity(0, spec["cpus"])
    stop = []

    def on_signal(signum, frame):
        stop.append(signum)

    for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(s, on_signal)
    procs = {}
    for r in spec["ranks"]:
        env = dict(os.environ)
        env.update(r["env"])
        procs[r["rank"]] = subprocess.Popen(spec["command"], env=env, cwd=spec["cwd"],
                                            preexec_fn=_die_with_parent(signal.SIGKILL))
    status = open(spec["status"], "a")
    failed = False
    kill_at = None
    running = dict(procs)
    while running:
        for rank, p in list(running.items()):
            code = p.poll()
            if code is None:
                continue
            del running[rank]
            status.write(json.dumps({"rank": rank, "code": code if code >= 0 else None,
                                     "signal": -code if code < 0 else None, "t": time.time()}) + "\n")
            status.flush()
            if code != 0 and not failed and not stop:
                failed = True
        if (failed or stop) and kill_at is None and running:
            for p in running.values():
                try:
                    p.send_signal(signal.SIGTERM)
                except ProcessLookupError:
                    pass
            kill_at = time.monotonic() + float(spec.get("grace_s", 3))
        if kill_at is not None and time.monotonic() > kill_at:
            for p in running.values():
                try:
                    p.kill()
                except ProcessLookupError:
                    pass
        time.sleep(0.02)
    status.close()
    if stop:
        return 128 + stop[0]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
