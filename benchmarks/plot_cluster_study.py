#!/usr/bin/env python3
"""The plots of docs/cluster.md's study, from its result files in benchmarks/results.

    python3 benchmarks/plot_cluster_study.py --bench FILE.json ... --ddp DDP.json

--bench  runs of `pycoll-bench --hosts 2 --link ...` (any layouts and links): pycoll-bench files, launches
         merged by render_tables.py --merge, or result sets of them (--bundle; every run of a set is plotted):
         writes <the first file's stem>.png, per layout (row) and op (column) the busbw of
         each pycoll form over Gloo's against the size (median over a run's launches), one colour per link
--ddp    benchmarks/cluster_ddp_study.py's file: writes <stem>-<model>.png per model, per layout
         the step time of each method at each link (log scale where it spans a decade), the loss after the same steps
         under each method's name
"""
import argparse
import json
import os
import re
import statistics
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import matplotlib.ticker  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks.render_tables import SET_SCHEMA, load_launches  # noqa: E402

COLOURS = {"100mbit": "tab:red", "1gbit": "tab:blue", "10gbit": "tab:green"}


def rate_bps(link):
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([kmg]?)bit", link or "")
    return float(m.group(1)) * {"": 1, "k": 1e3, "m": 1e6, "g": 1e9}[m.group(2)] if m else 0.0


def bench_runs(path):
    """The runs of one file (a pycoll-bench file, merged launches, or every run of a result set),
    each as its list of launches."""
    with open(path) as fh:
        doc = json.load(fh)
    names = list(doc["runs"]) if doc.get("schema") == SET_SCHEMA else [None]
    return [load_launches(path, name) for name in names]


def ratios(launches, op, label):
    """{bytes: median over the launches of Gloo's time / label's time} for one op."""
    per_size = {}
    for doc in launches:
        t = {(r["label"], r["bytes"]): r["time_us"] for r in doc["results"]
             if r["op"] == op and r.get("time_us") and not r.get("error")}
        for (lab, b), v in t.items():
            if lab == label and ("gloo", b) in t:
                per_size.setdefault(b, []).append(t[("gloo", b)] / v)
    return {b: statistics.median(v) for b, v in sorted(per_size.items())}


def plot_collectives(paths, out):
    runs = []
    for launches in [r for p in paths for r in bench_runs(p)]:
        meta = launches[0]["metadata"]
        measured = statistics.median(lc["metadata"]["link_measured_bps"] for lc in launches)
        runs.append((f"{meta['hosts']}x{meta['world_size'] // meta['hosts']}", meta["link"], measured, launches))
    layouts = sorted({r[0] for r in runs})
    ops = ["all_reduce", "reduce_scatter", "all_gather"]
    fig, axes = plt.subplots(len(layouts), len(ops), figsize=(4.2 * len(ops), 3.4 * len(layouts)), squeeze=False,
                             sharex=True)
    for i, layout in enumerate(layouts):
        for j, op in enumerate(ops):
            ax = axes[i][j]
            for lay, link, measured, launches in sorted(runs, key=lambda r: rate_bps(r[1])):
                if lay != layout:
                    continue
                for label in [x for x in launches[0]["labels"] if x.startswith("pycoll")]:
                    got = ratios(launches, op, label)
                    ax.plot(list(got), list(got.values()), marker="o",
                            color=COLOURS.get(link), linestyle="--" if label.endswith("/flat") else "-",
                            label=f"{label} {link} ({measured / 1e6:.0f} Mbit/s)")
            ax.axhline(1.0, color="grey", linewidth=0.8)
            ax.set_xscale("log", base=2)
            ax.set_title(f"{op}, 2 hosts x {layout.split('x')[1]}", fontsize=10)
            if j == 0:
                ax.set_ylabel("busbw x gloo")
            if i == len(layouts) - 1:
                ax.set_xlabel("bytes")
            ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def plot_ddp(path, stem):
    with open(path) as fh:
        doc = json.load(fh)
    outs = []
    for model in dict.fromkeys(r["model"] for r in doc["rows"]):
        rows = [r for r in doc["rows"] if r["model"] == model]
        layouts = sorted({r["layout"] for r in rows})
        links = sorted({r["link"] for r in rows}, key=rate_bps)
        methods = list(dict.fromkeys(r["method"] for r in rows))
        at = {(r["layout"], r["link"], r["method"]): r for r in rows}
        fig, axes = plt.subplots(1, len(layouts), figsize=(5.5 * len(layouts), 3.8), squeeze=False)
        width = 0.8 / len(links)
        for ax, layout in zip(axes[0], layouts):
            for k, link in enumerate(links):
                xs, ys = [], []
                for m, method in enumerate(methods):
                    r = at.get((layout, link, method))
                    if r:
                        xs.append(m + (k - (len(links) - 1) / 2) * width)
                        ys.append(r["step_ms"])
                measured = next(r["link_measured_bps"] for r in rows if r["link"] == link and r["layout"] == layout)
                ax.bar(xs, ys, width, color=COLOURS.get(link), label=f"{link} ({measured / 1e6:.0f} Mbit/s)")
            names = []
            for method in methods:
                losses = sorted({round(at[(layout, link, method)]["loss"], 4) for link in links
                                 if (layout, link, method) in at})
                names.append(f"{method}\nloss {losses[0]:.3f}" + (f"-{losses[-1]:.3f}" if len(losses) > 1 else ""))
            ax.set_xticks(range(len(methods)))
            ax.set_xticklabels(names, fontsize=8)
            times = [r["step_ms"] for r in rows if r["layout"] == layout]
            if max(times) > 10 * min(times):  # log scale only where the times span a decade
                ax.set_yscale("log")
                ax.yaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
                ax.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
            ax.set_ylabel("ms/step")
            ax.set_title(f"{model}: 2 hosts x {layout.split('x')[1]}, loss after "
                         f"{rows[0]['steps'] + rows[0]['warmup']} steps", fontsize=10)
            ax.legend(fontsize=7)
        fig.tight_layout()
        out = f"{stem}-{model}.png"
        fig.savefig(out, dpi=110)
        plt.close(fig)
        outs.append(out)
    return outs


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bench", nargs="*", default=[],
                    help="pycoll-bench files (--hosts 2 --link) or result sets of them")
    ap.add_argument("--ddp", required=True, help="cluster_ddp_study.py's file")
    args = ap.parse_args(argv)
    stem = os.path.splitext(args.ddp)[0]
    outs = plot_ddp(args.ddp, stem)
    if args.bench:
        outs.append(plot_collectives(args.bench, os.path.splitext(args.bench[0])[0] + ".png"))
    for o in outs:
        print(f"wrote {o}")


if __name__ == "__main__":
    main()
