"""The GPU sampler thread: samples at its interval on a schedule that does not drift, survives a failing
sample, and stops at once."""

from __future__ import annotations

import threading
import time

from babysit.service.sampler import Sampler


def test_samples_come_at_the_interval_and_stop_with_the_sampler() -> None:
    times: list[float] = []
    got_five = threading.Event()

    def sample() -> None:
        times.append(time.monotonic())
        if len(times) == 5:
            got_five.set()

    sampler = Sampler(sample, interval=0.05)
    started = time.monotonic()
    sampler.start()
    sampler.start()  # a second start is the same sampler, not a second thread
    assert got_five.wait(10)
    sampler.stop()
    assert not sampler.running
    stopped_with = len(times)
    time.sleep(0.2)
    assert len(times) <= stopped_with + 1  # at most the sample in flight when stop() was called
    # on schedule, never ahead of it: the k-th sample no earlier than k intervals after the start
    assert all(t - started >= (k + 1) * 0.05 - 0.005 for k, t in enumerate(times)), times
    assert len([t for t in threading.enumerate() if t.name == "gpu-sampler" and t.is_alive()]) <= 1


def test_a_failing_sample_does_not_stop_sampling() -> None:
    calls = []
    done = threading.Event()

    def sample() -> None:
        calls.append(1)
        if len(calls) >= 3:
            done.set()
        raise RuntimeError("driver hiccup")

    sampler = Sampler(sample, interval=0.02)
    sampler.start()
    try:
        assert done.wait(10)
    finally:
        sampler.stop()
