"""One look at a running attempt, the inputs of a guard's or a poll's reading as one value: the log read
on (babysit/run/run_log.py), the host and the run's process tree, the GPUs through the right probe and
window, the GPU-hours over every attempt, folded by `core.observation.observe` into one frozen
`Observation`; a poll's `Snapshot` is built from the same value, so guards and polls never disagree.

What it remembers between looks is what an observation needs and nothing else: every pid the run's tree
ever held (never a foreign holder), and the ended attempts' rows (they cannot change).
"""

from __future__ import annotations

import time

import structlog

from babysit.core import progress, snapshot
from babysit.core.observation import Observation, observe
from babysit.core.readings import GpuView, HostReading
from babysit.db.store import Attempt
from babysit.probes.gpu import GUARD_WINDOW, poll_window
from babysit.run.context import RunHost
from babysit.run.run_log import RunLog

log = structlog.get_logger("babysit.run.supervisor")

SLOW_CHECK_SECONDS = 0.25  # a look that took longer says where its time went (a check must cost its run nothing)


class RunObserver:
    def __init__(self, host: RunHost, runlog: RunLog) -> None:
        self.host, self.ctx, self.run, self.runlog = host, host.ctx, host.run, runlog
        self.poll_window = poll_window(self.run)  # the GPU utilization window its polls average over
        self.run_pids_seen: set[int] = set()  # every pid the run's tree held, all attempts: never foreign
        self.past_attempts: tuple[int, tuple[Attempt, ...]] | None = None  # (live attempt, the others), cached

    def observe(self, window: str = GUARD_WINDOW) -> Observation:
        """One look at the running attempt: the log read on, then the host, the GPUs (closing `window`'s
        utilization average) and the GPU-hours, each read once; guards and polls decide on the result."""
        host_run, runlog = self.host, self.runlog
        attempt, spec, executor = host_run.attempt, host_run.spec, host_run.executor
        assert attempt is not None
        t0 = time.perf_counter()
        runlog.read_log(wait=False)  # a budget's worth at most: the reader thread reads a backlog
        runlog.teller.check_reader(attempt)
        now = self.ctx.now()
        host = None
        if executor.runs_here:
            root = executor.root(attempt)  # the root's create time checked in the one read of its stat
            host = self.ctx.host_probe.read(root[0], started=root[1]) if root else self.ctx.host_probe.read(None)
        run_pids = self.run_pids(host)
        t1 = time.perf_counter()
        view = self.gpu_view(window)
        t2 = time.perf_counter()
        if t2 - t0 > SLOW_CHECK_SECONDS:
            log.info("check slow", run=self.run, log_and_host_s=round(t1 - t0, 3), gpu_read_s=round(t2 - t1, 3))
        prereg = spec.prereg
        since_start = None if attempt.started_at is None else now - attempt.started_at
        quiet = runlog.quiet_seconds(now)
        if quiet is not None and since_start is not None:  # a job its scheduler requeued waits, then starts
            quiet = min(quiet, since_start)  # again: its stall clock too (started_at follows its new start)
        return observe(  # durations in real seconds; the declared-minute thresholds scale by minute_seconds
            run=self.run, attempt=attempt.n, at=now, points=tuple(runlog.points),
            read_step=prereg.read_step if prereg else None, end_step=runlog.end_step(attempt), gpus=spec.gpus,
            gpu_hours_used=self.gpu_hours(attempt, now), gpu_hours_cap=spec.guards.gpu_hours_cap, n_gpus=attempt.gpus,
            view=view, host=host, run_pids=run_pids, past_run_pids=frozenset(self.run_pids_seen),
            seconds_since_last_record=quiet, seconds_since_launch=since_start,
            data_wait_frac=runlog.data_wait_frac(), nonfinite=runlog.nonfinite, minute_seconds=self.ctx.scale)

    def snapshot(self, kind: str, obs: Observation | None = None) -> snapshot.Snapshot:
        """The poll's snapshot of an observation (a fresh one through the poll window when none is given):
        the same step, pace, projection, GPUs, host and pids the guards decide on."""
        obs = obs if obs is not None else self.observe(self.poll_window)
        spec, runlog, attempt = self.host.spec, self.runlog, self.host.attempt
        return snapshot.build_snapshot(
            run=obs.run, attempt=obs.attempt, at=obs.at, kind=kind, progress=obs.progress,
            view=obs.view, host=obs.host, gpus=obs.gpus,
            run_pids=(obs.run_pids | obs.past_run_pids) if obs.host is not None else None,
            latest_eval=runlog.latest_eval, latest_eval_step=runlog.latest_eval_step,
            provisional=self.host.verdicts.provisional,
            starvation_util_pct=spec.poll.starvation_util_pct,
            min_free_host_ram_gib=spec.guards.min_free_host_ram_gib,
            seconds_since_last_record=obs.seconds_since_last_record,
            stall_seconds=spec.guards.stall_minutes * obs.minute_seconds,
            note=self.host.executor.status_note(attempt) if attempt is not None else None,
            nodes=self.host.executor.node_rows(attempt) if attempt is not None else (),
            log_path=str(spec.source.path if spec.source.copies and spec.source.path is not None
                         else runlog.records_log),
            source_kind=spec.source.kind, seconds_since_launch=obs.seconds_since_launch,
            data_wait_frac=obs.data_wait_frac,
            shown_metrics={k: [step, v] for k, (step, v) in runlog.latest_shown.items()},
            reading=runlog.teller.reading_line() if kind == "first" else None)

    def run_pids(self, host: HostReading | None) -> frozenset[int]:
        """The run's tree now, remembered: a pid that ever was the run's is never a foreign holder."""
        if host is not None:
            self.run_pids_seen.update(host.run_pids)
        attempt = self.host.attempt
        if attempt is not None:
            self.run_pids_seen.update(self.host.executor.own_pids(attempt))
        return host.run_pids if host is not None else frozenset()

    def gpu_hours(self, attempt: Attempt, now: float) -> float:
        """GPU-hours over every attempt (`progress.gpu_hours_used`, the rule status and the web page
        apply): the ended attempts read from the store once per attempt (they cannot change)."""
        if self.past_attempts is None or self.past_attempts[0] != attempt.n:
            self.past_attempts = (attempt.n, tuple(a for a in self.ctx.store.attempts(self.run) if a.n != attempt.n))
        return progress.gpu_hours_used((*self.past_attempts[1], attempt), now)

    def gpu_view(self, window: str = GUARD_WINDOW) -> GpuView | None:
        """The run's GPUs: through the executor's own probe where it has one (Slurm: the job's probe
        sidecar, since the daemon's node cannot see the job's GPUs), else the daemon's probe.
        `window`: whose utilization average this read closes (the guards' or the polls')."""
        gpus = self.host.spec.gpus
        if not gpus:
            return None
        probe = self.ctx.gpu_probe
        attempt = self.host.attempt
        if attempt is not None:
            probe = self.host.executor.gpu_probe(attempt, probe)
        return probe.read(gpus, window=window)
