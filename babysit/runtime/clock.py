"""The daemon's clock, injected: wall time for what is recorded, a monotonic one for what is measured.

Tests pass a fake (tests/fakes.py) so a supervisor can be driven through hours of declared time in
microseconds; everything else takes `SYSTEM`.
"""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    def time(self) -> float:
        """Seconds since the epoch: what the store records (launches, polls, stops)."""

    def monotonic(self) -> float:
        """Seconds that never jump back: what rates and deadlines are measured with."""


class SystemClock:
    def time(self) -> float:
        return time.time()

    def monotonic(self) -> float:
        return time.monotonic()


SYSTEM = SystemClock()
