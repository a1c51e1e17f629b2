"""PNG of a run: for each (dtype, op), busbw vs size (left) and time vs size (right),
log2 size axis, one line per backend row (pycoll algorithms and CUDA-graph timings apart)."""
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import FuncFormatter  # noqa: E402

from .sizes import format_size  # noqa: E402


def _series(rows):
    out = {}
    for r in rows:
        if r.get("time_us") is None or r.get("error"):
            continue
        name = r["label"] + (" (graph)" if r["mode"] == "graph" else "")
        out.setdefault(name, []).append(r)
    return {k: sorted(v, key=lambda r: r["bytes"]) for k, v in out.items()}


def plot(rows, meta, cfg, path):
    panels = []
    for dtype in cfg.dtypes:
        for op in cfg.ops:
            sel = [r for r in rows if r["dtype"] == dtype and r["op"] == op]
            if sel:
                panels.append((dtype, op, sel))
    n = max(1, len(panels))
    fig, axes = plt.subplots(n, 2, figsize=(13, 3.8 * n), squeeze=False)
    size_fmt = FuncFormatter(lambda x, _: format_size(int(x)) if x >= 1 else "")
    for i, (dtype, op, sel) in enumerate(panels):
        ax_bw, ax_t = axes[i]
        for name, pts in _series(sel).items():
            xs = [r["bytes"] for r in pts]
            style = "--" if name.endswith("(graph)") else "-"
            ax_bw.plot(xs, [r["busbw_gbps"] for r in pts], style, marker="o", markersize=3, label=name)
            ax_t.plot(xs, [r["time_us"] for r in pts], style, marker="o", markersize=3, label=name)
        for ax in (ax_bw, ax_t):
            ax.set_xscale("log", base=2)
            ax.xaxis.set_major_formatter(size_fmt)
            ax.grid(True, which="both", alpha=0.3)
            ax.set_xlabel("size (bytes of the largest buffer)")
            ax.tick_params(axis="x", labelrotation=45, labelsize=7)
        ax_t.set_yscale("log")
        ax_bw.set_ylabel("busbw (GB/s)")
        ax_t.set_ylabel("time per call (us)")
        ax_bw.set_title(f"{op} {dtype}: bus bandwidth")
        ax_t.set_title(f"{op} {dtype}: time")
        ax_bw.legend(fontsize=8)
    if not panels:
        axes[0][0].text(0.5, 0.5, "no results", ha="center", va="center")
    fig.suptitle(f"pycoll-bench  {meta['world_size']} ranks  {meta['device']} ({meta['card']})  "
                 f"torch {meta['torch']}  {meta['date'][:10]}", fontsize=10)
    fig.tight_layout(rect=(0, 0, 1, 0.98))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
