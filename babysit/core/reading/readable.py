"""When a source that yields no record is called unreadable: one rule, pure.

A trainer prints a preamble before its first record, and it can be long: nanoGPT prints ~55 lines
(the config file it was given, "found vocab_size", the parameter counts, "using fused AdamW", "compiling
the model…") and then compiles for a minute; Hugging Face prints config dumps and warnings by the
hundred. So babysit raises `log-unreadable` only when BOTH have passed since the attempt's first line
of output: `MIN_LINES` lines without a record and `MIN_MINUTES` declared minutes. The incident says how
long it waited (real time) and how many lines it saw.
"""

from __future__ import annotations

from dataclasses import dataclass

from babysit.core.fmt import fmt_duration

MIN_LINES = 100  # lines of output without one record (a long preamble is a few dozen to a few hundred)
MIN_MINUTES = 5.0  # declared minutes since the first line of output (nanoGPT's compile takes about one)


@dataclass(frozen=True)
class Waited:
    """What babysit saw before judging: lines of output with no record, real seconds since the first."""

    lines: int | None  # None: the source does not count them
    seconds: float

    def phrase(self) -> str:
        saw = "" if self.lines is None else f" and saw {self.lines} lines"
        return f"babysit waited {fmt_duration(self.seconds)} after the first line of output{saw}"


def judge(lines_seen: int | None, seconds_since_first_output: float | None, minute_seconds: float) -> Waited | None:
    """The wait that makes a source with no record unreadable (both thresholds passed), else None.

    `lines_seen` None: the source does not count lines, and time alone decides.
    `seconds_since_first_output` is real seconds (None: no output seen yet); `minute_seconds` is how many
    real seconds a declared minute lasts (60, or 1 under --accelerated)."""
    if seconds_since_first_output is None or (lines_seen is not None and lines_seen < MIN_LINES):
        return None
    if seconds_since_first_output < MIN_MINUTES * minute_seconds:
        return None
    return Waited(lines_seen, seconds_since_first_output)
