"""Byte sizes: parsing ``8``, ``64K``, ``1M``, ``1G`` (binary multiples, as nccl-tests does),
formatting, and the list of sizes a run sweeps (``-b/-e/-f`` or ``-b/-e/-i``)."""
import re

_UNITS = {"": 1, "B": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([KMGT]?)(I?B)?\s*$", re.IGNORECASE)

# A sweep longer than this is almost certainly a typo (e.g. -i 1 over a GiB range).
MAX_SIZES = 4096


def parse_size(text):
    """Bytes in ``text``: an integer with an optional K/M/G/T suffix (powers of 1024;
    ``KB``, ``KiB`` and ``B`` are accepted too).  Raises ValueError on anything else."""
    m = _SIZE_RE.match(str(text))
    if not m:
        raise ValueError(f"invalid size {text!r}: expected bytes with an optional K, M or G suffix, e.g. 8, 64K, 1G")
    number, unit = m.group(1), m.group(2).upper()
    value = float(number) * _UNITS[unit]
    if value != int(value):
        raise ValueError(f"invalid size {text!r}: not a whole number of bytes")
    return int(value)


def format_size(nbytes):
    """Short human form: 8B, 64KiB, 1.5MiB, 1GiB."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale:
            q = nbytes / scale
            return f"{q:.0f}{unit}" if q == int(q) else f"{q:.3g}{unit}"
    return f"{nbytes}B"


def size_range(min_bytes, max_bytes, factor=None, step=None):
    """Sizes from ``min_bytes`` to ``max_bytes`` inclusive, multiplying by ``factor``
    (default 2) or, when ``step`` is given, adding ``step`` bytes each time."""
    if min_bytes < 1:
        raise ValueError("minimum size must be at least 1 byte")
    if max_bytes < min_bytes:
        raise ValueError(f"maximum size {max_bytes} is below minimum size {min_bytes}")
    if step is not None and factor is not None:
        raise ValueError("give either a step factor or a step size, not both")
    if step is None and factor is None:
        factor = 2
    if factor is not None and factor < 2:
        raise ValueError(f"step factor must be an integer >= 2, got {factor}")
    if step is not None and step < 1:
        raise ValueError(f"step size must be at least 1 byte, got {step}")
    sizes = []
    size = min_bytes
    while size <= max_bytes:
        sizes.append(size)
        if len(sizes) > MAX_SIZES:
            raise ValueError(f"more than {MAX_SIZES} sizes in the sweep; use a larger step")
        size = size * factor if factor is not None else size + step
    return sizes
