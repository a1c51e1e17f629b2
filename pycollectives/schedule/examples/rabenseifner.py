"""Rabenseifner's all_reduce: a reduce-scatter by recursive halving, then an all-gather by
recursive doubling, over the largest power of two m <= N ranks: 2 log2(m) steps, each rank
sending 2(m-1)/m of the data. The N - m other ranks first fold their data into rank r - m and
get the result back at the end."""
from pycollectives.schedule import Program


def rabenseifner_all_reduce(n, pieces=1):
    m = 1
    while m * 2 <= n:
        m *= 2
    p = Program("rabenseifner_all_reduce", "all_reduce", ranks=n, chunks=m, inplace=True)
    with p.pipelined(pieces):
        for r in range(m, n):                                   # fold the extra ranks in
            p.reduce(p.input(r, 0, m), p.input(r - m, 0, m))
        lo, hi = [0] * m, [m] * m                               # the range each rank still reduces
        d = m // 2
        while d >= 1:                                           # recursive halving
            for r in range(m):
                mid = (lo[r] + hi[r]) // 2
                give = (lo[r], mid) if r & d else (mid, hi[r])  # keep the half this bit names
                p.reduce(p.input(r, give[0], give[1] - give[0]), p.input(r ^ d, give[0], give[1] - give[0]))
            for r in range(m):
                mid = (lo[r] + hi[r]) // 2
                lo[r], hi[r] = (mid, hi[r]) if r & d else (lo[r], mid)
            d //= 2
        d = 1
        while d < m:                                            # recursive doubling
            for r in range(m):
                p.copy(p.input(r, lo[r], hi[r] - lo[r]), p.input(r ^ d, lo[r], hi[r] - lo[r]))
            for r in range(m):
                lo[r], hi[r] = min(lo[r], lo[r ^ d]), max(hi[r], hi[r ^ d])
            d *= 2
        for r in range(m, n):                                   # and back out
            p.copy(p.input(r - m, 0, m), p.input(r, 0, m))
    return p
