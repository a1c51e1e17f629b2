"""The flight recorder's Python side: dumping on demand, and reading the dumps of a job.

``dump()`` writes this process's ring of recent ops (docs/tracing.md); ``load_dumps``,
``analyze`` and ``timeline`` read a folder of them (also ``pycoll-trace analyze|timeline DIR``).
"""
from __future__ import annotations

from .analyze import Problem, Report, analyze
from .load import RankDump, load_dumps
from .timeline import timeline

__all__ = ["dump", "load_dumps", "analyze", "timeline", "Report", "Problem", "RankDump"]


def dump(path_prefix: str | None = None, reason: str = "on demand") -> str:
    """Writes this process's flight-recorder ring to ``path_prefix`` + its global rank and returns
    the path. ``path_prefix`` None: TORCH_FR_DUMP_TEMP_FILE, else /tmp/pycoll_trace_rank_."""
    from .. import _C

    fn = getattr(_C, "flight_recorder_dump", None)
    if fn is None:
        raise RuntimeError("pycollectives.trace.dump: this build of the extension has no flight recorder "
                           "(pycollectives._C.flight_recorder_dump is missing); rebuild it with `make install`")
    return fn(path_prefix or "", reason)
