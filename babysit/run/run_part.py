"""What every part of a run's supervisor (run_launch, run_exit, run_guard, run_stop) reads of its run and
the two ways a part acts through it: an event fed to the run's transition, a call scheduled for later.
Each part's own Protocol extends this one with what only that part needs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from babysit.core import run_events as ev
from babysit.core.spec.run_toml import RunSpec
from babysit.executors import Executor
from babysit.run.context import DaemonContext


class RunPartHost(Protocol):
    """The run as its parts see it (`babysit.run.supervisor.RunSupervisor`)."""

    run: str
    spec: RunSpec
    ctx: DaemonContext
    executor: Executor

    def feed(self, event: ev.Event, *, defer: tuple[type, ...] = ()) -> str | None: ...
    def later(self, key: str, delay: float, fn: Callable[[], None], where: str) -> None: ...
