"""One registered run under the daemon: launch, watch, poll, guard, classify, retry, read the verdict.

The order of every step is: decide (pure functions), write the fact to the store, then act. So a
daemon killed between any two lines resumes from the store without launching twice, posting twice or
losing a GPU-second. Messages carry dedupe keys so a redone step queues nothing new.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import structlog

from babysit import gpufault, run_launch, runstate
from babysit.context import DaemonContext
from babysit.core import guards, retry, run_machine, smoke
from babysit.core import run_events as ev
from babysit.core.spec import RunSpec
from babysit.core.status import AttemptStatus, RunStatus
from babysit.faults import crash_point
from babysit.run_errors import RunErrors
from babysit.run_exit import RunExits
from babysit.run_guard import RunGuard
from babysit.run_log import RunLog
from babysit.run_observe import RunObserver
from babysit.run_polls import RunPolls
from babysit.run_verdict import RunVerdicts
from babysit.stackdump import stack_dump
from babysit.store import Attempt

log = structlog.get_logger("babysit.supervisor")

GPU_WAIT_MINUTES = 1.0  # a run waiting for a quarantined GPU looks again this many declared minutes later


class RunSupervisor:
    def __init__(self, ctx: DaemonContext, spec: RunSpec, registered_prereg_sha256: str | None) -> None:
        self.ctx = ctx
        self.spec = spec
        self.run = spec.name
        self.frozen_sha = registered_prereg_sha256
        self.executor = ctx.executors[spec.executor]
        self.declared_gpus = spec.gpus  # spec.gpus is the attempt's: a quarantined GPU may be swapped out
        self.lock = threading.RLock()
        self.attempt: Attempt | None = None
        self.launch_msg: int | None = None
        self.state = run_machine.RunState(spec=spec)  # the run's machine state: read from the store at start()
        self.errors = RunErrors(self.run, self.incident, lambda: self.attempt.n if self.attempt else None)
        self.polls = RunPolls(self, ctx)  # its poll calendar's entry (babysit/run_polls.py)
        self.verdicts = RunVerdicts(spec, registered_prereg_sha256, ctx, message=self.message,
                                    internal_error=self.internal_error, feed=self.feed,
                                    read_log=lambda: self.runlog.read_log(drain=True),  # the FINAL one reads all
                                    attempt_n=lambda: self.attempt.n if self.attempt else None)
        self.runlog = RunLog(self, ctx.store.run_state(self.run)[1])  # the reader and what its records tell
        self.observer = RunObserver(self)  # one look at the attempt: what guards and polls decide on
        self.guarding = RunGuard(self)  # the live check
        self.exits = RunExits(self)  # an attempt's end: watched, drained, classified, decided

    # -- state ------------------------------------------------------------------------------------------
    @property
    def status(self) -> str:
        return self.ctx.store.run_state(self.run)[0]

    def is_active(self) -> bool:
        return not RunStatus.of(self.status).terminal

    def is_running(self) -> bool:
        """Its current attempt runs (no store query: what the daemon's rounds ask of every run)."""
        return self.attempt is not None and self.attempt.status == AttemptStatus.RUNNING

    @property
    def stopping(self) -> bool:
        """A stop of the live attempt was requested (it has not exited yet)."""
        return self.state.stopping

    def _record_enforced(self) -> None:
        """What this daemon enforces from the spec it loaded, for `status` and the web page to show (the
        run.toml may have been edited since: the daemon reads it again only when it starts the run)."""
        enforced = {"gpu_hours_cap": self.spec.guards.gpu_hours_cap}
        self.ctx.store.merge_run_facts(self.run, self.ctx.now(), enforced=enforced)

    def _set(self, status: str, **facts: Any) -> None:
        self.ctx.store.set_run_state(self.run, status, self.ctx.now(), **facts)

    def message(self, kind: str, payload: dict[str, Any], key: str | None, thread: bool = True) -> int:
        return self.ctx.store.enqueue(self.run, kind, {"run": self.run, **payload}, self.ctx.now(),
                                      thread_of=self.launch_msg if thread else None, dedupe_key=key)

    def incident(self, kind: str, message: str, detail: dict[str, Any], key: str) -> None:
        """Record an incident on this run's current attempt and post it, once per `key`."""
        n = self.attempt.n if self.attempt else None
        if self.ctx.store.has_message(key):  # a restarted daemon redoing this step: already recorded
            return
        self.ctx.store.add_incident(self.run, n, self.ctx.now(), kind, detail)
        self.message("incident", {"attempt": n, "incident": kind, "message": message, "detail": detail,
                                   "mention": list(self.spec.notify.mention_on_incident)}, key)
        log.warning("incident", run=self.run, attempt=n, incident=kind, message=message, posted=True)

    # -- the machine ----------------------------------------------------------------------------------
    def feed(self, event: ev.Event, *, defer: tuple[type, ...] = ()) -> str | None:
        """One event through the run's transition (core/run_machine.py), then its effects in order, under
        the run's lock; effects of a `defer` type after the lock is released. Returns the answer an effect
        gave (a request's reply), if any."""
        later: list[ev.Effect] = []
        reply = None
        with self.lock:
            self.state, effects = run_machine.step(self.state, event)
            for effect in effects:
                if isinstance(effect, defer):
                    later.append(effect)
                else:
                    reply = self._do(effect) or reply
        for effect in later:
            reply = self._do(effect) or reply
        return reply

    def _do(self, e: ev.Effect) -> str | None:
        """Carry out one effect: the store written, a message queued, a process started, signalled or killed."""
        match e:
            case ev.SetStatus():
                self._set(e.status.value, **e.facts)
                if e.status.ended:
                    log.info("run over", run=self.run, status=e.status.value, reason=e.facts.get("end_reason"))
            case ev.Launch():
                self._launch(e.n, resume=e.resume, halvings=e.halvings, note=e.note)
            case ev.Adopt():
                self._adopt(self.ctx.store.attempt(self.run, e.n))
            case ev.Post(kind="launch"):
                self.launch_msg = self._launch_message(self._row(e.n), e.note)
            case ev.Post():
                self._ended_message(self._row(e.n))
            case ev.Watch():
                self.exits.watch()
                self.polls.schedule_next()
            case ev.Incident():
                self._raise(e)
            case ev.NoteAttempt():
                self.note_attempt(self._row(e.n), **e.facts)
            case ev.RecordExit():
                row = self.ctx.store.attempt(self.run, e.n)
                self.ctx.store.mark_ended(row.id, ended_at=e.ended_at, outcome=e.outcome, exit_code=e.exit_code,
                                          exit_signal=e.signal, detail=dict(e.detail))
                crash_point("after-mark-ended")
                self.attempt = self.ctx.store.attempt(self.run, e.n)
            case ev.Signal():
                self._send_stop(self._row(e.n), e.stop.to_dict(), e.kill_after)
            case ev.ArmKill():
                self._arm_kill(self._row(e.n), e.delay)
            case ev.Kill():
                log.warning("grace period over: SIGKILL", run=self.run, attempt=e.n,
                            grace_s=self.spec.guards.stop_grace_seconds)
                self.executor.kill(self._row(e.n))
            case ev.Recheck():
                self.guarding.recheck_soon(e.action)
            case ev.TakePoll():
                if self.poll("on-demand"):
                    return "polled"
                return "not polled: the poll failed (the daemon log says why)"
            case ev.ReadVerdict(full=True):
                self.verdicts.final()
            case ev.ReadVerdict():
                self.verdicts.read()
            case ev.SaveVerdict():
                self.verdicts.save(dict(e.body), e.stored)
            case ev.Chart():
                self.verdicts.draw_chart(dict(e.body))
            case ev.PostVerdict():
                self.verdicts.post(dict(e.body))
            case ev.Forget():
                self._forget()
            case ev.Reply():
                return e.text
        return None

    def _row(self, n: int) -> Attempt:
        """Attempt n's store row (the current one without a query)."""
        attempt = self.attempt
        return attempt if attempt is not None and attempt.n == n else self.ctx.store.attempt(self.run, n)

    def _raise(self, e: ev.Incident) -> None:
        if e.unless_raised is not None and self.ctx.store.has_message(e.unless_raised):
            # a guard that stopped it for this very reason (stalled, diverged) has said it already: the
            # attempt's end is said on its own
            if e.ends is not None:
                self._ended_message(self._row(e.ends))
            return
        detail = dict(e.detail)
        if e.stacks_of is not None and "stacks" not in detail:  # a stall: where the trainer's threads are
            detail["stacks"] = stack_dump(e.stacks_of)
        if e.stacks_of is not None:
            detail["log"] = str(self.runlog.records_log)  # where babysit saw no record
        self.incident(e.kind, e.message, detail, key=e.key)

    def _ended_message(self, attempt: Attempt) -> None:
        summary = attempt.detail.get("summary") or attempt.outcome
        self.message("ended", {"attempt": attempt.n, "outcome": attempt.outcome, "summary": summary,
                                "exit_code": attempt.exit_code, "signal": attempt.exit_signal},
                      key=f"{self.run}:{attempt.n}:ended")

    # -- start / adopt ----------------------------------------------------------------------------------
    def start(self) -> None:
        """Adopt a live attempt, finish one that ended while the daemon was down, or launch: the store's
        state fed to the run's transition as `Registered` (run_machine), as a restarted daemon does."""
        with self.lock:
            self.verdicts.check_prereg()
            now = self.ctx.now()
            self.state = runstate.restore(self.ctx.store, self.spec, now)
            last = self.state.last
            if last is not None and not last.live and self.state.status in (RunStatus.RUNNING, RunStatus.RETRYING,
                                                                            RunStatus.STOPPING, RunStatus.WAITING_GPU):
                # the daemon died between recording the exit and deciding: decide now
                self.exits.deciding(ev.Registered(now), last.n, f"deciding after attempt {last.n}'s exit")
                return
            self.feed(ev.Registered(now))

    def _adopt(self, attempt: Attempt) -> None:
        """A live attempt of a dead daemon: one recorded but never started is started now (once), else
        found and watched (`Adopted`: a stop it was making is resumed)."""
        self._use_gpus(attempt.detail.get("gpus"))
        if attempt.status == AttemptStatus.LAUNCHING:
            found = self.executor.find(attempt)
            if found is None:  # recorded, never started: start it now (once)
                self._start_attempt(attempt, note=attempt.detail.get("note"))
                return
            self.ctx.store.mark_running(attempt.id, started_at=found.started_at, pid=found.pid,
                                        pid_create_time=found.pid_create_time, job_id=found.job_id)
            attempt = self.ctx.store.attempt(self.run, attempt.n)
        self.attempt = attempt
        self._record_enforced()
        log.info("adopted", run=self.run, attempt=attempt.n, pid=attempt.pid, job=attempt.job_id,
                 stopping=self.state.stop is not None and self.state.stop.attempt == attempt.n)
        self.feed(ev.Adopted(self.ctx.now(), attempt.n, attempt.started_at))

    # -- launch -----------------------------------------------------------------------------------------
    def _launch(self, n: int, *, resume: bool, halvings: int, note: str | None) -> None:
        # A scheduler (Slurm) picks the GPUs on a node the daemon cannot see: no launch check from here.
        self._use_gpus(None)
        gpus = () if self.executor.allocates_gpus else self.spec.gpus
        # this read also opens the attempt's poll window: the first poll averages from launch
        view = self.ctx.gpu_probe.read(gpus, window=self.observer.poll_window) if gpus else None
        if gpus and view is not None and view.available:  # a quarantined GPU: stand-ins, or wait for it
            choice = gpufault.choose(self.ctx.gpu_probe, self.ctx.store, self.spec, self.declared_gpus, view)
            if choice.gpus is None:
                self._wait_for_gpu(n, choice.waiting_for, resume=resume, halvings=halvings, note=note)
                return
            if choice.gpus != tuple(gpus):
                self._use_gpus(choice.gpus)
                gpus = self.spec.gpus
                view = self.ctx.gpu_probe.read(gpus, window=self.observer.poll_window)
                note = " · ".join(x for x in (note, choice.note) if x)
        quarantined = {u: q["reason"] for u, q in self.ctx.store.quarantined_gpus().items()} if gpus else {}
        refusals = [a for a in guards.prelaunch(self.spec.guards, gpus, view, frozenset(self.observer.run_pids_seen),
                                                quarantined) if a.kind == "refuse"]
        if refusals:
            self.feed(ev.LaunchRefused(self.ctx.now(), n, tuple(refusals)))
            return
        facts = self.ctx.store.run_state(self.run)[1]
        after = self.state.relaunched_after
        spec, selected_by = smoke.attempt_spec(self.spec, n - after, facts)  # smoke-selected
        argv, notes = retry.build_argv(spec, n, resume=resume, halvings=halvings, after=after)
        profile = spec.profile_for(n - after)
        adir = self.ctx.state_dir / "runs" / self.run / f"attempt-{n}"
        attempt = self.ctx.store.begin_attempt(self.run, n, profile.profile, argv, self.spec.executor,
                                               len(self.spec.gpus), str(adir), self.ctx.now())
        crash_point("after-begin-attempt")
        if halvings:
            self.ctx.store.merge_attempt_detail(attempt.id, {"halvings": halvings})
        if selected_by:
            self.ctx.store.merge_attempt_detail(attempt.id, {"selected_by": selected_by})
        if self.spec.gpus != self.declared_gpus:
            self.ctx.store.merge_attempt_detail(attempt.id, {"gpus": list(self.spec.gpus)})
        merged = " · ".join(x for x in (note, *run_launch.note_lines(notes)) if x) or None
        self._start_attempt(attempt, note=merged)

    def _start_attempt(self, attempt: Attempt, note: str | None) -> None:
        env = run_launch.attempt_env(self.spec, attempt, self.runlog.records_log,
                                     self.executor.launch_env(self.spec.gpus), os.environ)
        if self.spec.source.kind == "wandb" and "WANDB_DIR" not in self.spec.env:
            Path(env["WANDB_DIR"]).mkdir(parents=True, exist_ok=True)  # wandb writes its run folders under it
        if self.spec.log is not None:
            self.spec.log.parent.mkdir(parents=True, exist_ok=True)
        launched = self.executor.launch(attempt, list(attempt.argv), env, str(self.spec.workdir))
        crash_point("after-launch")
        self.ctx.store.mark_running(attempt.id, started_at=launched.started_at, pid=launched.pid,
                                    pid_create_time=launched.pid_create_time, job_id=launched.job_id)
        self.attempt = self.ctx.store.attempt(self.run, attempt.n)
        self.runlog.new_attempt(self.ctx.now())  # a new attempt's pace is its own
        self._record_enforced()
        log.info("launched", run=self.run, attempt=attempt.n, pid=launched.pid, job=launched.job_id)
        row = self.attempt
        self.feed(ev.Launched(self.ctx.now(), row.n, row.profile, row.gpus, row.started_at or self.ctx.now(),
                               halvings=int(row.detail.get("halvings", 0)), note=note))

    def _launch_message(self, attempt: Attempt, note: str | None) -> int:
        most = self.state.relaunched_after + self.spec.retry.max_attempts
        payload = run_launch.launch_payload(self.spec, attempt, note, most, self.ctx.default_channel)
        return self.message("launch", payload, key=f"{self.run}:{attempt.n}:launch", thread=False)

    # -- watching ---------------------------------------------------------------------------------------
    def later(self, key: str, delay: float, fn: Callable[[], None], where: str) -> None:
        """`fn` on the daemon's timers in `delay` real seconds: an error is this run's (logged, or an
        internal-error incident), never the timer thread's."""
        def run() -> None:
            try:
                fn()
            except Exception as exc:
                self.failed(where, exc)

        self.ctx.timers.call_at(key, self.ctx.now() + delay, run)

    def _use_gpus(self, gpus: Any) -> None:
        """The attempt's GPUs (recorded on it when they differ from the declared ones)."""
        chosen = tuple(int(g) for g in gpus) if gpus else self.declared_gpus
        if chosen != self.spec.gpus:
            self.spec = dataclasses.replace(self.spec, gpus=chosen)

    def _wait_for_gpu(self, n: int, waiting_for: tuple[int, ...], *, resume: bool, halvings: int,
                      note: str | None) -> None:
        """A quarantined GPU the run needs, and no stand-in: wait (said once), look again every minute."""
        which = ", ".join(f"GPU {g}" for g in waiting_for)
        self._set(RunStatus.WAITING_GPU.value, waiting_for=list(waiting_for))
        self.incident("gpu-quarantined", f"attempt {n} waits: {which} quarantined (`babysit gpu release` lifts "
                      "it once the GPU is reset); declare gpus = \"any N\" or spare_gpus to run on another",
                      {"waiting_for": list(waiting_for), "attempt": n}, key=f"{self.run}:{n}:waiting-gpu")

        def again() -> None:
            with self.lock:
                if self.status == RunStatus.WAITING_GPU:
                    self._launch(n, resume=resume, halvings=halvings, note=note)

        self.later(f"gpu-wait:{self.run}", GPU_WAIT_MINUTES * self.ctx.scale, again, "waiting for its GPU")

    def _forget(self) -> None:
        """The run is over: nothing of it stays scheduled, and its GPU poll window stops being fed."""
        self.ctx.polls.cancel(self.run)
        for key in (f"kill:{self.run}", f"recheck:{self.run}", f"exit-check:{self.run}", f"gpu-wait:{self.run}"):
            self.ctx.timers.cancel(key)
        self.ctx.gpu_probe.close_window(self.observer.poll_window)

    def internal_error(self, where: str, exc: BaseException) -> None:
        """An unexpected exception met while handling this run: an internal-error incident, once (run_errors)."""
        self.errors.internal_error(where, exc)

    # -- polls and guards -------------------------------------------------------------------------------
    def poll(self, kind: str | None = None) -> bool:
        """Poll now, alone (`/babysit poll`: kind "on-demand", which leaves the schedule as it is); True
        when a poll was recorded (babysit/run_polls.py)."""
        return self.polls.now_alone(kind)

    def failed(self, where: str, exc: BaseException) -> None:
        """An error met on this run by a job: logged, or an internal-error incident (run_errors). Never raises."""
        self.errors.failed(where, exc)

    def guard(self) -> None:
        """The live check (babysit/run_guard.py): foreign GPU processes, GPU-hour cap, stalls, divergence,
        host memory."""
        self.guarding.guard()

    def note_attempt(self, attempt: Attempt, **facts: Any) -> None:
        self.ctx.store.merge_attempt_detail(attempt.id, facts)

    def request(self, kind: str, by: str = "?", request_id: int | None = None) -> str:
        """A control request (`abort`, `poll-now`) through the run's transition; returns the answer for
        the asker. The stop signal and the poll are sent after the run's lock is released, on the
        asker's thread."""
        event = ev.Request(self.ctx.now(), "poll" if kind == "poll-now" else kind, by, request_id)
        return self.feed(event, defer=(ev.Signal, ev.TakePoll)) or "not running"

    def _send_stop(self, attempt: Attempt, stop: dict[str, Any], grace: float) -> None:
        """The stop signal now, the SIGKILL after `grace` seconds; the store then says it was sent, so a
        daemon that died before sending it sends it on adoption, and one that died after does not."""
        # the SIGKILL is scheduled first, so a stop that fails (scancel refused) still ends in one
        self._arm_kill(attempt, grace)
        self.executor.stop(attempt, signal.Signals[stop.get("signal") or self.spec.stop_signal])  # the asker's thread
        self.ctx.store.merge_run_facts(self.run, self.ctx.now(), at_once=True, stop={**stop, "sent_at": self.ctx.now()})

    def _arm_kill(self, attempt: Attempt, delay: float) -> None:
        n = attempt.n

        def grace_over() -> None:
            self.feed(ev.StopGraceOver(self.ctx.now(), n, exited=self.executor.wait(attempt, 0)))

        self.later(f"kill:{self.run}", delay, grace_over, "killing it after the grace period")
