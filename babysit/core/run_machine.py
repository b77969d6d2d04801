"""A run's life as one pure transition: `step(state, event) -> (state, effects)`.

The Elm architecture: the run's state is one frozen value, everything that happens to it is an
event, and everything babysit does about it is an effect the shell carries out (babysit/run/supervisor.py
and the parts it owns). No clock, no store, no process here: the events carry the times and what the
shell saw, the effects say what to write, post, launch, signal or kill.

Life cycle (the statuses are `RunStatus`):

    Registered ─▶ Launch ─▶ Launched ─▶ RUNNING ──ExitSeen──▶ decide ─▶ retry: RETRYING ─▶ Launch …
        │           ├─LaunchRefused─▶ REFUSED       │                 └▶ FINISHED | FAILED | STOPPED
        │           └─WaitingForGpu─▶ WAITING_GPU   ├─GuardReading(stop) / Request(abort) ─▶ STOPPING
        │                                          │    ─▶ Signal ─▶ StopSent ─▶ NoteStop
        └─ a live attempt: Adopt ─▶ Adopted         └─StopGraceOver (still alive) ─▶ Kill

A restarted daemon restores the state from the store (`RunState.restore`) and feeds `Registered`:
adoption, a decision a dead daemon did not get to (`RunState.undecided`), or a first launch all come
from this one function; the shell only chooses how an error in that decision is handled.

Invariants (tests/test_run_machine.py drives random event sequences through `step`): at most one
live attempt; the stop signal only to a running attempt not already being stopped; one outcome per
attempt, never changed; a next attempt only as `retry.next_attempt` allows (`[retry].on`,
`max_attempts`, the profiles; a guard stop never); GPU-hours never decrease; the FINAL verdict posted
once.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any

from babysit.core import progress, retry
from babysit.core import run_events as ev
from babysit.core.spec.run_toml import RunSpec
from babysit.core.status import AttemptStatus, Outcome, RunStatus

# Outcomes that end a run as something else than `failed` when nothing retries them.
_FINAL_OF = {Outcome.COMPLETED: RunStatus.FINISHED, Outcome.STOPPED: RunStatus.STOPPED}
# Outcomes that are not failures: no incident of their own when the attempt ends.
QUIET_OUTCOMES = (Outcome.COMPLETED, Outcome.STOPPED)
# Statuses in which a run whose last attempt ended has no next attempt launched yet: a daemon died
# between recording the exit and deciding, or the next attempt waits for a quarantined GPU.
_UNDECIDED = (RunStatus.RUNNING, RunStatus.RETRYING, RunStatus.STOPPING, RunStatus.WAITING_GPU)
# The answer to an abort of a run whose stop is already under way (another abort's, a guard's).
ALREADY_STOPPING = "already stopping"


@dataclass(frozen=True)
class AttemptState:
    """What the machine knows of one attempt (the store's `Attempt` row holds the rest)."""

    n: int
    profile: str
    status: AttemptStatus = AttemptStatus.LAUNCHING
    gpus: int = 0
    started_at: float | None = None
    ended_at: float | None = None
    outcome: str | None = None
    retry_override: bool | None = None  # a [[classify]] rule's retry = true/false
    stopped_by: str | None = None  # the stop that decided the outcome (abort, a guard)
    host_memory_pressure: bool = False
    halvings: int = 0  # how many times this attempt's [machinery] knobs were halved
    warned: frozenset[str] = frozenset()  # guard actions already raised this attempt (warn once)
    nonfinite: str | None = None  # a watched metric that went NaN/inf in the log this attempt
    summary: str | None = None  # the exit's one line (an ended attempt)
    detail: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}), compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "detail", ev.frozen(self.detail))

    @property
    def live(self) -> bool:
        return self.status.live

    def gpu_seconds(self, now: float) -> float:
        """Derived, never accumulated: from its start to its end (to `now` while it runs)."""
        if self.started_at is None:
            return 0.0
        end = self.ended_at if self.ended_at is not None else max(now, self.started_at)
        return max(0.0, end - self.started_at) * self.gpus

    def past(self) -> retry.PastAttempt:
        """The attempt as the retry rule reads it."""
        return retry.PastAttempt(n=self.n, profile=self.profile, outcome=self.outcome or Outcome.CRASHED,
                                 retry_override=self.retry_override, guard_stop=retry.is_guard_stop(self.stopped_by),
                                 host_memory_pressure=self.host_memory_pressure, halved_knobs=self.halvings)


@dataclass(frozen=True)
class RunState:
    """One run: its spec, status, attempts (oldest first), the stop in force, whether FINAL was posted."""

    spec: RunSpec = field(compare=False, repr=False)
    status: RunStatus = RunStatus.PENDING
    attempts: tuple[AttemptState, ...] = ()
    stop: ev.StopOrder | None = None
    verdict_posted: bool = False
    clock: float = 0.0  # the newest event's time: a live attempt's GPU-time is counted to it
    relaunch: ev.Relaunch | None = None  # `babysit relaunch`: attempts after `after` are a new sequence

    @property
    def run(self) -> str:
        return self.spec.name

    @classmethod
    def restore(cls, spec: RunSpec, *, status: str, attempts: tuple[AttemptState, ...],
                stop: Mapping[str, Any] | None, verdict_posted: bool, now: float,
                relaunched: Mapping[str, Any] | None = None) -> RunState:
        """The state a restarted daemon reads back from the store (then feeds `Registered`)."""
        return cls(spec=spec, status=RunStatus.of(status), attempts=tuple(sorted(attempts, key=lambda a: a.n)),
                   stop=ev.StopOrder.from_dict(stop, spec.stop_signal), verdict_posted=verdict_posted, clock=now,
                   relaunch=ev.Relaunch.from_dict(relaunched))

    @property
    def relaunched_after(self) -> int:
        """The attempt after which the run was last relaunched (0: never)."""
        return self.relaunch.after if self.relaunch is not None else 0

    @property
    def last(self) -> AttemptState | None:
        return self.attempts[-1] if self.attempts else None

    @property
    def live_attempt(self) -> AttemptState | None:
        last = self.last
        return last if last is not None and last.live else None

    @property
    def running_attempt(self) -> AttemptState | None:
        """The attempt a poll, a guard or a stop acts on: running (launched, not ended)."""
        last = self.last
        return last if last is not None and last.status is AttemptStatus.RUNNING else None

    @property
    def undecided(self) -> int | None:
        """The ended attempt after which `Registered` decides what comes next: its exit recorded, no next
        attempt launched yet (a daemon died in between, or a GPU is waited for); else None."""
        last = self.last
        return last.n if last is not None and not last.live and self.status in _UNDECIDED else None

    @property
    def stopping(self) -> bool:
        live = self.live_attempt
        return live is not None and self.stop is not None and self.stop.attempt == live.n

    def attempt(self, n: int) -> AttemptState | None:
        for a in self.attempts:
            if a.n == n:
                return a
        return None

    def gpu_hours(self, now: float | None = None) -> float:
        """GPU-hours used over every attempt, the live one counted to `now` (the newest event's time)."""
        at = self.clock if now is None else max(now, self.clock)
        return progress.gpu_hours_used(self.attempts, at)  # the rule status and polls apply

    def history(self) -> tuple[retry.PastAttempt, ...]:
        return tuple(a.past() for a in self.attempts if a.status is AttemptStatus.ENDED)


Step = tuple[RunState, tuple[ev.Effect, ...]]


# -- the transition -------------------------------------------------------------------------------------
def step(state: RunState, event: ev.Event) -> Step:
    """The one transition of a run. Unknown or stale events (an exit of an attempt already ended, a
    grace period of an attempt gone) change nothing and do nothing."""
    state = replace(state, clock=max(state.clock, event.at))
    handler = _HANDLERS[type(event)]
    return handler(state, event)


def _registered(s: RunState, e: ev.Registered) -> Step:
    last = s.last
    if last is not None and last.live:
        return s, (ev.Adopt(last.n),)
    if s.status.ended:
        return s, () if s.verdict_posted else (ev.ReadVerdict(full=True),)
    if s.status is RunStatus.RELAUNCHING and last is not None:  # `babysit relaunch`: a new sequence of attempts
        by = s.relaunch.by if s.relaunch is not None else "?"
        return s, (ev.Launch(last.n + 1, resume=s.relaunch is not None and s.relaunch.resume, halvings=0,
                             note=f"relaunched by {by} after attempt {last.n}"),)
    if last is not None and s.undecided is not None:
        return _decide(s, last)  # the daemon died between recording the exit and deciding (or waited for a GPU)
    return s, (_launch_next(s, resume=False, halvings=0, note=None),)


def _launch_next(s: RunState, *, resume: bool, halvings: int, note: str | None) -> ev.Launch:
    last = s.last
    return ev.Launch(1 if last is None else last.n + 1, resume=resume, halvings=halvings, note=note)


def _launched(s: RunState, e: ev.Launched) -> Step:
    live = s.live_attempt
    if live is not None and live.n != e.n:
        return s, ()  # never two live attempts: a stale launch report
    known = s.attempt(e.n)
    if known is not None and not known.live:
        return s, ()  # ended already
    attempt = AttemptState(e.n, e.profile, AttemptStatus.RUNNING, gpus=e.gpus, started_at=e.started_at,
                           halvings=e.halvings)
    attempts = (*(a for a in s.attempts if a.n != e.n), attempt)
    s = replace(s, attempts=tuple(sorted(attempts, key=lambda a: a.n)), status=RunStatus.RUNNING, stop=None)
    return s, (ev.SetStatus(RunStatus.RUNNING, {"attempt": e.n}), ev.Post("launch", e.n, e.note), ev.Watch(e.n))


def _refused(s: RunState, e: ev.LaunchRefused) -> Step:
    if s.live_attempt is not None or not e.refusals:
        return s, ()
    effects: list[ev.Effect] = [ev.Incident(a.incident, "launch refused: " + a.message, dict(a.detail),
                                      key=f"{s.run}:{e.n}:refused:{int(e.at)}") for a in e.refusals]
    effects.append(ev.SetStatus(RunStatus.REFUSED, {"refused": e.refusals[0].message}))
    return replace(s, status=RunStatus.REFUSED), tuple(effects)


def _waiting_for_gpu(s: RunState, e: ev.WaitingForGpu) -> Step:
    if s.live_attempt is not None:
        return s, ()
    which = ", ".join(f"GPU {g}" for g in e.waiting_for)
    message = (f"attempt {e.n} waits: {which} quarantined (`babysit gpu release` lifts it once the GPU is reset); "
               "declare gpus = \"any N\" or spare_gpus to run on another")
    return replace(s, status=RunStatus.WAITING_GPU), (
        ev.SetStatus(RunStatus.WAITING_GPU, {"waiting_for": list(e.waiting_for)}),
        ev.Incident("gpu-quarantined", message, {"waiting_for": list(e.waiting_for), "attempt": e.n},
                    key=f"{s.run}:{e.n}:waiting-gpu"))


def _adopted(s: RunState, e: ev.Adopted) -> Step:
    live = s.live_attempt
    if live is None or live.n != e.n:
        return s, ()
    started = e.started_at if e.started_at is not None else live.started_at
    s = _put(s, replace(live, status=AttemptStatus.RUNNING, started_at=started))
    stopping = s.stop is not None and s.stop.attempt == e.n
    status = RunStatus.STOPPING if stopping else RunStatus.RUNNING
    s = replace(s, status=status)
    effects: list[ev.Effect] = [ev.SetStatus(status, {"attempt": e.n}), ev.Post("launch", e.n), ev.Watch(e.n)]
    if stopping:
        assert s.stop is not None
        grace = s.spec.guards.stop_grace_seconds
        if s.stop.sent_at is None:  # the dead daemon recorded the stop, never sent it: a whole grace from now
            effects.append(ev.Signal(e.n, s.stop, grace))
        else:  # sent: the SIGKILL it had scheduled, with what is left of the grace period
            effects.append(ev.ArmKill(e.n, max(0.0, s.stop.sent_at + grace - e.at)))
    return s, tuple(effects)


def _records(s: RunState, e: ev.RecordsRead) -> Step:
    running = s.running_attempt
    effects: list[ev.Effect] = []
    if running is not None and running.n == e.n and e.nonfinite is not None and running.nonfinite is None:
        s = _put(s, replace(running, nonfinite=e.nonfinite))
        effects.append(ev.NoteAttempt(e.n, {"nonfinite": e.nonfinite}))
    if e.new_eval:
        effects.append(ev.ReadVerdict(full=False))
    return s, tuple(effects)


def _poll(s: RunState, e: ev.PollDue) -> Step:
    running = s.running_attempt
    return s, () if running is None else (ev.TakePoll(running.n, e.kind),)


def _guard(s: RunState, e: ev.GuardReading) -> Step:
    running = s.running_attempt
    if running is None or running.n != e.n or s.stopping:
        return s, ()
    if e.exited and any(a.kind == "stop" for a in e.actions):
        return s, ()  # it exited with its own code: that is its outcome, never a guard stop
    effects: list[ev.Effect] = []
    for action in e.actions:
        running = s.running_attempt
        assert running is not None
        if action.kind == "confirm":
            effects.append(ev.Recheck(e.n, action))
        elif action.kind in ("warn", "incident"):
            if action.key in running.warned:
                continue
            pressure = action.incident == "host-memory-pressure"
            s = _put(s, replace(running, warned=running.warned | {action.key},
                                host_memory_pressure=running.host_memory_pressure or pressure))
            if pressure:
                effects.append(ev.NoteAttempt(e.n, {"host_memory_pressure": True}))
            effects.append(ev.Incident(action.incident, action.message, dict(action.detail),
                                    key=f"{s.run}:{e.n}:{action.key}"))
        elif action.kind == "stop":
            effects.append(ev.Incident(action.incident, action.message, dict(action.detail),
                                    key=f"{s.run}:{e.n}:{action.incident}",
                                       stacks_of=e.run_pids if action.incident == "stalled" else None))
            s, stop = _stop(s, action.incident, e.at)
            effects += stop
    return s, tuple(effects)


def _stop(s: RunState, reason: str, at: float) -> Step:
    """A graceful stop of the running attempt: recorded (status stopping), then signalled."""
    running = s.running_attempt
    if running is None or s.stopping:
        return s, ()
    order = ev.StopOrder(running.n, reason, at, s.spec.stop_signal)
    s = replace(s, status=RunStatus.STOPPING, stop=order)
    return s, (ev.SetStatus(RunStatus.STOPPING, {"stop": order.to_dict()}),
               ev.Signal(running.n, order, s.spec.guards.stop_grace_seconds))


def _exit(s: RunState, e: ev.ExitSeen) -> Step:
    attempt = s.attempt(e.n)
    if attempt is None or not attempt.live:
        return s, ()  # seen twice (the watcher and the backstop): one outcome per attempt
    ended = replace(_end(attempt, e.outcome, e.ended_at if e.ended_at is not None else e.at),
                    retry_override=e.retry_override, stopped_by=e.stopped_by, summary=e.summary, detail=e.detail)
    s = _put(s, ended)
    record = ev.RecordExit(e.n, e.outcome, ended.ended_at, e.exit_code, e.signal, e.detail)
    s, decided = _decide(s, ended)
    return s, (record, *decided)


def _end(attempt: AttemptState, outcome: str, ended_at: float) -> AttemptState:
    start = attempt.started_at
    # an end is never before the start (a clock step backwards), so GPU-time is never negative
    end = ended_at if start is None else max(start, ended_at)
    return replace(attempt, status=AttemptStatus.ENDED, outcome=outcome, ended_at=end)


def _decide(s: RunState, attempt: AttemptState) -> Step:
    """After attempt's recorded end: say it, read the verdict, then the next attempt or the run's end."""
    outcome = attempt.outcome or Outcome.CRASHED
    effects: list[ev.Effect] = []
    if outcome in QUIET_OUTCOMES:
        effects.append(ev.Post("ended", attempt.n))
    else:  # one post for one crash: the incident says the attempt ended, why, and its stderr (unless a guard
        # that stopped it for this reason raised it already: then the end is posted on its own)
        effects.append(ev.Incident(outcome, attempt.summary or outcome, {**attempt.detail, "ended": True},
                                   key=f"{s.run}:{attempt.n}:exit", unless_raised=f"{s.run}:{attempt.n}:{outcome}",
                                   ends=attempt.n))
    if not s.verdict_posted:
        effects.append(ev.ReadVerdict(full=True))
    after = s.relaunched_after
    decision = retry.next_attempt(s.history(), s.spec, after)
    if decision.retry and decision.n is not None and decision.profile is not None:
        effects += [ev.SetStatus(RunStatus.RETRYING, {"retry_reason": decision.reason}),
                    ev.Incident("retrying", f"attempt {decision.n}/{after + s.spec.retry.max_attempts} with profile "
                             f"'{decision.profile.profile}' ({decision.reason})",
                             {"attempt": decision.n, "profile": decision.profile.profile, "resume": decision.resume,
                              "halve_machinery": decision.halve_machinery},
                             key=f"{s.run}:{decision.n}:retrying"),
                    ev.Launch(decision.n, decision.resume, decision.halvings, f"retry: {decision.reason}")]
        return replace(s, status=RunStatus.RETRYING), tuple(effects)
    final = _FINAL_OF.get(outcome, RunStatus.FAILED)
    effects += [ev.SetStatus(final, {"ended": outcome, "end_reason": decision.reason}), ev.Forget()]
    return replace(s, status=final), tuple(effects)


def _internal_error(s: RunState, e: ev.InternalError) -> Step:
    attempt = s.attempt(e.n)
    if attempt is None:
        return s, ()
    effects: list[ev.Effect] = []
    if attempt.live:
        detail = {"summary": f"exit not classified: internal error ({e.error})", "retry_override": False,
                  "internal_error": e.error}
        attempt = replace(_end(attempt, Outcome.CRASHED, e.ended_at if e.ended_at is not None else e.at),
                          retry_override=False, summary=detail["summary"], detail=detail)
        s = _put(s, attempt)
        effects.append(ev.RecordExit(e.n, Outcome.CRASHED, attempt.ended_at, e.exit_code, e.signal, detail))
    last = s.last
    if last is not None and last.n == e.n and not s.status.terminal:
        reason = f"internal error after attempt {e.n}'s exit: {e.error}"
        effects += [ev.SetStatus(RunStatus.FAILED, {"ended": attempt.outcome, "end_reason": reason}), ev.Forget()]
        s = replace(s, status=RunStatus.FAILED)
    return s, tuple(effects)


def _request(s: RunState, e: ev.Request) -> Step:
    if e.kind == "abort":
        s2, stop = _stop(s, "abort", e.at)
        if not stop:  # a stop already under way is not sent again (its answer says so, not "not running")
            return s, (ev.Reply(e.id, ALREADY_STOPPING if s.stopping and s.running_attempt else "not running"),)
        incident = ev.Incident("abort", f"abort requested by {e.by}", {"requested_by": e.by},
                            key=f"{s.run}:abort:{e.id}")
        return s2, (*stop, incident, ev.Reply(e.id, "stopping"))
    if e.kind == "poll":
        running = s.running_attempt
        if running is None:
            return s, (ev.Reply(e.id, "not running"),)
        return s, (ev.TakePoll(running.n, "on-demand"),)  # the shell answers with the poll's result
    return s, (ev.Reply(e.id, f"unknown action {e.kind}"),)


def _verdict(s: RunState, e: ev.VerdictRead) -> Step:
    if s.verdict_posted or e.body.get("status") != "FINAL":
        return s, ()
    effects: tuple[ev.Effect, ...] = (ev.SaveVerdict(e.body, e.stored), ev.Chart(e.body), ev.PostVerdict(e.body))
    return replace(s, verdict_posted=True), effects


def _grace_over(s: RunState, e: ev.StopGraceOver) -> Step:
    attempt = s.attempt(e.n)
    if e.exited or attempt is None or not attempt.live:
        return s, ()
    return s, (ev.Kill(e.n),)


def _stop_sent(s: RunState, e: ev.StopSent) -> Step:
    if s.stop is None or s.stop.attempt != e.n or s.stop.sent_at is not None:
        return s, ()
    order = replace(s.stop, sent_at=e.sent_at)
    return replace(s, stop=order), (ev.NoteStop(order),)


def _put(s: RunState, attempt: AttemptState) -> RunState:
    return replace(s, attempts=tuple(attempt if a.n == attempt.n else a for a in s.attempts))


_HANDLERS: dict[type, Any] = {
    ev.Registered: _registered, ev.Launched: _launched, ev.LaunchRefused: _refused,
    ev.WaitingForGpu: _waiting_for_gpu, ev.Adopted: _adopted,
    ev.RecordsRead: _records, ev.PollDue: _poll, ev.GuardReading: _guard, ev.ExitSeen: _exit,
    ev.InternalError: _internal_error, ev.Request: _request, ev.VerdictRead: _verdict, ev.StopGraceOver: _grace_over,
    ev.StopSent: _stop_sent,
}
