"""A 2-D (hierarchical) all_reduce for H hosts of G ranks (rank h*G + l): a ring reduce-scatter
inside each host leaves local rank l with group l (H chunks) reduced over its host; a ring
all_reduce of group l among the ranks with local index l on every host (lane 1, the network)
completes it; a ring all-gather inside each host spreads the groups. Only 2(H-1) of the steps
cross hosts, with 1/G of the data."""
from pycollectives.schedule import Program


def _default_per_host(n):
    g = 1
    while g * g < n:
        g += 1
    while n % g:
        g += 1
    return g


def hierarchical_all_reduce(n, per_host=None, pieces=1):
    G = per_host or _default_per_host(n)
    if n % G:
        raise ValueError(f"{n} ranks are not hosts of {G}")
    H = n // G
    p = Program("hierarchical_all_reduce", "all_reduce", ranks=n, chunks=G * H, inplace=True)
    group = lambda r, g: p.input(r, g * H, H)
    with p.pipelined(pieces):
        for step in range(G - 1):                               # reduce-scatter in every host
            for h in range(H):
                for l in range(G):
                    g = (l - step - 1) % G
                    p.reduce(group(h * G + l, g), group(h * G + (l + 1) % G, g))
        for step in range(H - 1):                               # all_reduce across hosts: reduce-scatter
            for l in range(G):
                for h in range(H):
                    c = l * H + (h - step) % H
                    p.reduce(p.input(h * G + l, c), p.input((h + 1) % H * G + l, c), lane=1)
        for step in range(H - 1):                               # ... and all-gather
            for l in range(G):
                for h in range(H):
                    c = l * H + (h + 1 - step) % H
                    p.copy(p.input(h * G + l, c), p.input((h + 1) % H * G + l, c), lane=1)
        for step in range(G - 1):                               # all-gather in every host
            for h in range(H):
                for l in range(G):
                    g = (l - step) % G
                    p.copy(group(h * G + l, g), group(h * G + (l + 1) % G, g))
    return p
