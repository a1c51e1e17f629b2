#!/usr/bin/env python3
"""How close pycoll-sim's times come to measured runs of schedule programs on the CPU engine.

    python3 -m pycollectives.bench --device cpu --nproc 4 --ops all_reduce \\
        --algo ring_all_reduce,rabenseifner,double_tree -b 64K -e 64M -f 4 --rounds 3 --name sim-ar
    python3 -m pycollectives.bench ... --ops all_gather --algo ring_all_gather,bruck ... --name sim-ag
    python3 benchmarks/schedule_sim_validation.py RESULT.json ... [--fit ring_all_reduce] [--cache 4M]

Each RESULT is a pycoll-bench file (one launch, or launches merged by render_tables.py --merge; FILE#RUN
names one run of a result set) whose
rows `pycoll/<program>` ran a schedule program. The shared-memory transport is described to the
simulator as one link (alpha, beta) plus the cost per byte of a reduction (gamma) and of moving a
received message (copy_gamma), with a port pair per lane (lane_ports: the engine's lanes are
threads, each copying at its own core's rate), and a fixed cost per op (the header exchange and the final barrier,
which the simulator does not model). These five are fitted to one program's median times (--fit),
separately for sizes up to --cache bytes per rank and above (one line does not follow measured
curves across the cache): a non-negative least-squares fit of the times simulated with one
parameter at a time, refined by Nelder-Mead on the simulated times themselves (a simulated time
is a max over paths, not a sum). Every program is then
simulated with the fitted values and compared with its measured time: the table gives the ratio
predicted / measured per program and size, and the largest error. Sizes are one rank's message.

Pure Python and torch (for the least squares); the measurements come from pycoll-bench.
"""
import argparse
import json
import os
import statistics
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from benchmarks.render_tables import load_launches  # noqa: E402

SPLIT = {"all_gather", "reduce_scatter", "all_to_all"}  # pycoll-bench's size counts all n blocks
BUILT_IN = {"auto", "ring", "tree", "oneshot", "twoshot", "hierarchical", "flat"}  # not programs
UNITS = ("alpha", "beta", "gamma", "copy_gamma")


def measured(paths):
    """{(program, op, world, block bytes): median over launches of the launch's median time (s)}."""
    times = {}
    for spec in paths:
        path, _, run = spec.partition("#")  # FILE#RUN: one run of a result set
        for launch in load_launches(path, run or None):
            world = int(launch["config"].get("nproc") or launch["metadata"].get("world_size"))
            for r in launch["results"]:
                label = r.get("label", "")
                if (not label.startswith("pycoll/") or label.split("/", 1)[1] in BUILT_IN or r.get("error")
                        or r.get("time_us") is None):
                    continue
                block = r["bytes"] // world if r["op"] in SPLIT else r["bytes"]
                times.setdefault((label.split("/", 1)[1], r["op"], world, block), []).append(r["time_us"] * 1e-6)
    return {k: statistics.median(v) for k, v in times.items()}


def unit_times(program, world, block):
    """The simulated time with one parameter 1 and the others 0, for each of UNITS."""
    from pycollectives.schedule import simulate

    out = []
    for unit in UNITS:
        kw = {"gamma": 0.0, "copy_gamma": 0.0}
        alpha, beta = (1.0, 1e-30) if unit == "alpha" else (0.0, 1.0 if unit == "beta" else 1e-30)
        if unit in kw:
            kw[unit] = 1.0
        link = f"alpha={alpha},beta={beta}"
        out.append(simulate(program, world, size=block, link=link, lane_ports=True, **kw).time)
    return out


def fit(rows):
    """Non-negative least squares of time ~ overhead + sum(p_u * unit_u) over rows [(units, time)]:
    relative errors weigh alike (each row is divided by its time)."""
    import torch

    a = torch.tensor([[1.0] + list(u) for u, _ in rows], dtype=torch.float64)
    t = torch.tensor([t for _, t in rows], dtype=torch.float64)
    a, t = a / t[:, None], t / t
    free = list(range(a.shape[1]))
    while True:  # drop the most negative parameter until none is (enough for five parameters)
        x = torch.linalg.lstsq(a[:, free], t[:, None]).solution[:, 0]
        if (x >= 0).all() or len(free) == 1:
            params = [0.0] * a.shape[1]
            for i, v in zip(free, x.tolist()):
                params[i] = max(v, 0.0)
            return params
        free.pop(int(torch.argmin(x)))


def refine(params, rows, iters=300):
    """Nelder-Mead on log(parameters), from the linear fit: the simulated time is a max over paths,
    not a sum, so the linear fit is only a start. Minimises the sum of log(predicted / measured)^2
    over rows [(program, world, block, time)]."""
    import math

    floor = [1e-9, 1e-9, 1e-13, 1e-14, 1e-14]  # where a parameter fitted to 0 starts
    x0 = [math.log(max(p, f)) for p, f in zip(params, floor)]

    def cost(x):
        ps = [math.exp(v) for v in x]
        return sum(math.log(predict(ps, p, w, b) / t) ** 2 for p, w, b, t in rows)

    # First one factor on every parameter but the overhead (golden section on its log), then
    # Nelder-Mead from there, restarted around its best point.
    lo, hi, g = -6.0, 6.0, (5 ** 0.5 - 1) / 2

    def scaled(k):
        return [x0[0]] + [v + k for v in x0[1:]]

    for _ in range(60):
        a, b = hi - g * (hi - lo), lo + g * (hi - lo)
        if cost(scaled(a)) < cost(scaled(b)):
            hi = b
        else:
            lo = a
    x0 = scaled((lo + hi) / 2)
    for _ in range(3):
        x0 = _nelder_mead(cost, x0, iters)
    return [math.exp(v) for v in x0]


def _nelder_mead(cost, x0, iters):
    simplex = [x0] + [[v + (1.0 if i == j else 0.0) for j, v in enumerate(x0)] for i in range(len(x0))]
    scored = sorted((cost(x), x) for x in simplex)
    for _ in range(iters):
        (best, xb), (worst, xw) = scored[0], scored[-1]
        centre = [sum(x[i] for _, x in scored[:-1]) / (len(scored) - 1) for i in range(len(x0))]
        refl = [c + (c - w) for c, w in zip(centre, xw)]
        fr = cost(refl)
        if fr < best:
            exp = [c + 2 * (c - w) for c, w in zip(centre, xw)]
            fe = cost(exp)
            scored[-1] = (fe, exp) if fe < fr else (fr, refl)
        elif fr < scored[-2][0]:
            scored[-1] = (fr, refl)
        else:
            con = [c + 0.5 * (w - c) for c, w in zip(centre, xw)]
            fc = cost(con)
            if fc < worst:
                scored[-1] = (fc, con)
            else:  # shrink towards the best
                scored = [scored[0]] + [(cost(y), y) for y in
                                        ([b + 0.5 * (v - b) for b, v in zip(xb, x)] for _, x in scored[1:])]
        scored.sort(key=lambda e: e[0])
        if scored[-1][0] - scored[0][0] < 1e-12:
            break
    return scored[0][1]


def predict(params, program, world, block):
    from pycollectives.schedule import simulate

    overhead, alpha, beta, gamma, copy_gamma = params
    link = f"alpha={alpha},beta={max(beta, 1e-30)}"
    return overhead + simulate(program, world, size=block, link=link, gamma=gamma, copy_gamma=copy_gamma,
                               lane_ports=True).time


def validate(times, fit_program, cache):
    """{world: {"params": {"small": [...], "large": [...]}, "rows": [...]}} for every world measured."""
    out = {}
    for world in sorted({k[2] for k in times}):
        fitted = {}
        for part, keep in (("small", lambda b: b <= cache), ("large", lambda b: b > cache)):
            points = [(p, w, b, t) for (p, op, w, b), t in times.items()
                      if p == fit_program and w == world and keep(b)]
            if len(points) >= 2:
                fitted[part] = refine(fit([(unit_times(p, w, b), t) for p, w, b, t in points]), points)
        rows = []
        for (p, op, w, b), t in sorted(times.items()):
            if w != world:
                continue
            params = fitted.get("small" if b <= cache else "large") or fitted.get("small") or fitted.get("large")
            if params is None:
                continue
            pred = predict(params, p, w, b)
            rows.append({"program": p, "op": op, "bytes": b, "measured_us": t * 1e6, "predicted_us": pred * 1e6,
                         "ratio": pred / t, "fitted": p == fit_program})
        out[world] = {"params": fitted, "rows": rows}
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("results", nargs="+", help="pycoll-bench result files; FILE#RUN for one run of a result set")
    ap.add_argument("--fit", default="ring_all_reduce", help="the program the link is fitted to")
    ap.add_argument("--cache", default="4MiB", help="sizes per rank up to this are fitted apart from larger ones")
    ap.add_argument("--out", help="write the comparison as JSON here")
    a = ap.parse_args(argv)
    from pycollectives.schedule.simulate import parse_size

    out = validate(measured(a.results), a.fit, parse_size(a.cache))
    worst = 0.0
    for world, v in out.items():
        for part, p in v["params"].items():
            print(f"# {world} ranks, {part} sizes: overhead {p[0] * 1e6:.1f} us, alpha {p[1] * 1e6:.2f} us, "
                  f"{1 / p[2] / 1e9 if p[2] else float('inf'):.2f} GB/s, gamma {p[3] * 1e9:.3f} ns/B, "
                  f"copy {p[4] * 1e9:.3f} ns/B")
        print("| ranks | program | op | size | measured us | predicted us | predicted / measured |")
        print("|---|---|---|---|---|---|---|")
        for r in v["rows"]:
            if not r["fitted"]:
                worst = max(worst, abs(r["ratio"] - 1))
            print(f"| {world} | {r['program']}{' (fitted)' if r['fitted'] else ''} | {r['op']} | {r['bytes']} | "
                  f"{r['measured_us']:.1f} | {r['predicted_us']:.1f} | {r['ratio']:.2f} |")
    print(f"# largest error of the programs not fitted: {worst:.0%}")
    if a.out:
        with open(a.out, "w") as fh:
            json.dump({str(k): v for k, v in out.items()}, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
