"""A trainer whose records come in bursts further apart than half the stall limit, its first one included (a
framework that logs or flushes every few minutes): babysit neither stops it as stalled nor calls its source
unreadable, and its s/step is the trainer's true rate, not the burst's."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.scenarios.conftest import PY, Daemon, store_of
from tests.support import register, run_toml, stdout_source

pytestmark = pytest.mark.slow  # three bursts 5 s apart: 16 s of a worker, waiting

STALL_MINUTES = 8  # 8 s under --accelerated
GAP = 5.0  # seconds between two bursts: more than half the stall limit, less than all of it
PER_BURST = 5
BURSTS = 3

TRAINER = f"""
import time
print("loading data", flush=True)  # a banner, then nothing for {GAP} s
for burst in range({BURSTS}):
    time.sleep({GAP})
    for i in range({PER_BURST}):
        step = burst * {PER_BURST} + i + 1
        print(f"iter {{step}}: loss {{1 / step:.4f}}", flush=True)
"""


def test_bursts_slower_than_half_the_stall_limit_are_neither_a_stall_nor_an_unreadable_source(
        workspace: Path) -> None:
    register(workspace, run_toml("bursty", [PY, "-c", TRAINER], run={"total_steps": BURSTS * PER_BURST},
                                 source=stdout_source(r"iter (?P<step>\d+): loss (?P<loss>\S+)"), poll=(1, 1),
                                 guards={"min_free_host_ram_gib": 0.1, "stall_minutes": STALL_MINUTES,
                                         "stop_grace_seconds": 10}))
    daemon = Daemon(workspace, "--exit-when-idle", "--no-view", "--gpu-probe", "none")
    assert daemon.wait(timeout=120) == 0, daemon.output()

    store = store_of(workspace)
    (attempt,) = store.attempts("bursty")
    assert attempt.outcome == "completed", attempt.detail
    # before the fix: log-unreadable at half the stall limit after launch, with the banner as the only output
    alarms = [(i.kind, i.body) for i in store.incidents("bursty") if i.kind in ("stalled", "log-unreadable")]
    assert not alarms, alarms
    polls = [p.snapshot for p in store.polls("bursty", 200)]
    quiet = [p.seconds_since_last_record for p in polls if p.seconds_since_last_record is not None]
    assert max(quiet) > STALL_MINUTES / 2, quiet  # the premise: babysit saw it quiet that long (real seconds)
    paced = [p.seconds_per_step for p in polls if p.seconds_per_step]
    assert paced and all(abs(sps / (GAP / PER_BURST) - 1) <= 0.2 for sps in paced), paced
