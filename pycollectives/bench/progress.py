"""Progress on stderr (rank 0 only): tqdm when installed and stderr is a terminal, else a
small bar of our own, which redraws in place on a terminal and prints a line every 10% into a
file or pipe."""
import sys
import time


class _NullBar:
    def update(self, n=1, desc=None):
        pass

    def close(self):
        pass


class _SimpleBar:
    def __init__(self, total, stream):
        self.total = max(1, total)
        self.done = 0
        self.stream = stream
        self.tty = hasattr(stream, "isatty") and stream.isatty()
        self.t0 = time.monotonic()
        self.last_draw = 0.0
        self.last_decile = -1
        self.desc = ""

    def update(self, n=1, desc=None):
        self.done = min(self.total, self.done + n)
        if desc is not None:
            self.desc = desc
        now = time.monotonic()
        if self.tty:
            if now - self.last_draw >= 0.1 or self.done == self.total:
                self.last_draw = now
                width = 30
                fill = width * self.done // self.total
                bar = "#" * fill + "." * (width - fill)
                self.stream.write(f"\r[{bar}] {self.done}/{self.total} {now - self.t0:5.1f}s {self.desc:<32.32}")
                self.stream.flush()
        else:
            decile = 10 * self.done // self.total
            if decile != self.last_decile:
                self.last_decile = decile
                self.stream.write(f"pycoll-bench: {100 * self.done // self.total:3d}% "
                                  f"({self.done}/{self.total}, {now - self.t0:.1f}s) {self.desc}\n")
                self.stream.flush()

    def close(self):
        if self.tty:
            self.stream.write("\n")
            self.stream.flush()


class _TqdmBar:
    def __init__(self, total, stream):
        from tqdm import tqdm
        self.bar = tqdm(total=total, file=stream, unit="meas", dynamic_ncols=True, leave=False)

    def update(self, n=1, desc=None):
        if desc is not None:
            self.bar.set_description_str(desc, refresh=False)
        self.bar.update(n)

    def close(self):
        self.bar.close()


def make_progress(total, enabled=True, stream=None):
    """tqdm on a terminal when it is installed; our bar otherwise (and always into a log file,
    where tqdm's redraws would pile up)."""
    stream = stream or sys.stderr
    if not enabled:
        return _NullBar()
    if hasattr(stream, "isatty") and stream.isatty():
        try:
            return _TqdmBar(total, stream)
        except ImportError:
            pass
    return _SimpleBar(total, stream)
