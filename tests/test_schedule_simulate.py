"""The schedule simulator (pycollectives/schedule/simulate.py) against the textbook counts and
times of the alpha-beta model, its links and ports, and the pycoll-sim command."""
import json
import math
import os
import subprocess
import sys

import pytest

from pycollectives.schedule import Program, ScheduleError, simulate
from pycollectives.schedule.examples.ring import ring_all_reduce
from pycollectives.schedule.simulate import Link, Topology, main, parse_link, parse_size

ALPHA, BETA, GAMMA = 1e-6, 1e-9, 2e-10
LINK = f"alpha={ALPHA},beta={BETA}"


@pytest.mark.parametrize("n", (2, 3, 4, 8, 64))
def test_ring_all_reduce_textbook(n):
    size = 4 * n * 1000  # bytes; divisible into n chunks of float32
    r = simulate("ring", n, size=size, link=LINK)
    assert r.steps == 2 * (n - 1)
    assert r.messages == 2 * (n - 1) * n
    assert all(b == 2 * (n - 1) * size // n for b in r.bytes_sent.values())
    assert r.time == pytest.approx(2 * (n - 1) * (ALPHA + size / n * BETA), rel=1e-9)
    g = simulate("ring", n, size=size, link=LINK, gamma=GAMMA)  # + (N-1)/N of the data reduced
    assert g.time == pytest.approx(2 * (n - 1) * ALPHA + 2 * (n - 1) / n * size * BETA
                                   + (n - 1) / n * size * GAMMA, rel=1e-9)


@pytest.mark.parametrize("n", (2, 4, 8, 32))
def test_rabenseifner_textbook(n):
    size = 4 * n * 1000
    r = simulate("rabenseifner", n, size=size, link=LINK)
    assert r.steps == 2 * int(math.log2(n))
    assert r.max_bytes_per_rank == 2 * (n - 1) * size // n
    assert r.time == pytest.approx(2 * math.log2(n) * ALPHA + 2 * (n - 1) / n * size * BETA, rel=1e-9)


@pytest.mark.parametrize("n", (2, 3, 5, 8, 13))
def test_bruck_textbook(n):
    size = 4000
    r = simulate("bruck", n, size=size, link=LINK)
    # ceil(log2 N) rounds; where N is no power of two, the last round sends only blocks a rank
    # had before the round before, so the longest chain of messages can be one shorter.
    assert r.steps == math.log2(n) if n & (n - 1) == 0 else math.log2(n) - 1 <= r.steps <= math.log2(n) + 1
    assert all(b == (n - 1) * size for b in r.bytes_sent.values())


def test_tree_pipelining_pays():
    """Cut into pieces, the double binary tree overlaps its levels: faster at large sizes."""
    one = simulate("double_tree", 16, size=64 << 20, link="nvlink")
    eight = simulate("double_tree", 16, size=64 << 20, link="nvlink", pieces=8)
    assert eight.time < 0.7 * one.time


def star(n):
    p = Program("star", "broadcast", ranks=n, root=0, inplace=True)
    for r in range(1, n):
        p.copy(p.input(0), p.input(r))
    return p


def test_busiest_link_named():
    n, size = 8, 1 << 20
    r = simulate(star(n), size=size, link=LINK)
    assert r.busiest == "rank 0 out (custom)"
    assert r.links[r.busiest]["bytes"] == (n - 1) * size
    assert r.time == pytest.approx(ALPHA + (n - 1) * size * BETA, rel=1e-9)  # one port, in series
    assert "busiest port    rank 0 out (custom): 7.00 MiB" in r.summary()


def test_two_levels():
    """A ring across 2 hosts crosses the network twice per step; the hierarchical all_reduce sends
    only 1/G of the data between hosts and is faster when the network is slow."""
    kw = dict(size=64 << 20, link="nvlink", hosts=2, network="100gbit")
    flat = simulate("ring", 8, **kw)
    hier = simulate("hierarchical", 8, **kw)  # per_host=4 from hosts=2
    assert "NIC" in flat.busiest and "100gbit" in flat.busiest
    nic = lambda res: max(v["bytes"] for k, v in res.links.items() if "NIC" in k)
    assert nic(flat) == 2 * 7 * (64 << 20) // 8 and nic(hier) == 2 * (64 << 20) // 8
    assert hier.time < flat.time
    assert "2 hosts x 4 ranks" in hier.topology


def test_nics_per_host_share_the_network():
    one = simulate("ring", 8, size=8 << 20, link="nvlink", hosts=8, network="400gbit", nics=1)
    assert one.time == pytest.approx(simulate("ring", 8, size=8 << 20, link="400gbit").time, rel=1e-9)


def test_lane_ports():
    """Rank 0 sends one chunk to rank 1 on each of two lanes: sharing one port the two messages
    take turns; with a port per lane (the CPU engine's threads) they travel together."""
    p = Program("two_lanes", "broadcast", ranks=2, chunks=2, root=0, inplace=True)
    for lane in (0, 1):
        p.copy(p.input(0, lane), p.input(1, lane), lane=lane)
    one_chunk = ALPHA + (1 << 19) * BETA  # 1 MiB in two chunks
    shared = simulate(p, 2, size=1 << 20, link=LINK)
    per_lane = simulate(p, 2, size=1 << 20, link=LINK, lane_ports=True)
    assert shared.time == pytest.approx(one_chunk + (1 << 19) * BETA, rel=1e-9)
    assert per_lane.time == pytest.approx(one_chunk, rel=1e-9)
    assert "rank 0 lane 1 out" in " ".join(per_lane.links) and "a port per lane" in per_lane.topology


def test_out_of_cache_parameters():
    link = parse_link("alpha=1us,bw=10GB/s,cache=1MiB,large_alpha=2us,large_bw=5GB/s")
    assert link.params(1 << 20) == (1e-6, 1e-10) and link.params((1 << 20) + 1) == (2e-6, 2e-10)
    small = simulate("ring", 4, size=1 << 20, link=link)
    large = simulate("ring", 4, size=1 << 21, link=link)
    assert small.time == pytest.approx(6 * (1e-6 + (1 << 18) * 1e-10), rel=1e-9)
    assert large.time == pytest.approx(6 * (2e-6 + (1 << 19) * 2e-10), rel=1e-9)


def test_parsing():
    assert parse_size("64MiB") == 64 << 20 and parse_size("4096") == 4096 and parse_size("1k") == 1000
    assert parse_link("nvlink").name == "nvlink"
    l = parse_link("alpha=5us,bw=100Gbit")
    assert l.alpha == pytest.approx(5e-6) and l.beta == pytest.approx(8 / 100e9)
    with pytest.raises(ValueError, match="unknown link"):
        parse_link("infiniband")
    with pytest.raises(ValueError, match="needs alpha"):
        parse_link("bw=1GB/s")
    with pytest.raises(ValueError, match="do not divide"):
        Topology(6, hosts=4)


def test_wrong_rank_count():
    with pytest.raises(ScheduleError, match="built for 4 ranks, not 8"):
        simulate(ring_all_reduce(4), 8)


def test_cli(capsys, tmp_path):
    assert main(["ring", "--ranks", "16", "--size", "1MiB", "--link", "pcie", "--check"]) == 0
    out = capsys.readouterr().out
    assert "ring_all_reduce: all_reduce of 1.00 MiB per rank on 16 ranks on pcie" in out
    assert "30 messages on the longest chain" in out and "1.8750 x the message" in out
    assert main(["hierarchical", "--ranks", "32", "--hosts", "4", "--net", "100gbit", "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["ranks"] == 32 and "NIC" in res["busiest"]
    path = tmp_path / "ring.json"
    path.write_text(ring_all_reduce(4).lower().dumps())
    assert main([str(path), "--ranks", "4", "--link", "alpha=1us,beta=1ns"]) == 0
    assert "6 messages on the longest chain" in capsys.readouterr().out
    assert main(["pycollectives.schedule.examples.bruck:bruck_all_gather", "--ranks", "5"]) == 0
    capsys.readouterr()
    assert main(["ring", "--ranks", "4", "--link", "carrier-pigeon"]) == 2
    assert "unknown link" in capsys.readouterr().err
    assert main(["nothing", "--ranks", "4"]) == 2


def test_cli_as_a_module():
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    out = subprocess.run([sys.executable, "-m", "pycollectives.schedule", "ring", "--ranks", "8"],
                         capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr
    assert "14 messages on the longest chain" in out.stdout and out.stderr == ""


def test_docs_simulation_output(capsys):
    """docs/schedules.md's Rabenseifner run at 1,024 ranks is this simulator's output."""
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs", "schedules.md")
    with open(path) as fh:
        doc = fh.read()
    assert main(["rabenseifner", "--ranks", "1024", "--link", "nvlink", "--size", "64MiB"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "\n".join(lines[1:3]) in doc
