"""Double binary trees: the data in two halves, each reduced up and broadcast down its own
balanced binary tree on its own lane; the second tree is the first mirrored, so that most ranks
that are leaves in one are inner nodes in the other. Pipelined over `pieces`: a leaf sends piece 1
while its parent still forwards piece 0."""
from pycollectives.schedule import Program


def _tree(lo, hi, parent, out):
    """In-order balanced binary tree on positions lo..hi: appends (node, parent) in pre-order."""
    if lo > hi:
        return
    mid = (lo + hi) // 2
    out.append((mid, parent))
    _tree(lo, mid - 1, mid, out)
    _tree(mid + 1, hi, mid, out)


def _trees(n, root):
    """Two trees as (rank, parent rank) in pre-order, both rooted at `root`."""
    order = []
    _tree(0, n - 1, None, order)
    top = order[0][0]
    trees = []
    for sign in (1, -1):
        rank = lambda pos, sign=sign: (root + sign * (pos - top)) % n
        trees.append([(rank(a), None if b is None else rank(b)) for a, b in order])
    return trees


def double_tree_all_reduce(n, pieces=1):
    p = Program("double_tree_all_reduce", "all_reduce", ranks=n, chunks=2, inplace=True)
    trees = _trees(n, 0 if n == 1 else n // 2)
    with p.pipelined(pieces):
        for t, tree in enumerate(trees):
            for node, parent in reversed(tree):            # children before parents: reduce up
                if parent is not None:
                    p.reduce(p.input(node, t), p.input(parent, t), lane=t)
            for node, parent in tree:                      # parents before children: broadcast down
                if parent is not None:
                    p.copy(p.input(parent, t), p.input(node, t), lane=t)
    return p


def double_tree_broadcast(n, root=0, pieces=1):
    p = Program("double_tree_broadcast", "broadcast", ranks=n, chunks=2, root=root, inplace=True)
    with p.pipelined(pieces):
        for t, tree in enumerate(_trees(n, root)):
            for node, parent in tree:
                if parent is not None:
                    p.copy(p.input(parent, t), p.input(node, t), lane=t)
    return p
