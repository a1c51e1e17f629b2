"""Registered schedules: `register_algorithm(name, program_factory)` checks a program factory
and records it under a name; `lookup(name, collective, ranks)` gives the checked IR of that
collective for a group of `ranks`, built once per rank count.

Ranks are separate processes, so every rank must reach a program by a name it can import:
a name "package.module:function" is imported on its first lookup in a process, registered and
checked like any other. The shipped examples have short names (`EXAMPLES`; `ALIASES` where a
short name is a built-in algorithm's).

A program factory is a function of the rank count (keyword arguments optional) that returns a
`Program` (or an `IR`). The CPU engine takes a forced program from here (engine_tables.provide,
through `lookup`) and compares `IR.digest64()` in its per-op check word.
"""
from __future__ import annotations

import importlib
import threading
from typing import Callable, Dict, Iterable, List, Optional, Tuple

from .check import check
from .errors import ScheduleError
from .ir import IR

EXAMPLES = {
    "ring": "pycollectives.schedule.examples.ring:ring_all_reduce",
    "ring_reduce_scatter": "pycollectives.schedule.examples.ring:ring_reduce_scatter",
    "ring_all_gather": "pycollectives.schedule.examples.ring:ring_all_gather",
    "rabenseifner": "pycollectives.schedule.examples.rabenseifner:rabenseifner_all_reduce",
    "bruck": "pycollectives.schedule.examples.bruck:bruck_all_gather",
    "double_tree": "pycollectives.schedule.examples.double_tree:double_tree_all_reduce",
    "double_tree_broadcast": "pycollectives.schedule.examples.double_tree:double_tree_broadcast",
    "binomial_reduce": "pycollectives.schedule.examples.binomial:binomial_reduce",
    "hierarchical": "pycollectives.schedule.examples.hierarchical:hierarchical_all_reduce",
    "direct_all_to_all": "pycollectives.schedule.examples.direct:direct_all_to_all",
}

# Where a short example name is also a built-in algorithm's (PYCOLL_ALGO=ring is the built-in
# ring), the example is forced by its long name.
ALIASES = {"ring_all_reduce": "ring", "hierarchical_all_reduce": "hierarchical"}

_lock = threading.RLock()
_factories: Dict[str, Callable] = {}
_built: Dict[Tuple[str, int], IR] = {}


def _builtin_names() -> Tuple[str, ...]:
    try:
        from ..config import ALGORITHMS
    except Exception:  # the extension is not built: nothing to clash with
        return ()
    return tuple(ALGORITHMS)


def _build(name: str, factory: Callable, ranks: int) -> IR:
    from .language import Program

    try:
        built = factory(ranks)
    except ScheduleError as e:
        raise ScheduleError(f"algorithm {name!r} at {ranks} ranks: {e}") from None
    if isinstance(built, Program):
        built = built.lower()
    if not isinstance(built, IR):
        raise ScheduleError(f"algorithm {name!r}: the factory returned {type(built).__name__}, not a Program")
    return built


def register_algorithm(name: str, program_factory: Callable, *, ranks: Iterable[int] = (2, 3, 4, 8)) -> None:
    """Checks `program_factory(n)` for every n in `ranks` and registers it as `name`.

    Raises ScheduleError (naming the rank count) if a program is wrong, ValueError if the name
    is taken by a built-in algorithm or by another factory."""
    if not isinstance(name, str) or not name or name.strip() != name:
        raise ValueError(f"an algorithm name is a non-empty string without spaces, not {name!r}")
    if name.lower().replace("-", "").replace("_", "") in _builtin_names():
        raise ValueError(f"{name!r} is a built-in algorithm")
    if not callable(program_factory):
        raise ValueError(f"program_factory must be callable, not {program_factory!r}")
    built = {}
    for n in ranks:
        ir = _build(name, program_factory, n)
        try:
            check(ir, ranks=n)
        except ScheduleError as e:
            raise ScheduleError(f"algorithm {name!r} at {n} ranks: {e}") from None
        built[(name, n)] = ir
    with _lock:
        old = _factories.get(name)
        if old is not None and old is not program_factory:
            raise ValueError(f"algorithm {name!r} is already registered (unregister_algorithm first)")
        _factories[name] = program_factory
        _built.update(built)


def unregister_algorithm(name: str) -> None:
    with _lock:
        _factories.pop(name, None)
        for key in [k for k in _built if k[0] == name]:
            del _built[key]
    try:
        from .engine_tables import forget
    except ImportError:  # pragma: no cover - the package without its extension
        return
    forget()


def registered() -> List[str]:
    with _lock:
        return sorted(_factories)


def resolve(name: str) -> Callable:
    """The factory of a registered name, a shipped example or "module:function" (imported now)."""
    with _lock:
        if name in _factories:
            return _factories[name]
    target = EXAMPLES.get(ALIASES.get(name, name), name)
    if ":" not in target:
        raise ScheduleError(f"unknown algorithm {name!r}: not registered, not an example "
                            f"({', '.join(sorted(EXAMPLES))}), and not module:function")
    module, _, attr = target.partition(":")
    try:
        obj = importlib.import_module(module)
    except ImportError as e:
        raise ScheduleError(f"algorithm {name!r}: cannot import {module}: {e}") from None
    for part in attr.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            raise ScheduleError(f"algorithm {name!r}: {module} has no {attr}")
    if not callable(obj):
        raise ScheduleError(f"algorithm {name!r}: {target} is not callable")
    return obj


def lookup(name: str, collective: Optional[str], ranks: int) -> IR:
    """The checked IR of `name` for a group of `ranks` (built, checked and kept on first use;
    a "module:function" name is imported and registered then). Raises ScheduleError when the
    program is wrong, is not of `collective`, or is built for another rank count."""
    with _lock:
        ir = _built.get((name, ranks))
        factory = _factories.get(name)
    if ir is None:
        if factory is None:
            factory = resolve(name)
            register_algorithm(name, factory, ranks=())
        ir = _build(name, factory, ranks)
        check(ir, ranks=ranks)
        with _lock:
            _built[(name, ranks)] = ir
    if collective is not None and ir.collective != collective:
        raise ScheduleError(f"algorithm {name!r} is a schedule of {ir.collective}, but the op is "
                            f"{collective} (wrong collective)")
    return ir
