#!/usr/bin/env python3
"""Render the result tables of README.md and docs/performance.md from benchmarks/results.

Every table sits between two markers; what lies between them is generated (a caption, a blank
line, the table) and is rewritten by this script:

    <!-- table: NAME source=benchmarks/results/FILE.json ops=all_reduce,broadcast sizes=8,1M,64M
         columns=us,us:gloo,ratio,floor -->
    ...
    <!-- end table -->

(the opening marker on one line). Keys, all optional but ``source``:

  kind=ddp         a table of DDP steps from benchmarks/cluster_ddp_study.py's file (keys: source,
                   model=mlp|cnn; see render_ddp); without kind, a pycoll-bench table:

  source=PATH      a result file (relative to the repository root) in pycoll-bench's format: one
                   launch ("schema": "pycoll-bench/1"), or several launches of one layout
                   ("schema": "pycoll-bench-launches/1", "launches": [...]; ``--merge`` makes one),
                   or a result set of several such runs under names ("schema":
                   "pycoll-result-set/1", "runs": {"NAME": <a run of either kind>, ...};
                   ``--bundle`` makes one)
  run=NAME         the run of a result set the table shows (required for a set, refused for any
                   other file); the caption names the file and the run
  ops=A,B:1M+1G    the ops, in this order (default: every op of the file, in its order); an op
                   may carry its own sizes after a colon, joined by +
  sizes=8,4K,1M    the sizes in bytes, K/M/G = powers of 1024 (default: every size of the file)
  label=NAME       the row label the table is about (default: pycoll, else the first label)
  vs=NAME          the label ratios are taken against (default: the file's baseline)
  columns=C,...    us, busbw, floor, ratio, time_ratio; each may name another label: us:gloo,
                   ratio:pycoll/flat (that label against ``vs``), busbw:nccl
  launches=median  median over the launches (default), or ``range``: min-max over them
  unit=us          us or ms, for the time columns
  size_header=T    the size column's header (default: size)
  dtype=float32    (default: the run's first dtype)

A row's value in one launch is what pycoll-bench wrote: the median of that launch's rounds.
Ratios (ratio: baseline time / label time, i.e. busbw ratio; time_ratio: label time / baseline
time; floor: memory-floor time / label time) are taken inside each launch, then the median (or
range) over the launches is shown. The caption names the card or CPU, the ranks, the date, how
rows were reduced, the command that reproduces the run (from the file's metadata: the program
as ``pycoll-bench``, output-only options dropped, PYCOLL_* variables in front), and links the
file (``([data](FILE), run NAME)`` for a run of a result set).

    python3 benchmarks/render_tables.py            # rewrite the docs in place
    python3 benchmarks/render_tables.py --check    # exit 1 and print a diff when a table differs
    python3 benchmarks/render_tables.py --merge OUT.json RUN1.json RUN2.json ...
    python3 benchmarks/render_tables.py --bundle OUT.json NAME=RUN.json NAME=RUN.json ...

``--bundle`` writes the runs (pycoll-bench/1 or pycoll-bench-launches/1 files) into the result set
OUT under the names given; where OUT is a result set already, the runs are added to it (a run of
the same name is replaced). Run names are letters, digits, ``.``, ``_`` and ``-``.

Pure Python: it reads JSON and Markdown only (no torch).
"""
import argparse
import difflib
import json
import os
import re
import shlex
import statistics
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = ("README.md", "docs/performance.md", "docs/cluster.md", "docs/schedules.md")
LAUNCHES_SCHEMA = "pycoll-bench-launches/1"
BENCH_SCHEMA = "pycoll-bench/1"
SET_SCHEMA = "pycoll-result-set/1"
RUN_NAME_RE = re.compile(r"[A-Za-z0-9._-]+")

BEGIN_RE = re.compile(r"^<!-- table: (\S+)((?: [^\n]*?)?) -->$", re.MULTILINE)
END = "<!-- end table -->"
KEYS = {"source", "ops", "sizes", "label", "vs", "columns", "launches", "unit", "size_header", "dtype", "kind",
        "model", "run"}
DDP_SCHEMA = "pycoll-cluster-ddp-study/1"
KINDS = ("us", "busbw", "floor", "ratio", "time_ratio")

# Options of pycoll-bench that only say where and how output goes: left out of a caption's command.
_OUTPUT_OPTS_WITH_VALUE = {"--out", "--name", "--calibrate-out"}
_OUTPUT_FLAGS = {"--no-progress", "--no-plot", "--no-save"}
# Variables pycoll-bench or pycoll-cluster set (simulated hosts, the link) or that only record the environment.
_ENV_SKIP = {"PYCOLL_HOSTID", "PYCOLL_GPU_WORLD", "PYCOLL_LINK", "PYCOLL_LINK_MEASURED"}


class RenderError(Exception):
    pass


# -- sizes ------------------------------------------------------------------------------------
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def parse_size(text):
    m = re.fullmatch(r"(\d+)([KMG]?)", text.strip().upper())
    if not m:
        raise RenderError(f"bad size {text!r} (expected e.g. 8, 64K, 1M, 1G)")
    return int(m.group(1)) * _UNITS[m.group(2)]


def format_size(nbytes):
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale:
            q = nbytes / scale
            return f"{q:.0f} {unit}" if q == int(q) else f"{q:.3g} {unit}"
    return f"{nbytes} B"


# -- result files -----------------------------------------------------------------------------
def select_run(doc, path, run=None):
    """The document of ``path`` itself, or with ``run``, that run of the result set it is."""
    if doc.get("schema") == SET_SCHEMA:
        names = ", ".join(doc.get("runs") or {}) or "none"
        if run is None:
            raise RenderError(f"{path}: a result set; run= names one of its runs ({names})")
        if run not in (doc.get("runs") or {}):
            raise RenderError(f"{path}: no run {run!r} in this result set (runs: {names})")
        return doc["runs"][run]
    if run is not None:
        raise RenderError(f"{path}: run={run} given, but the file is not a result set "
                          f"(schema {doc.get('schema')!r}, not {SET_SCHEMA!r})")
    return doc


def _launches_of(doc, where):
    if doc.get("schema") == LAUNCHES_SCHEMA:
        launches = doc["launches"]
    elif doc.get("schema") == BENCH_SCHEMA:
        launches = [doc]
    else:
        raise RenderError(f"{where}: not a pycoll-bench result (schema {doc.get('schema')!r})")
    for launch in launches:
        if launch.get("schema") != BENCH_SCHEMA:
            raise RenderError(f"{where}: a launch is not a pycoll-bench result")
    return launches


def load_launches(path, run=None, shown=None):
    """The launches (pycoll-bench documents) in one result file, or in one run of a result set
    (``shown``: the file's name in messages, default ``path``)."""
    shown = shown or path
    with open(path) as fh:
        doc = json.load(fh)
    return _launches_of(select_run(doc, shown, run), shown if run is None else f"{shown} run {run}")


def merge(out, inputs):
    """Write the launches of ``inputs`` (one layout) into one file at ``out``."""
    launches = []
    for path in inputs:
        launches.extend(load_launches(path))
    layouts = {(lc["metadata"].get("card"), lc["metadata"].get("world_size"), lc["metadata"].get("hosts") or 1)
               for lc in launches}
    if len(layouts) != 1:
        raise RenderError(f"launches of different layouts (card, ranks, hosts): {sorted(map(str, layouts))}")
    with open(out, "w") as fh:
        json.dump({"schema": LAUNCHES_SCHEMA, "launches": launches}, fh, indent=1)
        fh.write("\n")


def bundle(out, pairs):
    """Write the runs ``pairs`` ((name, path) each) into the result set ``out``, adding them to the
    set already there (a run of the same name is replaced)."""
    runs = {}
    if os.path.exists(out):
        with open(out) as fh:
            doc = json.load(fh)
        if doc.get("schema") != SET_SCHEMA:
            raise RenderError(f"{out}: exists and is not a result set (schema {doc.get('schema')!r}); "
                              "--bundle adds runs only to a result set")
        runs = dict(doc["runs"])
    seen = set()
    for name, path in pairs:
        if not RUN_NAME_RE.fullmatch(name):
            raise RenderError(f"bad run name {name!r} (letters, digits, '.', '_', '-')")
        if name in seen:
            raise RenderError(f"run name {name!r} given twice")
        seen.add(name)
        with open(path) as fh:
            doc = json.load(fh)
        if doc.get("schema") == SET_SCHEMA:
            raise RenderError(f"{path}: a result set; --bundle takes pycoll-bench runs")
        _launches_of(doc, path)
        runs[name] = doc
    with open(out, "w") as fh:
        json.dump({"schema": SET_SCHEMA, "runs": runs}, fh, indent=1)
        fh.write("\n")


def reproduce_command(meta):
    """The launch's command with the program as pycoll-bench and output-only options dropped."""
    try:
        words = shlex.split(meta.get("command") or "")
    except ValueError:
        words = (meta.get("command") or "").split()
    if not words:
        return None
    if len(words) >= 3 and words[1] == "-m" and words[2] == "pycollectives.bench":
        words = ["pycoll-bench"] + words[3:]
    elif os.path.basename(words[0]).startswith("python") and len(words) > 1:
        words = ["python"] + words[1:]
    out, skip = [], False
    for w in words:
        if skip:
            skip = False
            continue
        if w in _OUTPUT_OPTS_WITH_VALUE:
            skip = True
            continue
        if w in _OUTPUT_FLAGS or any(w.startswith(o + "=") for o in _OUTPUT_OPTS_WITH_VALUE):
            continue
        out.append(w)
    env = meta.get("env") or {}
    prefix = [f"{k}={v}" for k, v in sorted(env.items()) if k.startswith("PYCOLL_") and k not in _ENV_SKIP]
    return " ".join(shlex.quote(w) if re.search(r"[^\w@%+=:,./{}-]", w) else w for w in prefix + out)


def describe_platform(meta, config=None):
    card = re.sub(r"\((R|TM)\)", "", meta.get("card") or "unknown").strip()
    card = re.sub(r"\s+", " ", card)
    world = meta.get("world_size")
    hosts = meta.get("hosts") or 1
    torch = (meta.get("torch") or "").split("+")[0]
    # Ranks that share GPUs: pycoll-bench's layout line says how many GPUs ("4 ranks on 1 GPU(s), ...").
    shared = re.match(r"(\d+) ranks.*? on (\d+) GPU", (config or {}).get("gpu_layout") or "")
    if meta.get("device") == "cuda" and shared and int(shared.group(2)) < int(shared.group(1)):
        gpus = int(shared.group(2))
        what = f"{world} ranks on {'one' if gpus == 1 else gpus} {card}" + ("" if gpus == 1 else "s")
        soft = f"torch {torch}"
    elif meta.get("device") == "cuda":
        what = f"{world} x {card}"
        nccl = (meta.get("env") or {}).get("NCCL_VERSION", "").split("-")[0]
        soft = f"torch {torch}" + (f", NCCL {nccl}" if nccl else "")
    else:
        what = f"{world} ranks on {card} ({meta.get('cpu_count')} CPUs)"
        soft = f"torch {torch}"
    if hosts > 1:
        what += f" as {hosts} simulated hosts of {world // hosts}"
    return f"{what}, {soft}"


# -- one table --------------------------------------------------------------------------------
def parse_marker(name, text):
    try:
        words = shlex.split(text)
    except ValueError as exc:
        raise RenderError(f"table {name}: {exc}")
    spec = {}
    for w in words:
        key, sep, value = w.partition("=")
        if not sep or key not in KEYS:
            raise RenderError(f"table {name}: unknown or malformed key {w!r} (keys: {', '.join(sorted(KEYS))})")
        spec[key] = value
    if "source" not in spec:
        raise RenderError(f"table {name}: no source=")
    return spec


def _index(launch, dtype):
    rows = {}
    for r in launch["results"]:
        if r.get("dtype") == dtype and r.get("mode", "eager") == "eager" and not r.get("error") and r.get("time_us"):
            rows[(r["label"], r["op"], r["bytes"])] = r
    return rows


def _reduce(values, how):
    values = [v for v in values if v is not None]
    if not values:
        return None
    if how == "range":
        return (min(values), max(values))
    return statistics.median(values)


def _fmt(value, kind, unit):
    if value is None:
        return "-"
    if isinstance(value, tuple):
        lo, hi = (_fmt(v, kind, unit) for v in value)
        if lo == hi:
            return lo
        return f"{lo[:-1] if lo.endswith('x') else lo}-{hi}"
    if kind == "us":
        v = value / 1000.0 if unit == "ms" else value
        return f"{v:.0f}" if v >= 100 else f"{v:.1f}"
    if kind == "busbw":
        return f"{value:.2f}"
    if kind in ("ratio", "time_ratio"):
        return f"{value:.1f}x" if value >= 10 else f"{value:.2f}x"
    return f"{value:.2f}"


def render_table(name, spec, root, doc_dir=""):
    path = os.path.join(root, spec["source"])
    if not os.path.exists(path):
        raise RenderError(f"table {name}: no file {spec['source']}")
    if spec.get("kind", "bench") == "ddp":
        return render_ddp(name, spec, path, doc_dir)
    if spec.get("kind", "bench") != "bench":
        raise RenderError(f"table {name}: kind= is ddp (or left out)")
    try:
        launches = load_launches(path, spec.get("run"), spec["source"])
    except RenderError as exc:
        raise RenderError(f"table {name}: {exc}")
    first = launches[0]
    dtype = spec.get("dtype") or (first["config"].get("dtypes") or [first["results"][0]["dtype"]])[0]
    labels = first.get("labels") or []
    label = spec.get("label") or ("pycoll" if "pycoll" in labels else labels[0])
    vs = spec.get("vs") or first.get("baseline")
    how = spec.get("launches", "median")
    if how not in ("median", "range"):
        raise RenderError(f"table {name}: launches= is median or range")
    unit = spec.get("unit", "us")
    if unit not in ("us", "ms"):
        raise RenderError(f"table {name}: unit= is us or ms")
    indexed = [_index(lc, dtype) for lc in launches]
    if spec.get("sizes"):
        sizes = [parse_size(s) for s in spec["sizes"].split(",")]
    else:
        sizes = sorted({r["bytes"] for r in first["results"]})
    ops = []  # (op, its sizes): ops=all_reduce,all_gather:1M+1G gives all_gather its own sizes
    for item in (spec["ops"].split(",") if spec.get("ops") else dict.fromkeys(r["op"] for r in first["results"])):
        op, _, own = item.partition(":")
        ops.append((op, [parse_size(s) for s in own.split("+")] if own else sizes))
    columns = []
    for col in (spec.get("columns") or "us,us:" + str(vs) + ",ratio").split(","):
        kind, _, who = col.partition(":")
        if kind not in KINDS:
            raise RenderError(f"table {name}: unknown column {col!r} (kinds: {', '.join(KINDS)})")
        columns.append((kind, who or label))

    def value(idx, kind, who, op, nbytes):
        r = idx.get((who, op, nbytes))
        if r is None:
            return None
        if kind == "us":
            return r["time_us"]
        if kind == "busbw":
            return r.get("busbw_gbps")
        other = idx.get(("floor" if kind == "floor" else vs, op, nbytes))
        if other is None:
            return None
        if kind == "time_ratio":
            return r["time_us"] / other["time_us"]
        return other["time_us"] / r["time_us"]  # ratio (busbw of who over vs's) and floor

    def header(kind, who):
        t = "ms" if unit == "ms" else "us"
        return {"us": f"{who} {t}", "busbw": f"{who} busbw GB/s",
                "ratio": f"busbw x {vs}" if who == label else f"{who} busbw x {vs}",
                "time_ratio": f"time / {vs}'s" if who == label else f"{who} time / {vs}'s",
                "floor": "of memory floor" if who == label else f"{who} of memory floor"}[kind]

    lines = ["| op | " + spec.get("size_header", "size") + " | " + " | ".join(header(k, w) for k, w in columns) + " |",
             "|---|---|" + "---|" * len(columns)]
    found = 0
    for op, op_sizes in ops:
        for nbytes in op_sizes:
            cells = [_fmt(_reduce([value(idx, k, w, op, nbytes) for idx in indexed], how), k, unit)
                     for k, w in columns]
            if all(c == "-" for c in cells):
                continue
            found += 1
            lines.append(f"| {op} | {format_size(nbytes)} | " + " | ".join(cells) + " |")
    if not found:
        where = spec["source"] + (f" run {spec['run']}" if spec.get("run") else "")
        raise RenderError(f"table {name}: no rows for label {label!r}, ops {[o for o, _ in ops]} in {where}")
    return caption(launches, label, vs, how, spec, doc_dir) + "\n\n" + "\n".join(lines)


def caption(launches, label, vs, how, spec, doc_dir=""):
    meta = launches[0]["metadata"]
    dates = sorted({lc["metadata"]["date"][:10] for lc in launches})
    date = dates[0] if len(dates) == 1 else f"{dates[0]} to {dates[-1]}"
    rounds = sorted({lc["config"].get("rounds", 1) for lc in launches})
    rounds_text = "/".join(str(r) for r in rounds)
    n = len(launches)
    per_launch = "one round" if rounds == [1] else f"the median of {rounds_text} rounds"
    if n == 1:
        reduced = f"each row {per_launch}, one launch"
    else:
        reduced = (f"each row {per_launch} in each of {n} launches, then the "
                   + ("median over the launches" if how == "median" else "range (min-max) over the launches"))
    if meta.get("what"):
        reduced = f"{meta['what']}; {reduced}"
    ratio = f"; ratios against {vs} in the same launch" if vs and vs != label else ""
    commands = list(dict.fromkeys(c for c in (reproduce_command(lc["metadata"]) for lc in launches) if c))
    cmd = " / ".join(f"`{c}`" for c in commands) if commands else "(command not recorded)"
    link = os.path.relpath(spec["source"], doc_dir or ".").replace(os.sep, "/")
    run = f", run {spec['run']}" if spec.get("run") else ""
    platform = describe_platform(meta, launches[0].get("config"))
    return f"*{platform}, {date}; {reduced}{ratio}. {cmd} ([data]({link}){run})*"


# -- DDP steps across links (benchmarks/cluster_ddp_study.py) ---------------------------------
def _rate_text(bps):
    return f"{bps / 1e9:.3g} Gbit/s" if bps >= 1e9 else f"{bps / 1e6:.0f} Mbit/s"


def _link_bps(link):
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([kmg]?)bit", link or "")
    return float(m.group(1)) * {"": 1, "k": 1e3, "m": 1e6, "g": 1e9}[m.group(2)] if m else 0.0


def _collapse(commands):
    """Commands that differ only in some words, as one with {a,b} at those words."""
    split = [shlex.split(c) for c in commands]
    if len({len(w) for w in split}) != 1:
        return " / ".join(f"`{c}`" for c in commands)
    words = []
    for column in zip(*split):
        values = list(dict.fromkeys(column))
        words.append(values[0] if len(values) == 1 else "{" + ",".join(values) + "}")
    return "`" + " ".join(words) + "`"


def render_ddp(name, spec, path, doc_dir=""):
    """One model's rows: per layout and method, the bytes on the link per step, the step time at
    every link with its speedup over no hook (same layout and link), and the loss after the same
    steps (a row without a loss is refused: a faster step is shown only beside what it costs)."""
    with open(path) as fh:
        doc = json.load(fh)
    if spec.get("run") is not None:
        raise RenderError(f"table {name}: {spec['source']}: run= is for a result set of pycoll-bench runs, "
                          "not for kind=ddp")
    if doc.get("schema") != DDP_SCHEMA:
        raise RenderError(f"table {name}: {spec['source']} is not a DDP study file (schema {doc.get('schema')!r})")
    model = spec.get("model")
    rows = [r for r in doc["rows"] if r["model"] == model]
    if not rows:
        raise RenderError(f"table {name}: no rows of model {model!r} in {spec['source']}")
    for r in rows:
        if r.get("loss") is None:
            raise RenderError(f"table {name}: {r['layout']} {r['link']} {r['method']}: no loss")
    layouts = sorted(dict.fromkeys(r["layout"] for r in rows))
    links = sorted(dict.fromkeys(r["link"] for r in rows), key=_link_bps)
    methods = list(dict.fromkeys(r["method"] for r in rows))
    at = {(r["layout"], r["link"], r["method"]): r for r in rows}
    acc = any("test_accuracy" in r for r in rows)
    head = (["layout", "method", "link MB/step"] + [f"ms/step at {link}" for link in links]
            + [f"loss after {rows[0]['steps'] + rows[0]['warmup']} steps"] + (["test accuracy"] if acc else []))
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for layout in layouts:
        for method in methods:
            here = [at.get((layout, link, method)) for link in links]
            if not any(here):
                continue
            got = [r for r in here if r]
            mb = statistics.median(r["link_bytes_per_step"] for r in got) / 1e6
            cells = [layout.replace("x", " x "), method, f"{mb:.3g}"]
            for link, r in zip(links, here):
                base = at.get((layout, link, "none"))
                if r is None:
                    cells.append("-")
                elif base is None or method == "none":
                    cells.append(_fmt(r["step_ms"] * 1e3, "us", "ms"))
                else:
                    cells.append(f"{_fmt(r['step_ms'] * 1e3, 'us', 'ms')} ({_fmt(base['step_ms'] / r['step_ms'], 'ratio', '')})")
            losses = sorted({f"{r['loss']:.4f}" for r in got})
            cells.append("-".join([losses[0], losses[-1]]) if len(losses) > 1 else losses[0])
            if acc:
                accs = sorted({f"{r['test_accuracy'] * 100:.1f}%" for r in got}, key=lambda t: float(t[:-1]))
                cells.append("-".join([accs[0], accs[-1]]) if len(accs) > 1 else accs[0])
            lines.append("| " + " | ".join(cells) + " |")
    runs = [r for r in doc.get("runs", []) if r["model"] == model]
    measured = {}
    for r in runs:
        measured.setdefault(r["link"], []).append(r["link_measured_bps"])
    rates = "; ".join(f"{link} measured {_rate_text(min(measured[link]))}"
                      + (f" to {_rate_text(max(measured[link]))}" if _rate_text(min(measured[link])) !=
                         _rate_text(max(measured[link])) else "")
                      for link in links if link in measured)
    dates = sorted({r["date"][:10] for r in runs})
    date = dates[0] if len(dates) == 1 else f"{dates[0]} to {dates[-1]}"
    m = doc.get("machine", {})
    cpu = re.sub(r"\s+", " ", re.sub(r"\((R|TM)\)", "", m.get("cpu") or "unknown")).strip()
    torch = (m.get("torch") or "").split("+")[0]
    commands = list(dict.fromkeys(r["command"] for r in sorted(runs, key=lambda r: (_link_bps(r["link"]), r["layout"]))))
    link = os.path.relpath(spec["source"], doc_dir or ".").replace(os.sep, "/")
    cap = (f"*2 simulated hosts on {cpu} ({m.get('cpu_count')} CPUs), torch {torch}, {date}; one launch per "
           f"layout and link ({rates}, one TCP stream before the run); pycoll, every method from the same "
           f"seed; ms/step: the slowest rank's, (Nx): no hook's time / the method's, same layout and link; "
           f"link MB/step: what each host sent on its link per step (interface counter, headers included), "
           f"the median over the links. {_collapse(commands) if commands else '(command not recorded)'} "
           f"([data]({link}))*")
    return cap + "\n\n" + "\n".join(lines)


# -- documents --------------------------------------------------------------------------------
def render_doc(text, root, doc_dir=""):
    """``text`` with every table between markers rendered again."""
    out, pos = [], 0
    for m in BEGIN_RE.finditer(text):
        if m.start() < pos:
            continue
        end = text.find(END, m.end())
        nxt = BEGIN_RE.search(text, m.end())
        if end < 0 or (nxt and nxt.start() < end):
            raise RenderError(f"table {m.group(1)}: no '{END}' before the next table")
        spec = parse_marker(m.group(1), m.group(2))
        out.append(text[pos:m.end()])
        out.append("\n" + render_table(m.group(1), spec, root, doc_dir) + "\n")
        out.append(END)
        pos = end + len(END)
    out.append(text[pos:])
    return "".join(out)


def run(docs, root, check):
    """Render ``docs`` (paths relative to ``root``); with ``check``, return the diffs instead of
    writing. Returns a list of (doc, unified diff) for the docs whose tables differ."""
    diffs = []
    for doc in docs:
        path = os.path.join(root, doc)
        with open(path) as fh:
            old = fh.read()
        new = render_doc(old, root, os.path.dirname(doc))
        if new != old:
            diff = "".join(difflib.unified_diff(old.splitlines(True), new.splitlines(True),
                                                f"{doc} (in the tree)", f"{doc} (rendered)"))
            diffs.append((doc, diff))
            if not check:
                with open(path, "w") as fh:
                    fh.write(new)
    return diffs


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("docs", nargs="*", help=f"documents, relative to --root (default: {' '.join(DOCS)})")
    ap.add_argument("--check", action="store_true", help="change nothing; exit 1 and print a diff if a table differs")
    ap.add_argument("--root", default=ROOT, help="repository root the paths are relative to")
    ap.add_argument("--merge", nargs="+", metavar=("OUT", "IN"),
                    help="write the launches of IN... (one layout) into the result file OUT, then exit")
    ap.add_argument("--bundle", nargs="+", metavar=("OUT", "NAME=RUN"),
                    help="write the runs RUN... into the result set OUT under the names NAME (adding them "
                         "to OUT where it is a result set already), then exit")
    args = ap.parse_args(argv)
    try:
        if args.bundle:
            if len(args.bundle) < 2 or any("=" not in w for w in args.bundle[1:]):
                ap.error("--bundle OUT NAME=RUN [NAME=RUN ...]")
            bundle(args.bundle[0], [tuple(w.split("=", 1)) for w in args.bundle[1:]])
            return 0
        if args.merge:
            if len(args.merge) < 2:
                ap.error("--merge OUT IN [IN ...]")
            merge(args.merge[0], args.merge[1:])
            return 0
        diffs = run(args.docs or list(DOCS), args.root, args.check)
    except (RenderError, OSError, ValueError, KeyError) as exc:
        print(f"render_tables: {exc}", file=sys.stderr)
        return 2
    for doc, diff in diffs:
        if args.check:
            sys.stdout.write(diff)
        else:
            print(f"render_tables: rewrote the tables of {doc}")
    if args.check and diffs:
        print(f"render_tables: tables differ from the result files in {', '.join(d for d, _ in diffs)}; "
              "run python3 benchmarks/render_tables.py", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
