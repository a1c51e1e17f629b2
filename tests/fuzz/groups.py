"""The fuzz's process groups: pycoll groups over all ranks and over subsets, each with a Gloo twin
over the same ranks that computes the reference.
"""

import torch.distributed as dist


class Group:
    """A pycoll group and its Gloo twin over the same (global) ranks."""

    def __init__(self, label, members, pg, ref, rank):
        self.label = label
        self.members = list(members)
        self.pg = pg
        self.ref = ref
        self.size = len(self.members)
        self.me = self.members.index(rank) if rank in self.members else -1
        self.member = self.me >= 0

    def g(self, group_rank):
        return self.members[group_rank]

    def __str__(self):
        return f"{self.label}{self.members}"


def make_groups(rank, ws):
    """Every rank creates every group, in the same order."""
    gloo_world = dist.new_group(backend="gloo")
    groups = [Group("world", range(ws), dist.group.WORLD, gloo_world, rank),
              Group("dup", range(ws), dist.new_group(list(range(ws)), backend="pycoll"),
                    gloo_world, rank)]
    subsets = [("sub", list(range(1, ws)))]
    if ws >= 3:
        subsets.append(("pair", [0, ws - 1]))
    for label, members in subsets:
        pg = dist.new_group(members, backend="pycoll")
        ref = dist.new_group(members, backend="gloo")
        groups.append(Group(label, members, pg, ref, rank))
    return groups


GROUP_WEIGHTS = {"world": 45, "dup": 20, "sub": 20, "pair": 15}
