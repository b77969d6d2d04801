"""How babysit writes numbers for people: one module, so the console, Slack and the CLI agree.

`MISSING` is the one spelling of a value not known ("—"), wherever it is shown.
"""

from __future__ import annotations

from fractions import Fraction

MISSING = "—"
GIB = 2**30


def gib(n: int | float) -> str:
    return f"{n / GIB:.2f} GiB"


def fmt_gib(n: float | None) -> str:
    return MISSING if n is None else f"{n / GIB:.1f} GiB"


def hours(x: float) -> str:
    """GPU-hours to enough digits to tell used from cap: 0.0061, 0.42, 3.14, 12.3."""
    if x == 0:
        return "0"
    if abs(x) >= 10:
        return f"{x:.1f}"
    if abs(x) >= 1:
        return f"{x:.2f}"
    return f"{x:.2g}"


def fmt_duration(seconds: float | None) -> str:
    if seconds is None:
        return MISSING
    seconds = round(seconds)
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    if h:
        return f"{h}h{m:02d}m"
    if m:
        return f"{m}m{s:02d}s"
    return f"{s}s"


def fmt_delta(value: float | Fraction | None, precision: int = 4) -> str:
    return MISSING if value is None else f"{float(value):+.{precision}f}"


def fmt_rise(rise: bool | None) -> str:
    return MISSING if rise is None else "yes" if rise else "no"
