"""GPU utilization sampled on a thread of its own, every `[daemon].gpu_sample_seconds` (2 s unless set),
only while a run with GPUs is active.

A poll's utilization is the average of its whole window (`probes.gpu`), so the probe must be sampled
often; one NVML read costs ~1 µs, but the same sample as an APScheduler interval job cost its thread,
the scheduler's and the job machinery ~0.3 ms each time: most of a 4-run daemon's CPU (bench/README.md,
Daemon overhead). Here a sample is one wake-up of one thread, on a monotonic schedule that does not
drift (`next += interval`, as nvitop's collector does). Each reading is the driver's own average over
its last sampling period, so a window's mean is an unbiased estimate at any interval; 2 s (nvitop's
default refresh) gives a poll 150 samples in 5 minutes, and a 1-s sampler is the largest single cost of
a daemon babysitting a few GPU runs (bench/README.md, Daemon overhead).

An NVML probe samples on its own NVML worker instead (`sampler_for`, babysit.probes.health): this
thread handing each sample to that worker and waiting for it cost ~5 wake-ups a sample, not one.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

import structlog

log = structlog.get_logger("babysit.service.sampler")


class SamplerLike(Protocol):
    running: bool

    def start(self) -> None: ...
    def stop(self) -> None: ...


def sampler_for(probe: Any, interval: float) -> SamplerLike:
    """The probe's own sampler where it has one (NVML: on its NVML worker, one wake-up a sample,
    babysit.probes.health), else a Sampler thread calling `probe.sample`."""
    own = getattr(probe, "own_sampler", None)
    return own(interval) if own is not None else Sampler(probe.sample, interval)


class Sampler:
    def __init__(self, sample: Callable[[], None], interval: float = 1.0) -> None:
        self.sample = sample
        self.interval = interval
        self._stop: threading.Event | None = None
        self._lock = threading.Lock()

    @property
    def running(self) -> bool:
        return self._stop is not None

    def start(self) -> None:
        with self._lock:
            if self._stop is not None:
                return
            self._stop = stop = threading.Event()
            threading.Thread(target=self._loop, args=(stop,), name="gpu-sampler", daemon=True).start()

    def stop(self) -> None:
        with self._lock:
            if self._stop is not None:
                self._stop.set()
                self._stop = None

    def _loop(self, stop: threading.Event) -> None:
        next_at = time.monotonic()
        while True:
            next_at += self.interval
            if stop.wait(max(0.0, next_at - time.monotonic())):
                return
            try:
                self.sample()
            except Exception:  # a probe bug never stops sampling: the next second tries again
                log.exception("GPU sample failed")
            if time.monotonic() - next_at > 10 * self.interval:
                next_at = time.monotonic()  # the machine slept: no burst of catch-up samples
