"""The package's own ``PYCOLL_*`` settings: those that Python code reads and the extension does not.

The extension's settings are declared in C++ (``csrc/common/setting.h``); these are declared
here, once, and read only through ``get()`` (``pycollectives.settings`` lists both kinds and
reads either by name). No other module of the package reads a ``PYCOLL_*`` variable itself
(tests/test_settings.py checks the tree).
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Tuple


@dataclass(frozen=True)
class PackageSetting:
    name: str
    default: str  # the default as the docs print it
    range: str
    doc: str
    audience: str = "user"  # "user" or "developer", as for the extension's settings
    ranks_agree: bool = False
    fallback: str = ""  # get()'s value when the variable is unset or empty
    choices: Tuple[str, ...] = ()  # the values accepted; empty: any text

    def info(self) -> dict:
        return {"name": self.name, "default": self.default, "range": self.range, "doc": self.doc,
                "scope": "python package", "ranks_agree": self.ranks_agree, "audience": self.audience}

    def get(self) -> str:
        """The variable's value now, or the fallback when unset or empty; a value outside the
        choices raises ValueError naming the setting and what it accepts."""
        value = os.environ.get(self.name, "")
        if value == "":
            return self.fallback
        if self.choices and value not in self.choices:
            raise ValueError(f"pycoll: {self.name}={value} is not valid: it must be one of {', '.join(self.choices)}")
        return value


COST_MODEL = PackageSetting(
    "PYCOLL_COST_MODEL", "this user's cache (pycollectives.cache)", "a path",
    "The pycoll-bench --calibrate file that auto follows (CPU: alpha-beta constants; CUDA: measured "
    "per-size winners). PYCOLL_DEBUG=INFO names the file in use.", ranks_agree=True)

HOSTID = PackageSetting(
    "PYCOLL_HOSTID", "the hostname and the kernel's boot id", "any text",
    "This process's host identity when a group is made (as NCCL_HOSTID): ranks with the same one are on one host. "
    "Set it to simulate hosts on one machine.", audience="developer")

COMPRESSION_NATIVE = PackageSetting(
    "PYCOLL_COMPRESSION_NATIVE", "1", "0, 1",
    "0: the compression hooks run their plain torch reference kernels instead of the extension's "
    "(to compare, or to rule the kernels out).", audience="developer", fallback="1", choices=("0", "1"))

LINK = PackageSetting(
    "PYCOLL_LINK", "none (no table of forms keyed by a link)", "a rate as tc writes it: 100mbit, 1gbit, 10gbit",
    "The rate of the links between hosts. It keys the tables of forms across hosts that pycoll-bench --calibrate "
    "writes and that auto follows, so calibrations on different links do not overwrite each other; at 1gbit or "
    "less the hierarchical CPU all_reduce, reduce_scatter and all_gather run in pieces (PYCOLL_HOST_PIECE_BYTES). "
    "pycoll-cluster sets it in every rank; on a real cluster, set it to the rate of its links.",
    audience="developer", ranks_agree=True)

LINK_MEASURED = PackageSetting(
    "PYCOLL_LINK_MEASURED", "none", "bits per second",
    "The TCP rate pycoll-cluster measured between two of its hosts before the ranks started (set by "
    "pycoll-cluster in every rank); pycoll-bench prints it beside its table and stores it in the result.",
    audience="developer")

PACKAGE_SETTINGS = (COST_MODEL, HOSTID, COMPRESSION_NATIVE, LINK, LINK_MEASURED)
_BY_NAME = {s.name: s for s in PACKAGE_SETTINGS}


def find(name: str):
    """The package setting called `name`, or None (then it is the extension's, or unknown)."""
    return _BY_NAME.get(name)
