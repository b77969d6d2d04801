"""A metronome for the tiny trainers babysit launches in the end-to-end tests (no framework imported here).

A tiny model on two shared cores trains at whatever speed the machine's load allows; paced by a
metronome, every step lasts `seconds` (the step's own work included, no catching up after a slow one),
so a test knows the rate the trainer really ran at and how far apart its logs are. `times` gets one
line per step, `<step> <unix time>`, written by the framework's own step-end hook: the framework's
timing that babysit's s/step is checked against.
"""

from __future__ import annotations

import time
from pathlib import Path


class Metronome:
    def __init__(self, seconds: float, times: str | None = None) -> None:
        self.seconds = seconds
        self.times = Path(times) if times else None
        if self.times is not None:
            self.times.parent.mkdir(parents=True, exist_ok=True)
        self._next: float | None = None

    def start(self) -> None:
        self._next = time.monotonic()

    def step_end(self, step: int) -> None:
        if self.seconds > 0:
            now = time.monotonic()
            self._next = (now if self._next is None else self._next) + self.seconds
            if self._next > now:
                time.sleep(self._next - now)
            else:
                self._next = now  # behind: this step took longer than the beat; no burst to catch up
        if self.times is not None:
            with self.times.open("a") as f:
                f.write(f"{step} {time.time():.6f}\n")


def read_times(path: Path) -> dict[int, float]:
    """`times` as {step: unix time}."""
    out = {}
    for line in path.read_text().splitlines():
        step, ts = line.split()
        out[int(step)] = float(ts)
    return out


def seconds_per_step(times: dict[int, float], first: int | None = None, last: int | None = None) -> float:
    """The framework's own rate between two steps (default: the first and last it timed)."""
    first = min(times) if first is None else first
    last = max(times) if last is None else last
    return (times[last] - times[first]) / (last - first)
