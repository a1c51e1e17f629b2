"""The ``options`` a pycoll backend shows torch: what ``split_group`` copies for the child.

torch 2.11's ``split_group`` reads ``parent_backend.options`` and deep-copies it (torch 2.14 only
reads it when the caller passes none). ``c10d::Backend::Options`` cannot be pickled, so
``copy.deepcopy`` fails on it; this subclass copies its fields instead. The fields come from the
backend's ``getBackendOptions`` (csrc/backend/split.cpp).
"""
from __future__ import annotations

from torch._C._distributed_c10d import Backend


class PycollOptions(Backend.Options):
    """Backend.Options that ``copy.deepcopy`` can copy."""

    @classmethod
    def copy_of(cls, source) -> "PycollOptions":
        copied = cls(source.backend, source._timeout)
        copied.group_name = source.group_name
        copied.global_ranks_in_group = list(source.global_ranks_in_group)
        return copied

    def __deepcopy__(self, memo):
        return PycollOptions.copy_of(self)


def backend_options(backend) -> PycollOptions:
    """The ``options`` property of ProcessGroupPycoll: a fresh copy each time (the caller may edit it)."""
    return PycollOptions.copy_of(backend._backend_options())
