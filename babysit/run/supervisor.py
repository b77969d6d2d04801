"""One registered run under the daemon, a thin shell: every event goes through the run's transition
(`core/run_machine.step`) and each effect it returns is carried out here or by the part that owns it —
babysit/run/run_launch.py (launch, adopt), run_log.py (the log read, what its records tell), run_observe.py
(one look at the attempt), run_guard.py (the live check), run_polls.py, run_exit.py (an exit watched,
drained, classified), run_verdict.py, run_posts.py. The stop signal and the SIGKILL are sent here.

The order of every step is: decide (pure functions), write the fact to the store, then act. So a
daemon killed between any two lines resumes from the store without launching twice, posting twice or
losing a GPU-second. Messages carry dedupe keys so a redone step queues nothing new.
"""

from __future__ import annotations

import dataclasses
import hashlib
import signal
import threading
from collections.abc import Callable
from typing import Any

import structlog

from babysit.core import run_events as ev
from babysit.core import run_machine
from babysit.core.errors import BabysitError, short_error
from babysit.core.spec.run_toml import RunSpec
from babysit.core.status import AttemptStatus, RunStatus
from babysit.db.store import Attempt
from babysit.run.context import DaemonContext
from babysit.run.run_exit import RunExits
from babysit.run.run_guard import RunGuard
from babysit.run.run_launch import RunLauncher
from babysit.run.run_log import RunLog
from babysit.run.run_observe import RunObserver
from babysit.run.run_polls import RunPolls
from babysit.run.run_posts import RunPosts
from babysit.run.run_verdict import RunVerdicts, verdict_key
from babysit.run.stackdump import stack_dump
from babysit.runtime.faults import crash_point

log = structlog.get_logger("babysit.run.supervisor")


class RunSupervisor:
    """The run's state (the machine's `RunState`, the current attempt's row, the spec of the attempt) and
    its parts, each of which reads that state through this object; the daemon asks only public methods."""

    def __init__(self, ctx: DaemonContext, spec: RunSpec, registered_prereg_sha256: str | None) -> None:
        self.ctx = ctx
        self.spec = spec
        self.run = spec.name
        self.executor = ctx.executors[spec.executor]
        self.declared_gpus = spec.gpus  # spec.gpus is the attempt's: a quarantined GPU may be swapped out
        self.lock = threading.RLock()
        self.attempt: Attempt | None = None
        self.launch_msg: int | None = None
        status, facts = ctx.store.run_state(self.run)
        # the run's one state, which every part reads: its status now, the whole of it read back at start()
        self.state = run_machine.RunState(spec=spec, status=RunStatus.of(status))
        self.posts = RunPosts(self.run, ctx.store, ctx.now)  # its outbox writes, held while refused
        self.errors_logged: set[str] = set()  # digests of the internal errors already logged: one traceback each
        self.verdicts = RunVerdicts(spec, registered_prereg_sha256, ctx, message=self.message,
                                    posted=self.posts.posted, internal_error=self.internal_error, feed=self.feed,
                                    read_log=lambda: self.runlog.read_log(drain=True),  # the FINAL one reads all
                                    attempt_n=lambda: self.attempt.n if self.attempt else None)
        self.runlog = RunLog(self, facts, check_guards=lambda: self.guarding.guard())  # the reader, what it tells
        self.observer = RunObserver(self, self.runlog)  # one look at the attempt: what guards and polls decide on
        self.guarding = RunGuard(self, self.observer)  # the live check
        self.polls = RunPolls(self, self.runlog, self.observer)  # its poll calendar's entry
        self.exits = RunExits(self, self.runlog)  # an attempt's end: watched, drained, classified, decided
        self.launcher = RunLauncher(self, self.runlog, self.observer)  # an attempt launched, or adopted

    # -- state ------------------------------------------------------------------------------------------
    @property
    def status(self) -> RunStatus:
        """The run's status as its machine has it (the store holds what its `SetStatus` effects wrote)."""
        return self.state.status

    def is_active(self) -> bool:
        return not self.state.status.terminal

    def is_running(self) -> bool:
        """Its current attempt runs (no store query: what the daemon's rounds ask of every run)."""
        return self.attempt is not None and self.attempt.status == AttemptStatus.RUNNING

    def message(self, kind: str, payload: dict[str, Any], key: str, thread: bool = True) -> int | None:
        """Queue a post (in the launch post's thread unless not `thread`); its outbox id, None while the
        outbox refuses it (held: babysit/run/run_posts.py). Never raises: a post never turns a run's outcome."""
        thread_of = self.launch_msg if thread else None
        thread_key = self.posts.held_key("launch") if thread and thread_of is None else None
        return self.posts.post(kind, {"run": self.run, **payload}, key, thread_of=thread_of, thread_key=thread_key)

    def incident(self, kind: str, message: str, detail: dict[str, Any], key: str) -> None:
        """Record an incident on this run's current attempt and post it, once per `key`."""
        n = self.attempt.n if self.attempt else None
        if self.posts.posted(key):  # a restarted daemon redoing this step: already recorded
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
                self.ctx.store.set_run_state(self.run, e.status.value, self.ctx.now(), **e.facts)
                if e.status.ended:
                    log.info("run over", run=self.run, status=e.status.value, reason=e.facts.get("end_reason"))
            case ev.Launch():
                self.launcher.launch(e.n, resume=e.resume, halvings=e.halvings, note=e.note)
            case ev.Adopt():
                self.launcher.adopt(self.ctx.store.attempt(self.run, e.n))
            case ev.Post(kind="launch"):
                self.launch_msg = self.launcher.launch_message(self._row(e.n), e.note)
            case ev.Post():
                self._ended_message(self._row(e.n))
            case ev.Watch():
                self.exits.watch()
                self.polls.schedule_next()
            case ev.Incident():
                self._raise(e)
            case ev.NoteAttempt():
                self.ctx.store.merge_attempt_detail(self._row(e.n).id, dict(e.facts))
            case ev.RecordExit():
                row = self.ctx.store.attempt(self.run, e.n)
                self.ctx.store.mark_ended(row.id, ended_at=e.ended_at, outcome=e.outcome, exit_code=e.exit_code,
                                          exit_signal=e.signal, detail=dict(e.detail))
                crash_point("after-mark-ended")
                self.attempt = self.ctx.store.attempt(self.run, e.n)
            case ev.Signal():
                self.send_stop(self._row(e.n), e.stop, e.kill_after)
            case ev.NoteStop():
                self.ctx.store.merge_run_facts(self.run, self.ctx.now(), stop=e.stop.to_dict())
            case ev.ArmKill():
                self.arm_kill(self._row(e.n), e.delay)
            case ev.Kill():
                log.warning("grace period over: SIGKILL", run=self.run, attempt=e.n,
                            grace_s=self.spec.guards.stop_grace_seconds)
                self.executor.kill(self._row(e.n))  # its whole tree, or scancel
            case ev.Recheck():
                self.guarding.recheck_soon(e.action)
            case ev.TakePoll():
                if self.polls.now_alone("on-demand"):
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
        if e.unless_raised is not None and self.posts.posted(e.unless_raised):
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

    # -- the stop ---------------------------------------------------------------------------------------
    def send_stop(self, attempt: Attempt, stop: ev.StopOrder, grace: float) -> None:
        """The stop signal (on the asker's thread, outside the run's lock), the SIGKILL armed first for
        `grace` seconds on (a stop that fails, scancel refused, still ends in one); then `StopSent`: a
        daemon that died before it sends the signal on adoption, one that died after does not."""
        self.arm_kill(attempt, grace)
        sent_at = self.ctx.now()  # before the signal: a trainer may save within the same millisecond
        self.executor.stop(attempt, signal.Signals[stop.signal])
        self.feed(ev.StopSent(self.ctx.now(), attempt.n, sent_at))

    def arm_kill(self, attempt: Attempt, delay: float) -> None:
        """In `delay` seconds the machine is told the grace period is over, and whether the attempt exited
        (`StopGraceOver`: it says `Kill` only of one still alive)."""
        n = attempt.n

        def grace_over() -> None:
            self.feed(ev.StopGraceOver(self.ctx.now(), n, exited=self.executor.wait(attempt, 0)))

        self.later(f"kill:{self.run}", delay, grace_over, "killing it after the grace period")

    # -- start ------------------------------------------------------------------------------------------
    def start(self) -> None:
        """Adopt a live attempt, finish one that ended while the daemon was down, or launch: the store's
        state fed to the run's transition as `Registered` (run_machine), as a restarted daemon does."""
        with self.lock:
            self.verdicts.check_prereg()
            now = self.ctx.now()
            self.read_state()
            n = self.state.undecided
            if n is not None:  # the machine decides after attempt n's exit: an error there ends the run
                self.exits.deciding(ev.Registered(now), n, f"deciding after attempt {n}'s exit")
                return
            self.feed(ev.Registered(now))

    def read_state(self) -> None:
        """The run's state read back from the store, whose rows are the truth (every fact is written before
        it is acted on): at start, and after an internal error that may have left the machine ahead of them."""
        status, facts = self.ctx.store.run_state(self.run)
        attempts = tuple(attempt_state(a) for a in self.ctx.store.attempts(self.run))
        self.state = run_machine.RunState.restore(
            self.spec, status=status, attempts=attempts, stop=facts.get("stop"),
            verdict_posted=self.posts.posted(verdict_key(self.run)),  # queued, or held while the outbox refused it
            now=self.ctx.now(), relaunched=facts.get("relaunched"))

    # -- what the parts share ---------------------------------------------------------------------------
    def later(self, key: str, delay: float, fn: Callable[[], None], where: str) -> None:
        """`fn` on the daemon's timers in `delay` real seconds: an error is this run's (logged, or an
        internal-error incident), never the timer thread's."""
        def run() -> None:
            try:
                fn()
            except Exception as exc:
                self.failed(where, exc)

        self.ctx.timers.call_at(key, self.ctx.now() + delay, run)

    def use_gpus(self, gpus: Any) -> None:
        """The attempt's GPUs (recorded on it when they differ from the declared ones)."""
        chosen = tuple(int(g) for g in gpus) if gpus else self.declared_gpus
        if chosen != self.spec.gpus:
            self.spec = dataclasses.replace(self.spec, gpus=chosen)

    def _forget(self) -> None:
        """The run is over: nothing of it stays scheduled, and its GPU poll window stops being fed."""
        self.ctx.polls.cancel(self.run)
        for key in (f"kill:{self.run}", f"recheck:{self.run}", f"exit-check:{self.run}", f"gpu-wait:{self.run}",
                    f"reading:{self.run}", f"nonfinite:{self.run}"):
            self.ctx.timers.cancel(key)
        self.ctx.gpu_probe.close_window(self.observer.poll_window)

    def internal_error(self, where: str, exc: BaseException) -> None:
        """An exception met while handling this run: the traceback to the daemon log, an `internal-error`
        incident (once per attempt, place and error) to the channel. One run's bad data never stops the
        daemon or the other runs. Never raises."""
        error = short_error(exc)
        n = self.attempt.n if self.attempt else None
        digest = hashlib.sha256(f"{n}\n{where}\n{error}".encode()).hexdigest()[:16]
        if digest in self.errors_logged:  # a job meeting the same error every tick: one traceback per daemon
            return
        self.errors_logged.add(digest)
        log.error("internal error", run=self.run, where=where, error=error, exc_info=exc)
        try:
            self.incident("internal-error", f"babysit failed while {where}: {error} (traceback in daemon.log); "
                          "the daemon and the other runs go on", {"where": where, "error": error},
                          key=f"{self.run}:internal-error:{digest}")
        except Exception:
            self.errors_logged.discard(digest)  # recorded next time it happens
            log.exception("could not record the internal error", run=self.run, where=where)

    # -- what the daemon asks ---------------------------------------------------------------------------
    def failed(self, where: str, exc: BaseException) -> None:
        """An error met on this run by a job: a BabysitError (the store failing, a refused read) is logged and
        the job comes again; anything else is an internal error. Never raises."""
        if isinstance(exc, BabysitError):
            log.error(f"{where} failed", run=self.run, error=exc.message, exc_info=exc)
        else:
            self.internal_error(where, exc)

    def retry_posts(self) -> None:
        """The posts the outbox refused, queued now if it takes rows again (the guard round's backstop)."""
        if not self.posts.held:  # the common case: no lock, no query
            return
        with self.lock:  # a poll's posts (run_polls.after_poll) thread under the launch post once it is queued
            queued = self.posts.retry()
            attempt = self.attempt
            if self.launch_msg is None and attempt is not None:  # its launch post queued: the thread's parent
                self.launch_msg = queued.get(f"{self.run}:{attempt.n}:launch", self.launch_msg)

    def retry_verdict(self) -> None:
        """A FINAL verdict the store refused to save or queue, done again (the guard round's backstop)."""
        if self.verdicts.unposted is not None or self.verdicts.final_failed or self.verdicts.campaign_waits:
            with self.lock:
                self.verdicts.retry()

    def guard(self) -> None:
        """The live check (babysit/run/run_guard.py): foreign GPU processes, GPU-hour cap, stalls, divergence,
        host memory."""
        self.guarding.guard()

    def request(self, kind: str, by: str = "?", request_id: int | None = None) -> str:
        """A control request (`abort`, `poll-now`) through the run's transition; returns the answer for
        the asker. The stop signal and the poll are sent after the run's lock is released, on the
        asker's thread."""
        event = ev.Request(self.ctx.now(), "poll" if kind == "poll-now" else kind, by, request_id)
        return self.feed(event, defer=(ev.Signal, ev.TakePoll)) or "not running"


def attempt_state(a: Attempt) -> run_machine.AttemptState:
    """One attempt row as the machine knows it (its detail holds what its exit and the guards noted)."""
    d = a.detail
    return run_machine.AttemptState(
        n=a.n, profile=a.profile, status=AttemptStatus(a.status), gpus=a.gpus, started_at=a.started_at,
        ended_at=a.ended_at, outcome=a.outcome, retry_override=d.get("retry_override"),
        stopped_by=d.get("stopped_by"), host_memory_pressure=bool(d.get("host_memory_pressure")),
        halvings=int(d.get("halvings", 0)), nonfinite=d.get("nonfinite"), summary=d.get("summary"), detail=d)
