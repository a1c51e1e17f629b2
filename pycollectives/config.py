"""Run-time settings: the forced algorithm and the cost model's constants.

``PYCOLL_ALGO=ring|tree|oneshot|twoshot|auto`` sets the algorithm at start-up;
``set_algo()`` changes it for every later op of this process (all ranks must
agree, or the op header check raises). ``PYCOLL_DEBUG=INFO`` logs one line
per op. A calibration (``pycoll-bench --calibrate``) replaces the built-in
latency/bandwidth constants of the CPU engine's ``auto`` choice, or, for a file
calibrated on GPUs, the CUDA engine's ``auto`` choices inside the measured sizes; a
calibration across hosts (``--hosts``) adds where ``auto`` runs an op flat or hierarchical.
It is read at import from ``PYCOLL_COST_MODEL=path.json``, else from this user's
cache (``pycollectives.cache.cost_model_path()``), never from this package.
"""
from __future__ import annotations

import json
import os
import sys
from typing import Optional

from . import _C
from .cache import cost_model_path
from .package_settings import COST_MODEL

# What PYCOLL_ALGO and set_algo() accept, from the extension (csrc/common/types.h): the one list.
# "hierarchical" and "flat" apply to groups across hosts; inside a host they mean auto.
ALGORITHMS = tuple(_C.algorithm_names())

def set_algo(name: Optional[str]) -> None:
    """Force an algorithm (one of ALGORITHMS) or return to the cost model (None or "auto").

    Any other name is a schedule program (docs/schedules.md): registered with
    `register_algorithm`, a shipped example ("ring_all_reduce", "bruck", ...) or
    "package.module:function"; it must resolve here (a module is imported now), else
    ScheduleError (a ValueError) says why. CPU ops of the program's collective then run it; other
    ops run auto."""
    name = "auto" if name is None else str(name)
    if name.lower().replace("-", "").replace("_", "") not in ALGORITHMS:
        from .schedule.registry import resolve

        if not name or name.strip() != name or " " in name:
            raise ValueError(f"unknown algorithm {name!r}: expected one of {', '.join(ALGORITHMS)} "
                             f"or a schedule program's name")
        resolve(name)
    _C.set_algo(name)


def get_algo() -> Optional[str]:
    """The forced algorithm (a schedule program's name where one is), or None when the cost model
    chooses."""
    name = _C.get_algo()
    return None if name == "auto" else name


def load_cost_model(path: Optional[str] = None) -> int:
    """Loads a ``pycoll-bench --calibrate`` file; returns how many entries (CPU: (op, algorithm)
    constants; GPU: per-op tables) were applied.

    A CPU file's (alpha, beta) constants replace the CPU engine's; a GPU file's measured choices
    ("cuda_choices": which algorithm won at which size, per op) become the CUDA engine's ``auto``
    inside the measured sizes (csrc/cuda/measured_choices.h), replacing any loaded before. Every
    rank must load the same file: the CUDA engine compares the tables when a group starts.

    Without ``path``: ``PYCOLL_COST_MODEL``, else this user's cache (``cache.cost_model_path()``,
    where ``pycoll-bench --calibrate`` writes by default); no file there means the built-in
    choices. With ``PYCOLL_DEBUG=INFO`` the file in use is logged to stderr, once per file."""
    if not path:
        _note_package_file()
    path = path or COST_MODEL.get() or cost_model_path()
    if not os.path.exists(path):
        _C.clear_host_form_tables()
        return 0
    with open(path) as fh:
        model = json.load(fh)
    if not isinstance(model, dict):
        raise ValueError(f"{path}: not a pycoll-bench --calibrate file (a JSON object)")
    device = model.get("device", "cpu")
    forms = _load_host_forms(model.get("host_forms") or [])
    if device == "cuda":
        n = _load_cuda_choices(model.get("cuda_choices") or {})
    elif device == "cpu":
        n = 0
        for e in model.get("entries", []):
            try:
                _C.set_cost_entry(e["op"], e["algo"], float(e["alpha_us"]), float(e["beta_us_per_byte"]))
                n += 1
            except (KeyError, ValueError):
                continue
    else:
        return forms
    _debug_once(path, f"auto uses the calibration {os.path.abspath(path)} ({device}, "
                      f"{model.get('card', '?')}, {model.get('date', '?')}; {n} "
                      f"{'per-op tables' if device == 'cuda' else '(op, algorithm) constants'}"
                      f"{f', {forms} tables of forms across hosts' if forms else ''})")
    return n + forms


def _load_host_forms(tables) -> int:
    """Which form (flat or hierarchical) won where in groups across hosts (csrc/engines/
    host_form_model.h): all of the tables or none (a bad one raises ValueError, none installed).
    A table measured on links of a given rate ("link", pycoll-bench --link) is installed only where
    PYCOLL_LINK names that rate, and a table without one only where PYCOLL_LINK is unset."""
    from .cluster.rates import canonical
    from .package_settings import LINK

    _C.clear_host_form_tables()
    try:
        if not isinstance(tables, list):
            raise ValueError("expected a list of {device, op, num_hosts, local_size, steps, max_bytes}")
        here = canonical(LINK.get()) if LINK.get() else None
        tables = [t for t in tables if (canonical(t["link"]) if t.get("link") else None) == here]
        for t in tables:
            _C.set_host_form_table(str(t["device"]), str(t["op"]), int(t["num_hosts"]), int(t["local_size"]),
                                   [(int(b), str(f)) for b, f in t["steps"]], int(t["max_bytes"]))
        return len(tables)
    except (AttributeError, KeyError, TypeError, ValueError) as exc:
        _C.clear_host_form_tables()
        raise ValueError(f"host_forms: {exc}") from exc


_logged = set()


def debug_info() -> bool:
    """PYCOLL_DEBUG is INFO (or DEBUG, TRACE) now: the extension's setting, read through its registry."""
    return _C.read_setting("PYCOLL_DEBUG").upper() in ("INFO", "DEBUG", "TRACE")


def _debug_once(key, message: str) -> None:
    """One PYCOLL_DEBUG=INFO line per key and process: the backend's log says what ran, this says why."""
    if key in _logged or not debug_info():
        return
    _logged.add(key)
    print(f"[pycoll] {message}", file=sys.stderr, flush=True)


def _note_package_file() -> None:
    """Older pycoll-bench versions wrote their calibration into the package; it is no longer read."""
    old = os.path.join(os.path.dirname(os.path.abspath(__file__)), "cost_model.json")
    if os.path.exists(old):
        _debug_once(old, f"ignored {old} (calibrations inside the package are not read; "
                         f"move it to {cost_model_path()} or name it in PYCOLL_COST_MODEL)")


def _load_cuda_choices(choices: dict) -> int:
    """All of the file's tables or none (a bad one raises ValueError and leaves none installed)."""
    _C.clear_cuda_choices()
    try:
        if not isinstance(choices, dict) or not isinstance(choices.get("ops") or {}, dict):
            raise ValueError("cuda_choices: expected {'world_size': n, 'ops': {op: {'steps': ..., 'max_bytes': ...}}}")
        world = int(choices.get("world_size", 0))
        n = 0
        for op, table in (choices.get("ops") or {}).items():
            steps = [(int(b), str(a)) for b, a in table["steps"]]
            _C.set_cuda_choices(op, world, steps, int(table["max_bytes"]))  # ValueError names a bad table
            n += 1
        return n
    except (KeyError, TypeError, ValueError) as exc:
        _C.clear_cuda_choices()
        raise ValueError(f"cuda_choices: {exc}") from exc
