"""Regression benchmarks: pycoll's own calls timed with real ranks, through pytest-benchmark.

pytest-benchmark times what it calls with a clock it reads before and after; here the calls run in
other processes, so its clock is a *per-call clock*: each round asks the ranks for K calls and
advances the clock by the time per call they measured (the slowest rank's). Its tables, statistics,
--benchmark-autosave and --benchmark-compare then all speak of one call. K fills a round (see
--regression-round-ms) and keeps the request's own cost out of it: the ranks time only their
calls, between a barrier and the end of the last one.

To compare two builds in one launch, interleaved, use `make bench-compare BASE=<ref>`
(compare.py): the same cases, the same pools.
"""
import pytest

from cases import build_cases
from conftest import regression_device, regression_worlds


class PerCallClock:
    """A clock that the pool's measurements move: seconds of calls, one call per round."""
    __name__ = "per-call clock (ranks' time)"

    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now

    def advance(self, us):
        self.now += us * 1e-6


def pytest_generate_tests(metafunc):
    if "case" in metafunc.fixturenames:
        config = metafunc.config
        device = regression_device(config)
        params = []
        for world in regression_worlds(config):
            for case in build_cases(device, world, pattern=config.getoption("--regression-cases")):
                params.append(pytest.param(world, case, id=f"{world}r-{case['name']}"))
        metafunc.parametrize("world,case", params)


def test_case(benchmark, rank_pools, pytestconfig, world, case):
    pool = rank_pools(world)
    rounds = max(1, pytestconfig.getoption("--regression-rounds"))
    round_ms = pytestconfig.getoption("--regression-round-ms") or (20.0 if pool.device == "cuda" else 40.0)
    pool.prepare(case)
    try:
        calls, _ = pool.calls_per_round(case["name"], round_ms / 1e3)
        clock = PerCallClock()
        benchmark._timer = clock  # pytest-benchmark reads this clock around each round
        benchmark.group = f"{world} ranks, {pool.device}"
        benchmark.extra_info.update(world=world, device=pool.device, card=pool.card(), calls_per_round=calls,
                                    case=case)
        benchmark.pedantic(lambda: clock.advance(pool.time(case["name"], calls)),
                           rounds=rounds, warmup_rounds=1, iterations=1)
        assert clock.now > 0.0, "no call was timed"
    finally:
        pool.drop(case["name"])
