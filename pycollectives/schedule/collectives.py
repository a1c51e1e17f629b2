"""What each collective means, chunk by chunk: the buffers' sizes, which buffers alias when the
op is in place, what every chunk holds at the start and what every output chunk must hold at the end.

A buffer is made of blocks of one rank's message (E elements each), and every block is cut into K
chunks. Inputs and outputs: all_reduce 1 and 1 block, reduce_scatter N and 1, all_gather 1 and N,
broadcast 1 and 1, reduce 1 and 1, all_to_all N and N. A chunk's value, symbolically, is a sorted
tuple of contributions (rank, input chunk): the input chunks it was reduced from, with repeats.
"""
from __future__ import annotations

from typing import Optional, Tuple

from .errors import ScheduleError

COLLECTIVES = ("all_reduce", "reduce_scatter", "all_gather", "broadcast", "reduce", "all_to_all")
REDUCING = frozenset({"all_reduce", "reduce_scatter", "reduce"})
ROOTED = frozenset({"broadcast", "reduce"})
BUFFERS = ("in", "out", "scratch")
BUFFER_NAMES = {"in": "input", "out": "output", "scratch": "scratch"}

_BLOCKS = {  # (input blocks, output blocks) as multiples of 1 or of N
    "all_reduce": (False, False), "reduce_scatter": (True, False), "all_gather": (False, True),
    "broadcast": (False, False), "reduce": (False, False), "all_to_all": (True, True),
}

Value = Tuple[Tuple[int, int], ...]


def validate(collective: str, ranks: int, root: Optional[int], inplace: bool) -> None:
    if collective not in COLLECTIVES:
        raise ScheduleError(f"unknown collective {collective!r}: expected one of {', '.join(COLLECTIVES)}")
    if not isinstance(ranks, int) or ranks < 1:
        raise ScheduleError(f"a program needs at least one rank, not {ranks!r}")
    if collective in ROOTED:
        if root is None or not 0 <= root < ranks:
            raise ScheduleError(f"{collective} needs a root in 0..{ranks - 1}, not {root!r}")
    elif root is not None:
        raise ScheduleError(f"{collective} has no root (root={root!r})")
    if inplace and collective == "all_to_all":
        raise ScheduleError("all_to_all has no in-place form")


def blocks(collective: str, buffer: str, ranks: int) -> int:
    """Blocks (rank messages) in the input or output buffer."""
    many_in, many_out = _BLOCKS[collective]
    return ranks if (many_in if buffer == "in" else many_out) else 1


def buffer_chunks(collective: str, buffer: str, ranks: int, chunks: int, scratch: int) -> int:
    if buffer == "scratch":
        return scratch
    return blocks(collective, buffer, ranks) * chunks


def storage(collective: str, inplace: bool, rank: int, buffer: str, chunk: int, chunks: int) -> Tuple[str, int]:
    """Where (buffer, chunk) of `rank` lives: in place, one of input and output is part of the other."""
    if not inplace:
        return buffer, chunk
    if collective in ("all_reduce", "broadcast", "reduce"):
        return ("in", chunk) if buffer == "out" else (buffer, chunk)
    if collective == "all_gather":
        return ("out", rank * chunks + chunk) if buffer == "in" else (buffer, chunk)
    if collective == "reduce_scatter":
        return ("in", rank * chunks + chunk) if buffer == "out" else (buffer, chunk)
    return buffer, chunk


def initial(collective: str, rank: int, buffer: str, chunk: int) -> Optional[Value]:
    """What the chunk holds before the first step (None: nothing yet). Inputs only."""
    if buffer == "in":
        return ((rank, chunk),)
    return None


def expected(collective: str, ranks: int, root: Optional[int], rank: int, chunk: int,
             chunks: int) -> Optional[Value]:
    """What output chunk `chunk` of `rank` must hold at the end (None: anything)."""
    if collective == "all_reduce":
        return tuple((q, chunk) for q in range(ranks))
    if collective == "reduce_scatter":
        return tuple((q, rank * chunks + chunk) for q in range(ranks))
    if collective == "all_gather":
        return ((chunk // chunks, chunk % chunks),)
    if collective == "broadcast":
        return ((root, chunk),)
    if collective == "reduce":
        return tuple((q, chunk) for q in range(ranks)) if rank == root else None
    if collective == "all_to_all":
        q, j = divmod(chunk, chunks)
        return ((q, rank * chunks + j),)
    raise ScheduleError(f"unknown collective {collective!r}")
