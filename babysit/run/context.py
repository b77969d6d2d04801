"""What every run's supervisor shares in one daemon, injected: the store, the executors, the clock, the
probes, the timers later actions go through, the one exit-watcher thread, the reader thread and the poll
calendar. Tests build one with stand-ins (tests/test_supervisor_inprocess.py); the daemon builds the real one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from babysit.db.store import Store
from babysit.executors import Executor
from babysit.probes.gpu import GpuProbe
from babysit.probes.host import HostProbe, ProcHostProbe
from babysit.run.polling import PollCalendar
from babysit.run.runreader import ReadWorker
from babysit.runtime.clock import SYSTEM, Clock
from babysit.runtime.exitwatch import ExitWatcher
from babysit.runtime.timers import ThreadTimers, Timers


@dataclass
class DaemonContext:
    """What every supervisor shares, injected: the store, the executors, the clock, the probes, the timers
    its later actions go through and the one thread that watches every attempt's exit."""

    store: Store
    state_dir: Path
    gpu_probe: GpuProbe
    executors: dict[str, Executor]
    scale: float  # seconds per declared minute: 60, or 1 when --accelerated
    default_channel: str | None = None
    clock: Clock = SYSTEM
    host_probe: HostProbe = field(default_factory=ProcHostProbe)
    timers: Timers = field(default_factory=ThreadTimers)  # the daemon's: APScheduler date jobs
    exits: ExitWatcher = field(default_factory=ExitWatcher)
    reads: ReadWorker = field(default_factory=ReadWorker)  # the reader thread: backlogs, off the guard path
    polls: PollCalendar = field(init=False)  # every run's next poll, on one of the timers

    def __post_init__(self) -> None:
        self.polls = PollCalendar(self)

    def now(self) -> float:
        return self.clock.time()
