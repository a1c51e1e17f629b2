"""pycoll-cluster (pycollectives/cluster/): simulated hosts in network namespaces joined by links
shaped with tc. Runs as root (CI) or with unprivileged user namespaces; each cluster test builds
a real cluster and runs real ranks in it (tests/cluster_worker.py)."""

import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from pycollectives.cluster import cli, links, privileges, runner
from pycollectives.cluster.privileges import ClusterError
from pycollectives.cluster.rates import canonical, parse_rate

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORKER = os.path.join(ROOT, "tests", "cluster_worker.py")


def _mode():
    try:
        return privileges.probe()
    except ClusterError as exc:
        return str(exc)


MODE = _mode()
needs_cluster = pytest.mark.skipif(MODE not in ("root", "userns"), reason=f"cannot build a cluster here: {MODE}")


def _leftovers(rid=None):
    """What of ours exists now: namespaces (with their veths, bridges and qdiscs), interfaces or
    qdiscs in this namespace, pycoll-cluster processes, tmpfs mounts of /dev/shm of ours."""
    out = {"namespaces": links.ours(links.list_namespaces(), rid)}
    ip = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    out["links"] = [line for line in ip.splitlines() if re.search(r"\b(pcl\d|h\d+@|br0)", line)]
    tc = subprocess.run(["tc", "qdisc", "show"], capture_output=True, text=True).stdout
    out["qdiscs"] = [line for line in tc.splitlines() if "tbf" in line or "netem" in line]
    ps = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True).stdout
    out["processes"] = [line for line in ps.splitlines() if "cluster_worker.py" in line or "agent.py" in line]
    with open("/proc/mounts") as fh:
        out["mounts"] = [line for line in fh if "pycoll-cluster" in line]
    return {k: v for k, v in out.items() if v}


def _run(hosts, nproc, link, mode, out, timeout=240, extra=()):
    cmd = [sys.executable, "-m", "pycollectives.cluster", "--hosts", str(hosts), "--nproc-per-host", str(nproc),
           "--link", link, *extra, "--", sys.executable, WORKER, mode, str(out)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    return p


# -- no cluster needed ---------------------------------------------------------------------------
def test_rates_parse_and_key_one_spelling():
    assert parse_rate("1gbit") == parse_rate("1000mbit") == parse_rate("1Gbit/s") == 10**9
    assert canonical("1000mbit") == "1gbit" and canonical("2.5gbit") == "2500mbit"
    with pytest.raises(ValueError, match="100mbit, 1gbit"):
        parse_rate("fast")


def test_shaping_is_tbf_and_netem_goes_above_it():
    assert links.shaping_commands("pcl0", 10**9) == [
        ["qdisc", "add", "dev", "pcl0", "root", "handle", "1:", "tbf", "rate", "1000000000bit", "burst", "125000",
         "latency", "50ms"]]
    cmds = links.shaping_commands("pcl0", 10**8, delay_ms=5, jitter_ms=1, loss_pct=0.5)
    assert cmds[0][5:] == ["handle", "1:", "netem", "delay", "5ms", "1ms", "loss", "0.5%"]
    assert cmds[1][4:8] == ["parent", "1:1", "handle", "10:"] and "tbf" in cmds[1]


def test_delay_and_loss_are_refused_without_netem_and_accepted_with_it():
    spec = runner.ClusterSpec(hosts=2, link="1gbit", delay_ms=2, loss_pct=1)
    with pytest.raises(ClusterError, match=r"--delay 2, --loss 1 needs the netem qdisc.*Specified qdisc kind"):
        runner.check_netem(spec, "1-abc", probe=lambda rid: (False, "Specified qdisc kind is unknown."))
    runner.check_netem(spec, "1-abc", probe=lambda rid: (True, ""))  # accepted: netem goes on the links
    runner.check_netem(runner.ClusterSpec(hosts=2, link="1gbit"), "1-abc",
                       probe=lambda rid: pytest.fail("no netem asked for, no probe"))


def test_without_root_and_user_namespaces_the_error_says_which(capsys):
    no_userns = lambda: (False, "user namespaces are turned off (user.max_user_namespaces = 0)")  # noqa: E731
    with pytest.raises(ClusterError) as err:
        privileges.probe(geteuid=lambda: 1000, userns=no_userns)
    msg = str(err.value)
    assert "not root (uid 1000)" in msg and "max_user_namespaces = 0" in msg
    assert privileges.probe(geteuid=lambda: 1000, userns=lambda: (True, "")) == "userns"
    assert privileges.probe(geteuid=lambda: 0, userns=lambda: pytest.fail("root needs no user namespace")) == "root"

    def refuse():
        raise ClusterError(msg)
    assert cli.main(["--hosts", "2", "--", "true"], probe=refuse) == 2
    assert "needs root or unprivileged user namespaces" in capsys.readouterr().err


@needs_cluster
def test_this_kernel_netem_probe_answers_and_leaves_nothing():
    rid = links.run_id()
    ok, why = links.netem_available(rid)
    assert ok or why  # a refusal always carries tc's reason
    assert not links.ours(links.list_namespaces(), rid)


def test_ranks_of_a_host_that_share_a_gpu_are_nccl_hosts_of_their_own(monkeypatch):
    spec = runner.ClusterSpec(hosts=2, nproc_per_host=2)
    env = lambda h, l, gpus: runner.rank_env(spec, "r1", h, l, None, None, gpus)  # noqa: E731
    # As many GPUs as ranks per host (or none): the host's identity, as for PYCOLL_HOSTID.
    for gpus in (0, 2, 4):
        assert env(1, 1, gpus)["NCCL_HOSTID"] == env(1, 1, gpus)["PYCOLL_HOSTID"] == "pycoll-cluster-r1-host1"
    # Fewer: NCCL would refuse two ranks of one host on one GPU, so each rank is a host of its own.
    assert env(1, 1, 1)["NCCL_HOSTID"] == "pycoll-cluster-r1-host1-rank1"
    assert env(1, 1, 1)["PYCOLL_HOSTID"] == "pycoll-cluster-r1-host1"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")
    assert runner.gpus_per_host_seen(spec) == 1
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert runner.gpus_per_host_seen(spec) == 0
    assert runner.gpus_per_host_seen(runner.ClusterSpec(hosts=2, nproc_per_host=2, gpus_per_host=2)) == 2


# -- real clusters -------------------------------------------------------------------------------
@needs_cluster
def test_2x2_over_1gbit_rate_collectives_hierarchy_and_cleanup(tmp_path):
    before = _leftovers()
    out = tmp_path / "r.json"
    p = _run(2, 2, "1gbit", "collectives", out)
    assert p.returncode == 0, p.stderr[-3000:]
    r = json.loads(out.read_text())
    # The link's rate, measured by pycoll-cluster before the ranks start, within 10% of the setting.
    assert 0.9e9 <= r["link_measured_bps"] <= 1.1e9, r["link_measured_bps"]
    assert re.search(r"measured \d+ Mbit/s", p.stderr), p.stderr[-2000:]
    assert r["link"] == "1gbit"
    assert r["hostnames"] == ["pcl-host0", "pcl-host0", "pcl-host1", "pcl-host1"]
    assert r["collectives"]["sizes"] == [1, 1031, 65536]
    # Each host sends S between hosts instead of Gloo's ring 1.5 S: at least 1.35x faster.
    h = r["hierarchy"]
    assert h["speedup"] >= 1.35, h
    assert _leftovers() == before


@needs_cluster
def test_a_rank_killed_with_sigkill_stops_the_run_and_leaves_nothing(tmp_path):
    before = _leftovers()
    t0 = time.monotonic()
    p = _run(2, 2, "1gbit", "crash", tmp_path / "r.json", extra=("--measure", "0"))
    assert p.returncode == 1, (p.returncode, p.stderr[-3000:])
    assert "rank 1 (host 0, local rank 1) was killed by signal SIGKILL" in p.stderr, p.stderr[-3000:]
    assert time.monotonic() - t0 < 60  # the others were stopped, not left waiting 120 s
    assert _leftovers() == before


@needs_cluster
def test_sigint_to_the_launcher_removes_everything(tmp_path):
    before = _leftovers()
    cmd = [sys.executable, "-m", "pycollectives.cluster", "--hosts", "2", "--link", "100mbit", "--measure", "0", "--",
           sys.executable, "-c", "import time; print('up', flush=True); time.sleep(300)"]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        assert p.stdout.readline().strip() == "up"
        p.send_signal(signal.SIGINT)
        _, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 128 + signal.SIGINT, err
    assert "SIGINT: stopping the ranks" in err
    assert _leftovers() == before


@needs_cluster
def test_leftovers_of_a_killed_launcher_are_removed_by_cleanup():
    rid = f"{2 ** 22 + 7}-abcdef"  # a pid above pid_max's default: a run that no longer exists
    net = links.Network(rid, 2, 10**9)
    net.build()
    assert len(links.ours(links.list_namespaces(), rid)) == 3
    assert cli.main(["--cleanup"]) == 0
    assert not links.ours(links.list_namespaces(), rid)


@needs_cluster
def test_hosts_cork_no_tcp_writes_and_this_machine_keeps_its_setting():
    """Each simulated host turns TCP autocorking off in its own namespace (held-back tails stalled
    back-to-back hierarchical all_gathers 30-55 ms behind the shaped veth); this machine's value stays."""
    key = "/proc/sys/net/ipv4/tcp_autocorking"
    with open(key) as fh:
        mine = fh.read().strip()
    net = links.Network(links.run_id(), 2, 10**9)
    try:
        net.build()
        for ns in net.hosts:
            got = links.sh(["ip", "netns", "exec", ns, "cat", key]).stdout.strip()
            assert got == "0", (ns, got)
    finally:
        net.teardown()
    with open(key) as fh:
        assert fh.read().strip() == mine


@needs_cluster
def test_2x1_over_1gbit_powersgd_rank4_is_1_8x_faster_per_step(tmp_path):
    # 6 timed steps of each after 3 of warm-up (about 15 s): no hook sends 52 MB per step each way.
    out = tmp_path / "r.json"
    p = _run(2, 1, "1gbit", "compression", out, timeout=400)
    assert p.returncode == 0, p.stderr[-3000:]
    c = json.loads(out.read_text())["compression"]
    assert c["speedup"] >= 1.8, c
    assert c["powersgd"]["loss"] < c["powersgd"]["loss0"], c  # it still trains


# -- pycoll-bench --link -------------------------------------------------------------------------
def test_bench_link_needs_hosts_and_a_rate(capsys):
    from pycollectives.bench.cli import parse_config
    for argv, words in ((["--link", "1gbit"], "add --hosts N"), (["--hosts", "2", "--link", "fast"], "1gbit")):
        with pytest.raises(SystemExit) as exc:
            parse_config(argv)
        assert exc.value.code == 2 and words in capsys.readouterr().err


def test_calibrations_on_different_links_keep_each_other():
    from pycollectives.bench.calibrate import merge_host_forms
    e = lambda link, steps: dict(device="cpu", op="all_reduce", num_hosts=2, local_size=2, link=link,  # noqa: E731
                                 steps=steps, max_bytes=1 << 20)
    old = [e("1gbit", [[1, "flat"]]), e(None, [[1, "flat"]]), e("100mbit", [[1, "flat"]])]
    merged = merge_host_forms(old, [e("1gbit", [[8, "hierarchical"]])])
    assert sorted((m["link"] or "", m["steps"][0][1]) for m in merged) == [
        ("", "flat"), ("100mbit", "flat"), ("1gbit", "hierarchical")]


@needs_cluster
def test_bench_over_a_link_reports_the_measured_rate_and_keys_the_calibration(tmp_path):
    cal = tmp_path / "cal.json"
    p = subprocess.run([sys.executable, "-m", "pycollectives.bench", "--hosts", "2", "--nproc", "4", "--link", "1000mbit",
                        "--ops", "all_reduce", "-b", "1M", "-e", "1M", "--budget", "0.02", "--prewarm", "0",
                        "--no-progress", "--no-plot", "--out", str(tmp_path), "--calibrate", "--calibrate-out",
                        str(cal)], capture_output=True, text=True, timeout=240, cwd=ROOT)
    assert p.returncode == 0, p.stderr[-3000:]
    m = re.search(r"# link between hosts: 1gbit each way \(pycoll-cluster, tc tbf\); measured (\d+) Mbit/s", p.stdout)
    assert m and 900 <= int(m.group(1)) <= 1100, p.stdout[:2000]
    doc = json.loads(next(f for f in tmp_path.glob("*.json") if f != cal).read_text())
    assert doc["metadata"]["link"] == "1gbit" and doc["metadata"]["launcher"] == "pycoll-cluster"
    assert 0.9e9 <= doc["metadata"]["link_measured_bps"] <= 1.1e9
    assert "--in-cluster" not in doc["metadata"]["command"]
    forms = json.loads(cal.read_text())["host_forms"]
    assert forms and all(t["link"] == "1gbit" for t in forms), forms
    # Installed where PYCOLL_LINK names that rate only.
    code = "import pycollectives.config as c, json; print(c._load_host_forms(json.load(open(%r))['host_forms']))" % str(cal)
    counts = [subprocess.run([sys.executable, "-c", code], env=dict(os.environ, **env), capture_output=True, text=True,
                             timeout=60).stdout.strip() for env in ({"PYCOLL_LINK": "1gbit"}, {"PYCOLL_LINK": "10gbit"})]
    assert counts == [str(len(forms)), "0"], counts
