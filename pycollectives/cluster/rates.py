"""Link rates as tc writes them: "100mbit", "1gbit", "2.5gbit" (bits per second)."""
from __future__ import annotations

import re

_UNITS = {"bit": 1, "kbit": 10**3, "mbit": 10**6, "gbit": 10**9, "tbit": 10**12}


def parse_rate(text: str) -> int:
    """Bits per second of '1gbit', '100mbit', '2.5gbit', '1Gbit/s' or a plain number of bit/s."""
    t = str(text).strip().lower().replace(" ", "")
    if t.endswith("/s"):
        t = t[:-2]
    if t.endswith("bps"):  # 1gbps -> 1gbit
        t = t[:-3] + "bit"
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([kmgt]?bit)?", t)
    if not m:
        raise ValueError(f"link rate {text!r}: expected a number and a unit, e.g. 100mbit, 1gbit, 10gbit")
    value = float(m.group(1)) * _UNITS[m.group(2) or "bit"]
    if value < 8000:
        raise ValueError(f"link rate {text!r}: below 8kbit, tc cannot shape it")
    return int(round(value))


def format_rate(bps: float) -> str:
    """The shortest exact tc spelling: 1000000000 -> '1gbit', 2500000000 -> '2500mbit'."""
    bps = int(round(bps))
    for unit, scale in (("tbit", 10**12), ("gbit", 10**9), ("mbit", 10**6), ("kbit", 10**3)):
        if bps % scale == 0:
            return f"{bps // scale}{unit}"
    return f"{bps}bit"


def canonical(text: str) -> str:
    """One spelling per rate, so that '1000mbit' and '1gbit' key the same calibration."""
    return format_rate(parse_rate(text))


def human(bps: float) -> str:
    """'941 Mbit/s', '6.31 Gbit/s'."""
    if bps >= 10**9:
        return f"{bps / 1e9:.2f} Gbit/s"
    if bps >= 10**6:
        return f"{bps / 1e6:.0f} Mbit/s"
    return f"{bps / 1e3:.0f} kbit/s"
