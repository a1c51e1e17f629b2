"""Ring schedules: all_reduce (reduce-scatter then all-gather around the ring, 2(N-1) steps, each
rank sending 2(N-1)/N of the data), and its two halves as collectives of their own. Each step of
the ring is written for all ranks at once (arrays of ranks and chunks): N messages per call."""
import numpy as np

from pycollectives.schedule import Program


def ring_all_reduce(n, pieces=1):
    """Chunk c ends up reduced on rank c-1 after N-1 steps, then travels once around the ring."""
    p = Program("ring_all_reduce", "all_reduce", ranks=n, chunks=n, inplace=True)
    r = np.arange(n)                                 # every rank at once
    with p.pipelined(pieces):
        for step in range(n - 1):                    # reduce-scatter
            c = (r - step) % n
            p.reduce(p.input(r, c), p.input((r + 1) % n, c))
        for step in range(n - 1):                    # all-gather
            c = (r + 1 - step) % n
            p.copy(p.input(r, c), p.input((r + 1) % n, c))
    return p


def ring_reduce_scatter(n, pieces=1):
    """Rank r's output chunk is block r of every rank's input, reduced."""
    p = Program("ring_reduce_scatter", "reduce_scatter", ranks=n, chunks=1, inplace=True)
    r = np.arange(n)
    with p.pipelined(pieces):
        for step in range(n - 1):
            c = (r - step - 1) % n  # ends on rank c after n - 1 hops
            p.reduce(p.input(r, c), p.input((r + 1) % n, c))
    return p


def ring_all_gather(n, pieces=1):
    """Each rank's block travels n - 1 hops around the ring."""
    p = Program("ring_all_gather", "all_gather", ranks=n, chunks=1, inplace=True)
    r = np.arange(n)
    with p.pipelined(pieces):
        for step in range(n - 1):
            c = (r - step) % n
            p.copy(p.output(r, c), p.output((r + 1) % n, c))
    return p
