"""Bruck's all_gather: ceil(log2 N) steps for any N. Before the step of distance k, rank r holds
the blocks of ranks r .. r+k-1; it sends the first min(k, N-k) of them to rank r-k. Blocks stay
at their final places in the output, so no rotation is needed at the end."""
from pycollectives.schedule import Program


def bruck_all_gather(n, chunks=1):
    p = Program("bruck_all_gather", "all_gather", ranks=n, chunks=chunks)
    for r in range(n):
        p.copy(p.input(r, 0, chunks), p.output(r, r * chunks, chunks))
    k = 1
    while k < n:
        count = min(k, n - k)
        for r in range(n):
            first = r
            while count and first < r + count:                # blocks r .. r+count-1, mod n
                start = first % n
                length = min(r + count - first, n - start)
                p.copy(p.output(r, start * chunks, length * chunks),
                       p.output((r - k) % n, start * chunks, length * chunks))
                first += length
        k *= 2
    return p
