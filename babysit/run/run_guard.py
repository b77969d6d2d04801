"""One run's live check: an observation (babysit/run/run_observe.py) judged by the guards (core/guards.py:
foreign GPU processes, the GPU-hour cap, stalls, divergence, host memory), a GPU's own fault examined
(babysit/run/gpufault.py), and the actions fed to the run's transition as one `GuardReading`. A foreign-
looking holder seen once is read again in a moment (`Recheck`) rather than a guard interval later.

What it keeps between checks: how many reads in a row each foreign-looking (GPU, pid) was seen.
"""

from __future__ import annotations

import structlog

from babysit.core import guards
from babysit.core import run_events as ev
from babysit.core.nodes import lowest_ram
from babysit.core.observation import Observation
from babysit.core.status import AttemptStatus
from babysit.probes.gpu import GUARD_WINDOW
from babysit.run import gpufault
from babysit.run.context import RunHost
from babysit.run.run_observe import RunObserver
from babysit.run.stackdump import stack_dump

log = structlog.get_logger("babysit.run.supervisor")

RECHECK_SECONDS = 2.0  # a foreign-looking GPU holder is read again this soon (real seconds)
GUARD_LOCK_WAIT_SECONDS = 0.5  # a guard waits this long for a run busy with its exit, then leaves it to that


class RunGuard:
    def __init__(self, host: RunHost, observer: RunObserver) -> None:
        self.host, self.ctx, self.run, self.observer = host, host.ctx, host.run, observer
        self.sightings: dict[guards.SightingKey, int] = {}  # foreign-looking (gpu, pid[, node]) -> consecutive reads
        self.recheck_pending = False

    def guard(self) -> None:
        """The live check; the guards' actions go through the run's transition (`GuardReading`). A run
        whose lock is held (its exit handled, its output drained) is left to that: the round goes on."""
        host = self.host
        if not host.lock.acquire(timeout=GUARD_LOCK_WAIT_SECONDS):
            log.info("guard skipped: the run is busy (an exit, a drain)", run=self.run)
            return
        try:
            attempt, spec = host.attempt, host.spec
            if attempt is None or attempt.status != AttemptStatus.RUNNING or host.state.stopping:
                return
            obs = self.observer.observe(GUARD_WINDOW)
            if obs.view is not None and obs.view.available:
                self.sightings = guards.track_sightings(
                    self.sightings, guards.foreign_holders(obs.view, spec.gpus, obs.run_pids | obs.past_run_pids))
            actions = guards.live(spec.guards, self.live_facts(obs))
            run_pids = obs.host.run_pids if obs.host is not None else frozenset()
            actions = gpufault.examine(self.ctx.store, attempt, actions, run_pids, spec.gpus,
                                       lambda pids: host.executor.remote_stacks(attempt) or stack_dump(pids))
            # a stop of an attempt that already exited with its own code: that is its outcome, not the stop
            exited = any(a.kind == "stop" for a in actions) and host.executor.exit_info(attempt) is not None
            host.feed(ev.GuardReading(self.ctx.now(), attempt.n, actions, exited=exited, run_pids=run_pids))
            slow = host.executor.straggler(attempt)  # a node of a multi-node job the others wait for: said once
            if slow:
                host.incident("straggler", slow, {"attempt": attempt.n}, key=f"{self.run}:{attempt.n}:straggler")
        finally:
            host.lock.release()

    def live_facts(self, obs: Observation) -> guards.LiveFacts:
        """The guards' facts from the check's one observation (a poll snapshots the same kind of record)."""
        running = self.host.state.running_attempt
        if obs.host is not None:
            ram, ram_node = obs.host.available_ram_bytes, None
        else:  # a remote job: its nodes' sidecars say, the lowest counts
            attempt = self.host.attempt
            ram, ram_node = lowest_ram(self.host.executor.node_rows(attempt)) if attempt is not None else (None, None)
        return guards.LiveFacts(
            gpus=obs.gpus, view=obs.view, run_pids=obs.run_pids, gpu_hours_used=obs.gpu_hours_used,
            gpu_hours_projected_at_end=obs.gpu_hours_projected,
            seconds_since_last_record=obs.seconds_since_last_record, process_alive=True,
            available_ram_bytes=ram, ram_node=ram_node,
            already_warned=running.warned if running is not None else frozenset(),  # the machine keeps them
            past_run_pids=obs.past_run_pids, sightings=dict(self.sightings), nonfinite=obs.nonfinite,
            minute_seconds=obs.minute_seconds)

    def recheck_soon(self, action: guards.Action) -> None:
        """A holder seen once: read again in a moment instead of waiting a whole guard interval."""
        log.info("gpu holder to confirm", run=self.run, holders=action.detail.get("holders"))
        if self.recheck_pending:
            return
        self.recheck_pending = True

        def recheck() -> None:
            self.recheck_pending = False
            self.guard()

        self.host.later(f"recheck:{self.run}", min(RECHECK_SECONDS, self.ctx.scale / 2), recheck,
                        "re-checking its guards")
