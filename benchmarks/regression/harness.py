"""Where the regression benchmarks find their code.

Two trees meet in one measurement: the *library under test* (``import pycollectives``: the working
tree, or the BASE build of ``make bench-compare``) and the *harness* (how buffers are made and
calls are timed: always the working tree's ``pycollectives/bench``, so that both builds are timed
the same way). The harness package is loaded under its own name, ``pycoll_harness``, from a path,
so that it never mixes with the library's own copy.
"""
import importlib.util
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO_ROOT = os.path.dirname(os.path.dirname(HERE))
HARNESS_NAME = "pycoll_harness"


def load_harness(repo_root=REPO_ROOT):
    """The working tree's ``pycollectives/bench`` package as ``pycoll_harness`` (ops, timing)."""
    if HARNESS_NAME in sys.modules:
        return sys.modules[HARNESS_NAME]
    pkg_dir = os.path.join(repo_root, "pycollectives", "bench")
    spec = importlib.util.spec_from_file_location(
        HARNESS_NAME, os.path.join(pkg_dir, "__init__.py"), submodule_search_locations=[pkg_dir])
    module = importlib.util.module_from_spec(spec)
    sys.modules[HARNESS_NAME] = module
    spec.loader.exec_module(module)
    for sub in ("ops", "timing"):
        importlib.import_module(f"{HARNESS_NAME}.{sub}")
    return module
