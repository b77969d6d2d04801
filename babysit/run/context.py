"""What a run's parts are given: the daemon's `DaemonContext`, which every supervisor shares (the store, the
executors, the clock, the probes, the timers later actions go through, the one exit-watcher thread, the
reader thread and the poll calendar), and `RunHost`, the run they belong to. Tests build a context with
stand-ins (tests/test_supervisor_inprocess.py); the daemon builds the real one.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from babysit.core import run_events as ev
from babysit.core.run_machine import RunState
from babysit.core.spec.run_toml import RunSpec
from babysit.db.store import Attempt, Store
from babysit.executors import Executor
from babysit.probes.gpu import GpuProbe
from babysit.probes.host import HostProbe, ProcHostProbe
from babysit.run.log_chunks import ReadWorker
from babysit.run.polling import PollCalendar
from babysit.run.run_posts import RunPosts
from babysit.run.run_verdict import RunVerdicts
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


class RunHost(Protocol):
    """The run as its parts see it (`babysit.run.supervisor.RunSupervisor`): its state, read by every part,
    and the ways a part acts through it. A Protocol rather than the class because the supervisor builds
    its parts: a part importing the supervisor would close an import circle. A part that needs another
    (the observer needs the log) is handed it when it is built."""

    run: str
    spec: RunSpec  # the attempt's: `use_gpus` swaps a quarantined GPU out of it
    declared_gpus: tuple[int, ...]
    ctx: DaemonContext
    executor: Executor
    lock: threading.RLock
    attempt: Attempt | None  # the current attempt's row
    state: RunState  # the run's machine state, the one the parts read
    launch_msg: int | None
    posts: RunPosts
    verdicts: RunVerdicts

    def is_running(self) -> bool: ...
    def feed(self, event: ev.Event, *, defer: tuple[type, ...] = ()) -> str | None: ...
    def later(self, key: str, delay: float, fn: Callable[[], None], where: str) -> None: ...
    def message(self, kind: str, payload: dict[str, Any], key: str, thread: bool = True) -> int | None: ...
    def incident(self, kind: str, message: str, detail: dict[str, Any], key: str) -> None: ...
    def failed(self, where: str, exc: BaseException) -> None: ...
    def internal_error(self, where: str, exc: BaseException) -> None: ...
    def use_gpus(self, gpus: Any) -> None: ...
    def read_state(self) -> None: ...
