"""Binomial-tree reduce: ceil(log2 N) steps; at distance d, rank root+v (v an odd multiple of d)
reduces its partial result into rank root+v-d."""
from pycollectives.schedule import Program


def binomial_reduce(n, root=0, pieces=1):
    p = Program("binomial_reduce", "reduce", ranks=n, chunks=1, root=root, inplace=True)
    with p.pipelined(pieces):
        d = 1
        while d < n:
            for v in range(d, n, 2 * d):
                p.reduce(p.input((root + v) % n), p.input((root + v - d) % n))
            d *= 2
    return p
