"""pycoll-bench: the benchmark CLI of pycollectives (``pycoll-bench`` or
``python -m pycollectives.bench``).  See benchmarks/README.md."""


def main(argv=None):
    from .cli import main as _main
    return _main(argv)


__all__ = ["main"]
