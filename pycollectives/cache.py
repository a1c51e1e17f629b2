"""Where this user's calibration lives: ``$XDG_CACHE_HOME/pycollectives/cost_model.json``, else
``~/.cache/pycollectives/cost_model.json``.

Never inside the installed package: a file there would change ``auto`` for every user and every
later import without anyone asking for it. No torch or extension import here, so that pycoll-bench
can name the path before the extension is built.
"""
import os

COST_MODEL_FILE = "cost_model.json"


def cache_dir() -> str:
    """This user's pycollectives cache directory (not created here)."""
    base = os.environ.get("XDG_CACHE_HOME", "")
    if not os.path.isabs(base):  # unset, empty or relative: the XDG spec says to ignore it
        base = os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "pycollectives")


def cost_model_path() -> str:
    """The calibration ``import pycollectives`` loads and ``pycoll-bench --calibrate`` writes by default."""
    return os.path.join(cache_dir(), COST_MODEL_FILE)
