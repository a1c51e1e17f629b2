"""Run-time settings: the forced algorithm and the cost model's constants.

``PYCOLL_ALGO=ring|tree|oneshot|twoshot|auto`` sets the algorithm at start-up;
``set_algo()`` changes it for every later op of this process (all ranks must
agree, or the op header check raises). ``PYCOLL_DEBUG=INFO`` logs one line
per op. ``PYCOLL_COST_MODEL=path.json`` (default: ``cost_model.json`` in this
package, written by ``pycoll-bench --calibrate``) replaces the built-in
latency/bandwidth constants of the ``auto`` choice.
"""
from __future__ import annotations

import json
import os
from typing import Optional

from . import _C

ALGORITHMS = ("auto", "ring", "tree", "oneshot", "twoshot")


def set_algo(name: Optional[str]) -> None:
    """Force an algorithm (ring, tree, oneshot, twoshot) or return to the cost model (None or "auto")."""
    name = "auto" if name is None else str(name)
    if name.lower().replace("-", "").replace("_", "") not in ALGORITHMS:
        raise ValueError(f"unknown algorithm {name!r}: expected one of {', '.join(ALGORITHMS)}")
    _C.set_algo(name)


def get_algo() -> Optional[str]:
    """The forced algorithm, or None when the cost model chooses."""
    name = _C.get_algo()
    return None if name == "auto" else name


def load_cost_model(path: Optional[str] = None) -> int:
    """Loads calibrated (alpha, beta) constants; returns how many entries were applied."""
    path = path or os.environ.get("PYCOLL_COST_MODEL") or os.path.join(os.path.dirname(__file__), "cost_model.json")
    if not os.path.exists(path):
        return 0
    with open(path) as fh:
        model = json.load(fh)
    if model.get("device", "cpu") != "cpu":
        return 0  # the CUDA engine's choices are fixed thresholds (csrc/cuda/select.h); a GPU fit is for reading
    n = 0
    for e in model.get("entries", []):
        try:
            _C.set_cost_entry(e["op"], e["algo"], float(e["alpha_us"]), float(e["beta_us_per_byte"]))
            n += 1
        except (KeyError, ValueError):
            continue
    return n
