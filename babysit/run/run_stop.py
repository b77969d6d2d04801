"""One run's stop: the stop signal sent (on the asker's thread, outside the run's lock), the SIGKILL armed
for when the grace period is over, and sent only if the machine says so then (`StopGraceOver` -> `Kill`).

The order is the one that survives a daemon's death: the SIGKILL is scheduled first (a stop that fails,
scancel refused, still ends in one), then the signal, then the store says it was sent — a daemon that
died before sending it sends it on adoption, one that died after does not.
"""

from __future__ import annotations

import signal
from typing import Any

import structlog

from babysit.core import run_events as ev
from babysit.db.store import Attempt
from babysit.run.context import RunHost

log = structlog.get_logger("babysit.run.supervisor")


class RunStop:
    def __init__(self, host: RunHost) -> None:
        self.host, self.ctx, self.run, self.executor = host, host.ctx, host.run, host.executor

    def send(self, attempt: Attempt, stop: dict[str, Any], grace: float) -> None:
        """The stop signal now, the SIGKILL after `grace` seconds; then the store says it was sent."""
        self.arm_kill(attempt, grace)
        sent_at = self.ctx.now()  # before the signal: a trainer may save within the same millisecond
        self.executor.stop(attempt, signal.Signals[stop.get("signal") or self.host.spec.stop_signal])
        self.ctx.store.merge_run_facts(self.run, self.ctx.now(), stop={**stop, "sent_at": sent_at})

    def arm_kill(self, attempt: Attempt, delay: float) -> None:
        """In `delay` seconds the machine is told the grace period is over, and whether the attempt exited."""
        n = attempt.n

        def grace_over() -> None:
            self.host.feed(ev.StopGraceOver(self.ctx.now(), n, exited=self.executor.wait(attempt, 0)))

        self.host.later(f"kill:{self.run}", delay, grace_over, "killing it after the grace period")

    def kill(self, attempt: Attempt) -> None:
        """The grace period is over and the attempt still runs: SIGKILL (its whole tree, or scancel)."""
        log.warning("grace period over: SIGKILL", run=self.run, attempt=attempt.n,
                    grace_s=self.host.spec.guards.stop_grace_seconds)
        self.executor.kill(attempt)
