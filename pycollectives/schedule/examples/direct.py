"""Direct all_to_all: every rank sends block q of its input straight to rank q, on lane
q % lanes, starting with its right neighbour so that not every rank sends to rank 0 first."""
from pycollectives.schedule import Program


def direct_all_to_all(n, lanes=2):
    p = Program("direct_all_to_all", "all_to_all", ranks=n, chunks=1)
    for shift in range(n):
        for r in range(n):
            q = (r + shift) % n
            p.copy(p.input(r, q), p.output(q, r), lane=q % lanes)
    return p
