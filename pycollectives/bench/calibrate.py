"""--calibrate: fit time(bytes) = alpha + beta * bytes per (op, algorithm) and write the
constants the backend's ``auto`` cost model reads (to --calibrate-out, by default this user's
cache, ``pycollectives.cache.cost_model_path()``).

The fit is least squares on the *relative* error, sum(((alpha + beta*b - t) / t)^2), so that
8-byte and 64-MiB points count alike (plain least squares would let the largest sizes decide
alpha alone).  Both constants are kept non-negative.  ``bytes`` is the size of the op's
largest buffer, as everywhere in pycoll-bench.
"""
import json
import math
import os

from ..cache import cost_model_path

UNITS = {
    "alpha_us": "microseconds per call",
    "beta_us_per_byte": "microseconds per byte of the op's largest buffer (all_gather: output, "
                        "reduce_scatter: input)",
    "min_bytes": "bytes", "max_bytes": "bytes",
}


def fit_alpha_beta(points):
    """(alpha_us, beta_us_per_byte, rel_rms) for [(bytes, time_us), ...] with >= 2 sizes."""
    pts = [(float(b), float(t)) for b, t in points if t and t > 0]
    if len({b for b, _ in pts}) < 2:
        raise ValueError("need at least two distinct sizes to fit alpha and beta")
    w = [1.0 / (t * t) for _, t in pts]
    sw = sum(w)
    swx = sum(wi * b for wi, (b, _) in zip(w, pts))
    swxx = sum(wi * b * b for wi, (b, _) in zip(w, pts))
    swt = sum(wi * t for wi, (_, t) in zip(w, pts))
    swxt = sum(wi * b * t for wi, (b, t) in zip(w, pts))
    det = sw * swxx - swx * swx
    alpha = (swt * swxx - swx * swxt) / det if det else 0.0
    beta = (sw * swxt - swx * swt) / det if det else 0.0
    if beta < 0:                      # flat times: latency only
        beta, alpha = 0.0, swt / sw
    if alpha < 0:                     # through the origin: bandwidth only
        alpha, beta = 0.0, swxt / swxx
    rel = [((alpha + beta * b) - t) / t for b, t in pts]
    return alpha, beta, math.sqrt(sum(r * r for r in rel) / len(rel))


# What a cost model chooses between; only these become "entries".
MODEL_ALGOS = ("ring", "tree", "oneshot", "twoshot")
MODEL_OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce")


def _norm(name):
    """'all_reduce', 'allreduce' -> 'allreduce' (the backend's op names have no underscore)."""
    return str(name).lower().replace("_", "").replace("-", "")


def backend_cost_pairs(device):
    """The (op, algo) pairs the backend's CPU cost table holds, or None if it does not say.

    A forced algorithm that an op does not implement falls back to another one inside the
    backend (e.g. broadcast with ring runs the auto choice), so a row labelled with it did not
    measure it; writing such a pair would add an algorithm the selector must not pick."""
    if device != "cpu":
        return None
    try:
        import pycollectives
    except Exception:
        return None
    fn = getattr(pycollectives, "cost_entries", None) or getattr(getattr(pycollectives, "_C", None),
                                                                 "cost_entries", None)
    if fn is None:
        return None
    try:
        return {(_norm(e[0]), _norm(e[1])) for e in fn()}
    except Exception:
        return None


def extension():
    """pycollectives._C, or None (the extension not built: the harness alone is running)."""
    try:
        from pycollectives import _C
    except Exception:
        return None
    return _C if hasattr(_C, "cuda_algorithm") else None


def fit_entries(rows, dtype, known_pairs=None):
    """(entries, reference_entries) from eager, error-free, correct rows of ``dtype``.

    ``entries``: one per (op, algorithm) for pycoll rows with a forced algorithm in
    MODEL_ALGOS on an op in MODEL_OPS (and, when ``known_pairs`` is given, a pair the backend's
    cost table holds) -- what ``pycollectives.load_cost_model`` applies.
    ``reference_entries``: the same fit for every other row (pycoll's own choice as algo
    "auto", the comparison backends with algo = their label, pairs the backend does not
    implement), for comparison only; a cost model must not read them."""
    groups = {}
    for r in rows:
        if r["mode"] != "eager" or r["dtype"] != dtype or r.get("error") or r.get("check") == "fail":
            continue
        if not r.get("time_us") or r["backend"] == "floor":  # the memory floor is no backend
            continue
        algo = (r["algo"] or "auto") if r["backend"] == "pycoll" else r["label"]
        groups.setdefault((r["backend"], algo, r["op"]), []).append((r["bytes"], r["time_us"]))
    entries, reference = [], []
    for (backend, algo, op), pts in groups.items():
        try:
            alpha, beta, rel_rms = fit_alpha_beta(pts)
        except ValueError:
            continue
        entry = dict(op=op, algo=algo, alpha_us=alpha, beta_us_per_byte=beta,
                     min_bytes=int(min(b for b, _ in pts)), max_bytes=int(max(b for b, _ in pts)),
                     backend=backend, points=len(pts), rel_rms_error=rel_rms)
        model = backend == "pycoll" and algo in MODEL_ALGOS and op in MODEL_OPS
        if model and known_pairs is not None and (_norm(op), _norm(algo)) not in known_pairs:
            model = False
            entry["note"] = "not in the backend's cost table: the forced algorithm falls back for this op"
        (entries if model else reference).append(entry)
    return entries, reference


# The CUDA engine's `auto` picks between these per op (it runs anything else as direct for
# all_gather / reduce_scatter); --calibrate on GPUs writes which one won where ("cuda_choices").
CUDA_CHOICE_ALGOS = {"all_reduce": ("oneshot", "twoshot", "ring", "tree"),
                     "all_gather": ("oneshot", "ring"), "reduce_scatter": ("oneshot", "ring")}
# Another algorithm replaces the built-in choice at a size only when it measured this much faster
# (relative to the built-in choice's time): the built-in choices are themselves measured
# (csrc/cuda/select.h), and eager calls up to ~1 MiB are host-bound, every algorithm within noise
# of the others: docs/decisions/0007-calibration-margin.md.
CUDA_CHOICE_MARGIN = 0.05
# A winner at one size only must beat its neighbours' choice there by this many margins: in that
# calibration such one-size wins were 5-10% (host-bound sizes), real crossovers span sizes.
ISLAND_MARGINS = 3


def _timed_pycoll_row(r, dtype):
    """An eager, error-free, correct pycoll row of ``dtype`` with a time: what a table may use."""
    return (r["backend"] == "pycoll" and r["mode"] == "eager" and r["dtype"] == dtype and not r.get("error")
            and r.get("check") != "fail" and bool(r.get("time_us")))


def engine_bytes(op, nbytes, world):
    """pycoll-bench counts the op's largest buffer; the CUDA engine's choice counts the tensor for
    all_reduce and one rank's share for all_gather / reduce_scatter."""
    return nbytes if op == "all_reduce" else nbytes // world


def fit_cuda_choices(rows, dtype, world, builtin, margin=CUDA_CHOICE_MARGIN):
    """{op: {"max_bytes": B, "steps": [[from_bytes, algo], ...], "sizes": [...]}} in engine bytes,
    from eager, error-free, correct pycoll rows of ``dtype`` with a forced algorithm.

    At each size where at least two algorithms ran: ``builtin(op, engine_bytes, world)`` unless
    another algorithm took less than (1 - margin) of its time (or it did not run there), then the
    fastest. A winner at one size only, between two sizes that agree on another algorithm, is
    taken for noise unless it beat that algorithm there by more than ``ISLAND_MARGINS`` margins
    (and is kept when that algorithm did not run there): the size then takes its neighbours'
    choice. Consecutive sizes with the same winner make one step. The table covers the measured
    sizes only (min..max); outside them the engine keeps its built-in rules."""
    times = {}
    for r in rows:
        if not _timed_pycoll_row(r, dtype):
            continue
        algo = r.get("algo")
        if r["op"] not in CUDA_CHOICE_ALGOS or algo not in CUDA_CHOICE_ALGOS[r["op"]]:
            continue
        times.setdefault(r["op"], {}).setdefault(engine_bytes(r["op"], r["bytes"], world), {})[algo] = r["time_us"]
    out = {}
    for op, by_size in sorted(times.items()):
        table = winner_steps(by_size, lambda nb, op=op: builtin(op, nb, world), margin)
        if table:
            out[op] = table
    return out


def winner_steps(by_size, builtin, margin):
    """{"max_bytes", "steps": [[from_bytes, choice], ...], "sizes"} from {bytes: {choice: time_us}},
    or None: the rule of fit_cuda_choices (built-in choice unless beaten by the margin, one-size
    islands taken for noise), for any set of choices; ``builtin(bytes)`` names the built-in one."""
    sizes, raw = [], []
    for nb in sorted(by_size):
        t = by_size[nb]
        if len(t) < 2:
            continue
        fastest = min(t, key=t.get)
        base = builtin(nb)
        sizes.append(nb)
        raw.append(base if base in t and t[fastest] >= (1.0 - margin) * t[base] else fastest)
    wins = list(raw)
    for i in range(1, len(raw) - 1):
        t, nbr = by_size[sizes[i]], raw[i - 1]
        if nbr == raw[i + 1] != raw[i] and nbr in t and t[raw[i]] >= (1.0 - ISLAND_MARGINS * margin) * t[nbr]:
            wins[i] = nbr
    steps = []
    for nb, win in zip(sizes, wins):
        if not steps or steps[-1][1] != win:
            steps.append([nb, win])
    return {"max_bytes": sizes[-1], "steps": steps, "sizes": sizes} if steps else None


def constants_document(entries, reference, meta, dtype):
    return {
        "device": meta["device"],
        "card": meta["card"],
        "date": meta["date"],
        "command": meta["command"],
        "world_size": meta["world_size"],
        "dtype": dtype,
        "units": UNITS,
        "model": "time_us = alpha_us + beta_us_per_byte * bytes (least squares on relative error)",
        "entries": entries,
        "reference_entries": reference,
    }


def add_cuda_choices(doc, rows, dtype, world, builtin, margin=CUDA_CHOICE_MARGIN):
    """Adds "cuda_choices" (fit_cuda_choices) to a constants document; returns its ops."""
    ops = fit_cuda_choices(rows, dtype, world, builtin, margin)
    doc["cuda_choices"] = {
        "world_size": world, "margin": margin,
        "rule": "per size the built-in choice unless another algorithm was faster by more than the margin; "
                "from_bytes in the engine's unit (all_reduce: tensor bytes; all_gather / reduce_scatter: one "
                "rank's share); only inside the measured sizes",
        "ops": ops,
    }
    return ops


def how_it_is_used(path):
    """One line for the report: whether a later ``import pycollectives`` reads ``path`` by itself."""
    if os.path.abspath(path) == os.path.abspath(cost_model_path()):
        return f"import pycollectives loads {path} (unless PYCOLL_COST_MODEL names another file)"
    return f"not read by default: set PYCOLL_COST_MODEL={path} on every rank to use it"


def write_constants(path, doc):
    parent = os.path.dirname(os.path.abspath(path))
    os.makedirs(parent, exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as fh:
        json.dump(doc, fh, indent=1)
        fh.write("\n")
    os.replace(tmp, path)


# Across hosts (--hosts N): per (device, op, layout), which form (flat or hierarchical) won where,
# by the rule of the CUDA engine's measured choices (winner_steps: the built-in form unless the
# other was faster by the margin); the engine follows the table inside the measured sizes
# (csrc/engines/host_form_model.h). A table rather than one alpha-beta line per form: Gloo's time
# bends past the caches (5-6x from 8 to 32 MiB on 2 cores), and lines fitted through 8 B..64 MiB
# put the crossover of all_gather at 5 MiB where the measured times cross again above 8 MiB.
HOST_FORMS = ("flat", "hierarchical")
HOST_FORM_OPS = ("all_reduce", "reduce_scatter", "all_gather")


def fit_host_forms(rows, dtype, device, num_hosts, local_size, builtin, margin=CUDA_CHOICE_MARGIN, link=None):
    """[{device, op, num_hosts, local_size, max_bytes, steps, sizes, margin}, ...], one per op measured
    in both forms, from eager, error-free, correct pycoll rows of ``dtype`` forced to a form.
    ``builtin(op, bytes)``: the engine's form without a table (``_C.host_form(..., builtin=True)``).
    ``link``: the rate of the links between the hosts (PYCOLL_LINK), which keys the table too."""
    times = {}
    for r in rows:
        if not _timed_pycoll_row(r, dtype):
            continue
        if r["op"] in HOST_FORM_OPS and r.get("algo") in HOST_FORMS:
            times.setdefault(r["op"], {}).setdefault(r["bytes"], {})[r["algo"]] = r["time_us"]
    out = []
    for op in HOST_FORM_OPS:
        table = winner_steps(times.get(op) or {}, lambda nb, op=op: builtin(op, nb), margin)
        if table:
            entry = dict(device=device, op=op, num_hosts=num_hosts, local_size=local_size, margin=margin, **table)
            if link:
                entry["link"] = link
            out.append(entry)
    return out


def merge_host_forms(existing, new_entries):
    """The file's host_forms with those of the (device, layout, link)s just measured replaced."""
    def key(e):
        return e.get("device"), e.get("num_hosts"), e.get("local_size"), e.get("link")
    layouts = {key(e) for e in new_entries}
    kept = [e for e in (existing or []) if key(e) not in layouts]
    return kept + list(new_entries)


def read_existing(path):
    """The calibration file at ``path`` as a dict, or {} (absent or unreadable: nothing to keep)."""
    try:
        with open(path) as fh:
            doc = json.load(fh)
        return doc if isinstance(doc, dict) else {}
    except (OSError, ValueError):
        return {}
