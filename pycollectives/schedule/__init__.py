"""Collective algorithms as schedules: write one in Python (`Program`), check it before it runs
(`check`), run it on tensors in one process (`interpret`), time it on paper at any scale
(`simulate`), and register it by name (`register_algorithm`). See docs/schedules.md."""
from .check import check, render
from .errors import ScheduleError
from .ir import IR, Step
from .language import Program, Ref

__all__ = ["Program", "Ref", "IR", "Step", "check", "render", "ScheduleError"]
from .interpret import interpret
from .registry import lookup, register_algorithm, registered, unregister_algorithm
from .simulate import Link, Topology, simulate

__all__ += ["interpret", "lookup", "register_algorithm", "registered", "unregister_algorithm",
            "simulate", "Link", "Topology"]
