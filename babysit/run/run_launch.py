"""An attempt launched: what it is launched with (its environment and its launch post: functions of the
spec, the attempt and what the executor adds), and `RunLauncher`, which carries out the machine's `Launch`
and `Adopt` for one run — the GPUs chosen, the prelaunch guards, the store's row, then the process.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import structlog

from babysit import sources
from babysit.core import guards, retry, smoke
from babysit.core import run_events as ev
from babysit.core.reading import nonfinite
from babysit.core.spec.run_toml import RunSpec
from babysit.core.status import AttemptStatus, RunStatus
from babysit.db.store import Attempt
from babysit.run import gpufault, nccl
from babysit.run.context import RunHost
from babysit.run.run_log import RunLog
from babysit.run.run_observe import RunObserver
from babysit.runtime.faults import crash_point

log = structlog.get_logger("babysit.run.supervisor")

GPU_WAIT_MINUTES = 1.0  # a run waiting for a quarantined GPU looks again this many declared minutes later
SECRETS = ("SLACK_BOT_TOKEN", "SLACK_APP_TOKEN", "SLACK_SIGNING_SECRET")  # the trainer has no business with them


def attempt_env(spec: RunSpec, attempt: Attempt, records_log: Path, executor_env: Mapping[str, str],
                base: Mapping[str, str]) -> dict[str, str]:
    """The attempt's environment: `base` (the daemon's), [run].env, babysit's variables (docs/your-trainer.md),
    the watched metrics for the hooks, the executor's (local: CUDA numbers GPUs as NVML does) and the NCCL
    flight recorder's (unless the user set them); never the bot's credentials."""
    env = dict(base)
    env.update(spec.env)
    env.update({"BABYSIT_RUN": spec.name, "BABYSIT_ATTEMPT": str(attempt.n),
                "BABYSIT_LOG": str(records_log if spec.log is None else spec.log),
                "BABYSIT_CHECKPOINTS": str(spec.checkpoints),
                "PYTHONUNBUFFERED": env.get("PYTHONUNBUFFERED", "1"),
                "BABYSIT_SPEC_FILE": str(spec.spec_file)})  # the Slurm executor reads [slurm] from it
    env.update(sources.adapter(spec.source.kind).attempt_env(spec.source, spec.name, attempt.n, env, spec.env))
    watched = nonfinite.to_env(spec.guards.nonfinite_metrics)  # the hooks watch what the guard does
    if watched is not None:
        env[nonfinite.ENV] = watched
    for secret in SECRETS:
        env.pop(secret, None)
    env.update(executor_env)
    env.update(nccl.flight_recorder_env(env, Path(attempt.attempt_dir)))
    return env


def launch_payload(spec: RunSpec, attempt: Attempt, note: str | None, max_attempts: int,
                   default_channel: str | None) -> dict[str, Any]:
    """The launch post of an attempt (the run's thread starts with it)."""
    prereg = spec.prereg
    return {"attempt": attempt.n, "max_attempts": max_attempts, "profile": attempt.profile,
            "argv": list(attempt.argv), "gpus": list(spec.gpus), "executor": attempt.executor,
            "pid": attempt.pid, "job_id": attempt.job_id, "note": note,
            "selected_by": attempt.detail.get("selected_by"),
            "question": prereg.question if prereg else None, "read_step": prereg.read_step if prereg else None,
            "channel": spec.notify.channel or default_channel}


def note_lines(notes: Any) -> list[str]:
    """build_argv's notes (a dict of lines, or a list) as lines for the launch post."""
    if not notes:
        return []
    if isinstance(notes, dict):
        return [str(v) for v in notes.values() if v]
    return [str(n) for n in notes]


class RunLauncher:
    """An attempt started (the machine's `Launch`: GPUs chosen, prelaunch guards, the store's row, the
    process) or adopted after a restart (`Adopt`); each then fed back as `Launched` / `Adopted`."""

    def __init__(self, host: RunHost, runlog: RunLog, observer: RunObserver) -> None:
        self.host, self.ctx, self.run, self.runlog, self.observer = host, host.ctx, host.run, runlog, observer
        self.executor, self.lock = host.executor, host.lock  # fixed for the run's life

    def adopt(self, attempt: Attempt) -> None:
        """A live attempt of a dead daemon: one recorded but never started is started now (once), else
        found and watched (`Adopted`: a stop it was making is resumed)."""
        host = self.host
        host.use_gpus(attempt.detail.get("gpus"))
        if attempt.status == AttemptStatus.LAUNCHING:
            found = self.executor.find(attempt)
            if found is None:  # recorded, never started: start it now (once)
                self.start_attempt(attempt, note=attempt.detail.get("note"))
                return
            self.ctx.store.mark_running(attempt.id, started_at=found.started_at, pid=found.pid,
                                        pid_create_time=found.pid_create_time, job_id=found.job_id)
            attempt = self.ctx.store.attempt(self.run, attempt.n)
        host.attempt = attempt
        self.record_enforced()
        log.info("adopted", run=self.run, attempt=attempt.n, pid=attempt.pid, job=attempt.job_id,
                 stopping=host.state.stop is not None and host.state.stop.attempt == attempt.n)
        host.feed(ev.Adopted(self.ctx.now(), attempt.n, attempt.started_at))

    def launch(self, n: int, *, resume: bool, halvings: int, note: str | None) -> None:
        """Attempt n: its GPUs (a quarantined one swapped for a stand-in, or wait), the prelaunch guards
        (a refusal is `LaunchRefused`), its argv (smoke selection, retry's resume and halvings), its row
        in the store, then the process."""
        host, ctx = self.host, self.ctx
        # A scheduler (Slurm) picks the GPUs on a node the daemon cannot see: no launch check from here.
        host.use_gpus(None)
        gpus = () if self.executor.allocates_gpus else host.spec.gpus
        # this read also opens the attempt's poll window: the first poll averages from launch
        view = ctx.gpu_probe.read(gpus, window=self.observer.poll_window) if gpus else None
        if gpus and view is not None and view.available:  # a quarantined GPU: stand-ins, or wait for it
            choice = gpufault.choose(ctx.gpu_probe, ctx.store, host.spec, host.declared_gpus, view)
            if choice.gpus is None:
                self.wait_for_gpu(n, choice.waiting_for, resume=resume, halvings=halvings, note=note)
                return
            if choice.gpus != tuple(gpus):
                host.use_gpus(choice.gpus)
                gpus = host.spec.gpus
                view = ctx.gpu_probe.read(gpus, window=self.observer.poll_window)
                note = " · ".join(x for x in (note, choice.note) if x)
        quarantined = {u: q["reason"] for u, q in ctx.store.quarantined_gpus().items()} if gpus else {}
        refusals = [a for a in guards.prelaunch(host.spec.guards, gpus, view, frozenset(self.observer.run_pids_seen),
                                                quarantined) if a.kind == "refuse"]
        if refusals:
            host.feed(ev.LaunchRefused(ctx.now(), n, tuple(refusals)))
            return
        facts = ctx.store.run_state(self.run)[1]
        after = host.state.relaunched_after
        spec, selected_by = smoke.attempt_spec(host.spec, n - after, facts)  # smoke-selected
        argv, notes = retry.build_argv(spec, n, resume=resume, halvings=halvings, after=after)
        profile = spec.profile_for(n - after)
        adir = ctx.state_dir / "runs" / self.run / f"attempt-{n}"
        attempt = ctx.store.begin_attempt(self.run, n, profile.profile, argv, host.spec.executor,
                                          self.executor.charged_gpus(host.spec), str(adir), ctx.now())
        crash_point("after-begin-attempt")
        if halvings:
            ctx.store.merge_attempt_detail(attempt.id, {"halvings": halvings})
        if selected_by:
            ctx.store.merge_attempt_detail(attempt.id, {"selected_by": selected_by})
        if host.spec.gpus != host.declared_gpus:
            ctx.store.merge_attempt_detail(attempt.id, {"gpus": list(host.spec.gpus)})
        merged = " · ".join(x for x in (note, *note_lines(notes)) if x) or None
        self.start_attempt(attempt, note=merged)

    def start_attempt(self, attempt: Attempt, note: str | None) -> None:
        """The process of a recorded attempt started, marked running, its reading begun afresh; `Launched`."""
        host, ctx, spec = self.host, self.ctx, self.host.spec
        env = attempt_env(spec, attempt, self.runlog.records_log, self.executor.launch_env(spec.gpus), os.environ)
        sources.adapter(spec.source.kind).before_launch(env, spec.env)  # wandb's $WANDB_DIR made
        if spec.log is not None:
            spec.log.parent.mkdir(parents=True, exist_ok=True)
        launched = self.executor.launch(attempt, list(attempt.argv), env, str(spec.workdir))
        crash_point("after-launch")
        ctx.store.mark_running(attempt.id, started_at=launched.started_at, pid=launched.pid,
                               pid_create_time=launched.pid_create_time, job_id=launched.job_id)
        row = host.attempt = ctx.store.attempt(self.run, attempt.n)
        self.runlog.new_attempt(ctx.now())  # a new attempt's pace is its own
        ctx.reads.nudge()  # its printed output is watched from now on
        self.record_enforced()
        log.info("launched", run=self.run, attempt=attempt.n, pid=launched.pid, job=launched.job_id)
        host.feed(ev.Launched(ctx.now(), row.n, row.profile, row.gpus, row.started_at or ctx.now(),
                              halvings=int(row.detail.get("halvings", 0)), note=note))

    def launch_message(self, attempt: Attempt, note: str | None) -> int | None:
        """The launch post (the run's thread starts with it); its message id."""
        most = self.host.state.relaunched_after + self.host.spec.retry.max_attempts
        payload = launch_payload(self.host.spec, attempt, note, most, self.ctx.default_channel)
        return self.host.message("launch", payload, key=f"{self.run}:{attempt.n}:launch", thread=False)

    def wait_for_gpu(self, n: int, waiting_for: tuple[int, ...], *, resume: bool, halvings: int,
                     note: str | None) -> None:
        """A quarantined GPU the run needs, and no stand-in: wait (`WaitingForGpu`: said once), look again
        every minute."""
        self.host.feed(ev.WaitingForGpu(self.ctx.now(), n, tuple(waiting_for)))

        def again() -> None:
            with self.lock:
                if self.host.state.status is RunStatus.WAITING_GPU:
                    self.launch(n, resume=resume, halvings=halvings, note=note)

        self.host.later(f"gpu-wait:{self.run}", GPU_WAIT_MINUTES * self.ctx.scale, again, "waiting for its GPU")

    def record_enforced(self) -> None:
        """What this daemon enforces from the spec it loaded, for `status` and the web page to show (the
        run.toml may have been edited since: the daemon reads it again only when it starts the run)."""
        enforced = {"gpu_hours_cap": self.host.spec.guards.gpu_hours_cap,
                    "max_attempts": self.host.spec.retry.max_attempts}  # another box's status shows "1/3" too
        self.ctx.store.merge_run_facts(self.run, self.ctx.now(), enforced=enforced)
