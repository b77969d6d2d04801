"""The run's transition function, driven by random event sequences (hypothesis) and by examples.

A small stand-in shell carries out the effects the way babysit/run/supervisor.py does (a Launch is
answered by Launched or LaunchRefused, an Adopt by Adopted, a ReadVerdict by a verdict or none) and
keeps what the store would hold; a "crash" drops the rest of a step's effects, restores the state from
that store and feeds Registered, as a restarted daemon does. The invariants are checked against an
oracle written here from docs/guards.md (Retries), not by calling the rule under test.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from babysit.core import run_events as ev
from babysit.core import run_machine as m
from babysit.core.guards import Action
from babysit.core.spec.run_toml import AttemptProfile, GuardsSpec, RetrySpec, RunSpec
from babysit.core.status import AttemptStatus, RunStatus

OUTCOMES = ("completed", "stopped", "oom", "diverged", "crashed", "stalled", "gpu-fault")
STOPS = ("gpu-held", "gpu-hours-cap", "stalled", "diverged", "gpu-fault")
NEVER_RETRIED = {"gpu-held", "gpu-hours-cap", "abort"}  # docs/guards.md: a guard stop is never retried
FINAL = {"status": "FINAL", "label": "HELPS", "delta": 0.1}


def spec(max_attempts=3, on=("oom", "diverged"), profiles=2, knobs=("--num-workers",), grace=30.0) -> RunSpec:
    return RunSpec(
        name="r", command=("python", "train.py", "--num-workers", "8"), log=Path("/tmp/r.jsonl"),
        spec_file=Path("/tmp/run.toml"), workdir=Path("/tmp"), checkpoints=Path("/tmp/c"), gpus=(0, 1),
        guards=GuardsSpec(stop_grace_seconds=grace), retry=RetrySpec(max_attempts=max_attempts, on=tuple(on)),
        attempts=tuple(AttemptProfile(f"p{i}") for i in range(1, profiles + 1)), machinery_knobs=tuple(knobs))


specs = st.builds(spec, max_attempts=st.integers(1, 4), on=st.sets(st.sampled_from(OUTCOMES)).map(sorted),
                  profiles=st.integers(0, 3), knobs=st.sampled_from(((), ("--num-workers",))),
                  grace=st.sampled_from((0.0, 5.0, 30.0)))


@dataclass
class World:
    """What the store holds, written only by effects (and by the shell's launches): a crash keeps it."""

    status: RunStatus = RunStatus.PENDING
    attempts: dict[int, m.AttemptState] = field(default_factory=dict)
    stop: dict | None = None
    relaunched: dict | None = None
    saved: bool = False
    posted: int = 0
    signals: list[int] = field(default_factory=list)
    kills: list[int] = field(default_factory=list)
    outcomes: dict[int, str] = field(default_factory=dict)


class Violation(AssertionError):
    pass


class Died(Exception):
    """The daemon died before an effect: every step in flight dies with it (a nested one's callers too)."""


def check(cond: bool, what: str) -> None:
    if not cond:
        raise Violation(what)


def allowed_next(prev: m.AttemptState, sp: RunSpec, after: int = 0,
                 ended: tuple[m.AttemptState, ...] = ()) -> bool:
    """The oracle: may attempt prev.n + 1 follow prev's end? (docs/guards.md, Retries; after a relaunch
    after attempt `after`, attempts count from it: docs/spec.md, Relaunching). A gpu-fault has its own
    budget (retry.gpu_fault_max) and costs the method no attempt (`ended`: the sequence's ended attempts)."""
    if prev.outcome in ("completed", "stopped") or prev.stopped_by in NEVER_RETRIED:
        return False
    if prev.retry_override is False:
        return False
    if prev.retry_override is not True and prev.outcome not in sp.retry.on:
        return False
    faults = sum(1 for a in ended if a.n > after and a.outcome == "gpu-fault")
    if prev.outcome == "gpu-fault":
        return faults <= sp.retry.gpu_fault_max
    return prev.n < after + sp.retry.max_attempts + faults


class Driver:
    def __init__(self, sp: RunSpec, data: st.DataObject) -> None:
        self.spec, self.data = sp, data
        self.state = m.RunState(spec=sp)
        self.world = World()
        self.now = 0.0
        self.gpu_hours = 0.0
        self.crashes = 3  # at most this many daemon deaths mid-step an example

    def draw(self, strategy, label=None):
        return self.data.draw(strategy, label=label)

    # the shell ---------------------------------------------------------------------------------------
    def feed(self, event: ev.Event) -> None:
        before = self.state
        self.state, effects = m.step(self.state, event)
        self.check_state(before, event)
        for effect in effects:
            if self.crashes and self.draw(st.integers(0, 20), label="crash?") == 0:  # dies before this effect
                self.crashes -= 1
                raise Died
            self.apply(effect, before, event)

    def happen(self, event: ev.Event) -> None:
        """An event from the world, fed to the daemon; if it dies on the way, the next one starts."""
        try:
            self.feed(event)
        except Died:
            self.restart()

    def restart(self) -> None:
        """A daemon started on what the store holds (again, should it die starting)."""
        while True:
            w = self.world
            self.state = m.RunState.restore(self.spec, status=w.status, attempts=tuple(w.attempts.values()),
                                            stop=w.stop, verdict_posted=w.posted > 0, now=self.now,
                                            relaunched=w.relaunched)
            try:
                self.feed(ev.Registered(self.now))
                return
            except Died:
                continue

    def apply(self, effect: ev.Effect, before: m.RunState, cause: ev.Event) -> None:
        w, s = self.world, self.state
        if isinstance(effect, ev.SetStatus):
            w.status = effect.status
            if "stop" in effect.facts:
                w.stop = dict(effect.facts["stop"])
        elif isinstance(effect, ev.Launch):
            live = [a for a in w.attempts.values() if a.live]
            check(not live, f"launch of {effect.n} while {live} is live")
            last = max(w.attempts.values(), key=lambda a: a.n) if w.attempts else None
            check(effect.n == (last.n + 1 if last else 1), f"launch {effect.n} after {last}")
            if isinstance(cause, ev.ExitSeen) or (isinstance(cause, ev.Registered) and last is not None
                                                 and before.status in (RunStatus.RUNNING, RunStatus.RETRYING,
                                                                       RunStatus.STOPPING)):
                after = (w.relaunched or {}).get("after", 0)
                ended = tuple(a for a in w.attempts.values() if not a.live)
                check(last is not None and allowed_next(last, self.spec, after, ended),
                      f"retry after {last} not allowed")
                assert last is not None
                halve = last.host_memory_pressure and bool(self.spec.machinery_knobs)
                check(effect.halvings == last.halvings + halve, f"halvings {effect.halvings} after {last}")
                check(effect.resume == (self.spec.retry.resume == "latest-checkpoint"), "resume")
            if self.draw(st.integers(0, 5), label="refused?") == 0:
                self.feed(ev.LaunchRefused(self.now, effect.n, (Action("refuse", "gpu-held", "GPU 0 held"),)))
                return
            started = self.now
            w.attempts[effect.n] = m.AttemptState(effect.n, self.spec.profile_for(effect.n).profile,
                                                  AttemptStatus.RUNNING, gpus=len(self.spec.gpus),
                                                  started_at=started, halvings=effect.halvings)
            self.feed(ev.Launched(self.now, effect.n, self.spec.profile_for(effect.n).profile, len(self.spec.gpus),
                                 started, effect.halvings, effect.note))
        elif isinstance(effect, ev.Adopt):
            check(s.attempt(effect.n) is not None and s.attempt(effect.n).live, f"adopt of {effect.n}")
            self.feed(ev.Adopted(self.now, effect.n, None))
        elif isinstance(effect, ev.Signal):
            a = s.attempt(effect.n)
            check(a is not None and a.status is AttemptStatus.RUNNING, f"stop signal to {a}")
            check(effect.n not in w.signals, f"a stop signal sent twice to attempt {effect.n}")
            check(w.stop is not None and w.stop["attempt"] == effect.n and w.stop.get("sent_at") is None,
                  f"a stop signal never recorded, or sent twice: {w.stop}")
            w.signals.append(effect.n)
            w.stop = {**w.stop, "sent_at": self.now}  # recorded with the signal (the window between: not modelled)
            self.feed(ev.StopSent(self.now, effect.n, self.now))
        elif isinstance(effect, ev.NoteStop):
            check(w.stop is not None and w.stop["attempt"] == effect.stop.attempt, f"another stop noted: {effect}")
            w.stop = effect.stop.to_dict()
        elif isinstance(effect, ev.Kill):
            a = s.attempt(effect.n)
            check(a is not None and a.live, f"SIGKILL of {a}")
            w.kills.append(effect.n)
        elif isinstance(effect, ev.RecordExit):
            check(effect.n not in w.outcomes, f"attempt {effect.n} ended twice")
            w.outcomes[effect.n] = effect.outcome
            w.attempts[effect.n] = s.attempt(effect.n)
        elif isinstance(effect, ev.NoteAttempt):
            a = w.attempts.get(effect.n)
            if a is not None and "host_memory_pressure" in effect.facts:
                w.attempts[effect.n] = replace(a, host_memory_pressure=True)
        elif isinstance(effect, ev.ReadVerdict):
            if w.saved:
                self.feed(ev.VerdictRead(self.now, FINAL, stored=True))
            elif effect.full and self.draw(st.booleans(), label="final?"):
                self.feed(ev.VerdictRead(self.now, FINAL))
        elif isinstance(effect, ev.SaveVerdict):
            check(effect.stored or not w.saved, "the FINAL verdict saved twice")
            w.saved = True
        elif isinstance(effect, ev.PostVerdict):
            w.posted += 1
            check(w.posted == 1, "the FINAL verdict posted twice")

    # invariants after every step ---------------------------------------------------------------------
    def check_state(self, before: m.RunState, event: ev.Event) -> None:
        s = self.state
        check(sum(a.live for a in s.attempts) <= 1, f"two live attempts: {s.attempts}")
        check([a.n for a in s.attempts] == sorted({a.n for a in s.attempts}), "attempts out of order")
        for a in before.attempts:
            now = s.attempt(a.n)
            check(now is not None, f"attempt {a.n} forgotten after {event}")
            if a.outcome is not None:
                check(now.outcome == a.outcome, f"attempt {a.n}'s outcome changed {a.outcome} -> {now.outcome}")
        used = s.gpu_hours()
        check(used >= self.gpu_hours - 1e-9, f"GPU-hours went down {self.gpu_hours} -> {used} on {event}")
        self.gpu_hours = used
        if s.status.live:
            check(s.live_attempt is not None, f"{s.status} with no live attempt")

    # the world's events --------------------------------------------------------------------------------
    def tick(self) -> None:
        self.now += self.draw(st.sampled_from((0.0, 1.0, 7.0, 60.0)), label="dt")
        s = self.state
        live = s.live_attempt
        n = live.n if live is not None and self.draw(st.booleans(), label="the live one?") else \
            self.draw(st.integers(1, 4), label="n")
        kind = self.draw(st.sampled_from(("exit", "guard", "abort", "poll", "grace", "records", "restart",
                                          "verdict", "relaunch", "internal")), label="event")
        if kind == "exit":
            stop = s.stop if s.stop is not None and s.stop.attempt == n else None
            outcome = self.draw(st.sampled_from(OUTCOMES), label="outcome")
            stopped_by = stop.reason if stop is not None and self.draw(st.booleans(), label="stop decided") else None
            self.happen(ev.ExitSeen(self.now, n, outcome, f"{outcome}!", ended_at=self.now,
                                 retry_override=self.draw(st.sampled_from((None, None, True, False)), label="rule"),
                                 stopped_by=stopped_by))
        elif kind == "guard":
            actions = self.draw(st.lists(st.one_of(
                st.sampled_from(STOPS).map(lambda r: Action("stop", r, f"{r}!")),
                st.just(Action("warn", "host-ram-low", "ram low")),
                st.just(Action("incident", "host-memory-pressure", "pressure")),
                st.just(Action("confirm", "gpu-held", "seen once"))), max_size=3), label="actions")
            self.happen(ev.GuardReading(self.now, n, tuple(actions), exited=self.draw(st.booleans(), label="exited")))
        elif kind == "abort":
            self.happen(ev.Request(self.now, "abort", "ana", id=int(self.now)))
        elif kind == "poll":
            self.happen(ev.PollDue(self.now) if self.draw(st.booleans()) else ev.Request(self.now, "poll", id=1))
        elif kind == "grace":
            self.happen(ev.StopGraceOver(self.now, n, exited=self.draw(st.booleans(), label="gone")))
        elif kind == "records":
            self.happen(ev.RecordsRead(self.now, n, new_eval=self.draw(st.booleans()),
                                    nonfinite=self.draw(st.sampled_from((None, "loss = nan at step 3")))))
        elif kind == "restart":
            self.restart()
        elif kind == "verdict":  # as the shell reads one (run_verdict.read): a FINAL already saved comes stored
            final = self.draw(st.booleans())
            self.happen(ev.VerdictRead(self.now, FINAL if final else {"status": "PROVISIONAL"},
                                     stored=final and self.world.saved))
        elif kind == "relaunch":  # the daemon records `babysit relaunch` of an ended run, then starts it anew
            w = self.world
            if w.status.terminal and w.attempts:
                w.status = RunStatus.RELAUNCHING
                w.relaunched = {"after": max(w.attempts), "by": "ana", "resume": self.draw(st.booleans())}
                self.restart()
        elif kind == "internal":
            self.happen(ev.InternalError(self.now, n, "KeyError: 'x'", ended_at=self.now))


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sp=specs, data=st.data())
def test_random_event_sequences_keep_every_invariant(sp: RunSpec, data: st.DataObject) -> None:
    """At most one live attempt; a stop signal only to a running attempt, once; SIGKILL only of a live
    one; one outcome per attempt; a next attempt only as retry.on, max_attempts and the halvings allow
    (a guard stop never); GPU-hours never decrease; FINAL saved and posted once — across restarts."""
    driver = Driver(sp, data)
    driver.happen(ev.Registered(0.0))
    for _ in range(data.draw(st.integers(1, 30), label="events")):
        driver.tick()


class Scripted:
    """Draws for the driver without hypothesis: no crash, every launch starts, no FINAL verdict."""

    def draw(self, strategy, label=None):
        return {"crash?": 1, "refused?": 1, "final?": False}[label]


def drive_abort_then_oom(monkeypatch_target=None) -> None:
    driver = Driver(spec(on=("oom",)), Scripted())  # type: ignore[arg-type]
    driver.feed(ev.Registered(0.0))
    driver.feed(ev.Request(1.0, "abort", "ana", 1))
    driver.feed(ev.ExitSeen(2.0, 1, "oom", "oom while being stopped", stopped_by="abort"))


def test_the_driver_catches_a_machine_that_retries_a_guard_stop(monkeypatch) -> None:
    """The property test can fail: with the guard-stop rule removed, the retry it makes is caught."""
    drive_abort_then_oom()  # the real machine: no retry after an abort
    monkeypatch.setattr(m.retry, "is_guard_stop", lambda stopped_by: False)
    with pytest.raises(Violation, match="not allowed"):
        drive_abort_then_oom()


def test_the_driver_catches_a_stop_signalled_twice(monkeypatch) -> None:
    """… and a machine that forgets it is already stopping sends a second stop signal: caught."""
    real = m._stop
    monkeypatch.setattr(m, "_stop", lambda s, reason, at: real(replace(s, stop=None), reason, at))
    driver = Driver(spec(), Scripted())  # type: ignore[arg-type]
    driver.feed(ev.Registered(0.0))
    driver.feed(ev.Request(1.0, "abort", "ana", 1))
    with pytest.raises(Violation, match="sent twice"):
        driver.feed(ev.Request(2.0, "abort", "bo", 2))


# -- examples: each transition's shape ---------------------------------------------------------------------
def run_one(sp: RunSpec | None = None) -> m.RunState:
    state, effects = m.step(m.RunState(spec=sp or spec()), ev.Registered(0.0))
    assert effects == (ev.Launch(1, resume=False, halvings=0, note=None),)
    state, effects = m.step(state, ev.Launched(1.0, 1, "p1", 2, 1.0))
    assert [type(e) for e in effects] == [ev.SetStatus, ev.Post, ev.Watch]
    assert state.status is RunStatus.RUNNING and state.running_attempt is not None
    return state


def test_an_oom_is_retried_with_the_next_profile_and_a_completion_finishes_the_run() -> None:
    state = run_one()
    state, effects = m.step(state, ev.ExitSeen(10.0, 1, "oom", "CUDA out of memory", ended_at=10.0))
    kinds = [type(e).__name__ for e in effects]
    assert kinds == ["RecordExit", "Incident", "ReadVerdict", "SetStatus", "Incident", "Launch"]
    assert effects[1].ends == 1 and effects[1].detail["ended"], "one post says the attempt ended and why"
    assert state.status is RunStatus.RETRYING and effects[-1] == ev.Launch(2, False, 0, effects[-1].note)
    assert "oom is in retry.on" in effects[-1].note
    state, _ = m.step(state, ev.Launched(11.0, 2, "p2", 2, 11.0))
    state, effects = m.step(state, ev.ExitSeen(20.0, 2, "completed", "done", ended_at=20.0))
    assert effects[-2] == ev.SetStatus(RunStatus.FINISHED, {"ended": "completed", "end_reason": "attempt 2 completed"})
    assert isinstance(effects[-1], ev.Forget) and state.status is RunStatus.FINISHED
    assert state.gpu_hours() == (9.0 + 9.0) * 2 / 3600


def test_an_abort_signals_once_and_its_stop_is_never_retried() -> None:
    state = run_one(spec(on=("stopped", "oom")))
    state, effects = m.step(state, ev.Request(5.0, "abort", "ana", 7))
    assert state.status is RunStatus.STOPPING
    stop = ev.StopOrder(1, "abort", 5.0, "SIGTERM")
    assert effects == (ev.SetStatus(RunStatus.STOPPING, {"stop": stop.to_dict()}), ev.Signal(1, stop, 30.0),
                       ev.Incident("abort", "abort requested by ana", {"requested_by": "ana"}, key="r:abort:7"),
                       ev.Reply(7, "stopping"))
    assert m.step(state, ev.Request(6.0, "abort", "bo", 8))[1] == (ev.Reply(8, m.ALREADY_STOPPING),)
    assert m.step(state, ev.GuardReading(6.0, 1, (Action("stop", "stalled", "quiet"),)))[1] == ()
    state, effects = m.step(state, ev.ExitSeen(9.0, 1, "stopped", "stopped", stopped_by="abort", retry_override=True))
    assert not any(isinstance(e, ev.Launch) for e in effects) and state.status is RunStatus.STOPPED


def test_a_stop_sent_is_in_the_state_and_recorded_once() -> None:
    state, _ = m.step(run_one(), ev.Request(5.0, "abort", "ana", 7))
    state, effects = m.step(state, ev.StopSent(5.1, 1, sent_at=5.05))
    assert state.stop is not None and state.stop.sent_at == 5.05 and effects == (ev.NoteStop(state.stop),)
    assert m.step(state, ev.StopSent(5.2, 1, sent_at=5.2))[1] == ()  # sent once
    assert m.step(run_one(), ev.StopSent(5.2, 1, sent_at=5.2))[1] == ()  # no stop in force


def test_a_stalled_guard_stop_keeps_its_class_and_follows_retry_on() -> None:
    state = run_one(spec(on=("stalled",)))
    state, effects = m.step(state, ev.GuardReading(5.0, 1, (Action("stop", "stalled", "no record for 30 min"),)))
    assert effects[0] == ev.Incident("stalled", "no record for 30 min", {}, key="r:1:stalled",
                                       stacks_of=frozenset())
    state, effects = m.step(state, ev.ExitSeen(9.0, 1, "stalled", "stalled", stopped_by="stalled"))
    assert isinstance(effects[-1], ev.Launch) and effects[-1].n == 2
    ended = next(e for e in effects if isinstance(e, ev.Incident) and e.key == "r:1:exit")
    assert ended.unless_raised == "r:1:stalled"  # the guard said it already


def test_a_guard_stop_is_ignored_when_the_attempt_already_exited_with_its_own_code() -> None:
    state = run_one()
    after, effects = m.step(state, ev.GuardReading(5.0, 1, (Action("stop", "gpu-hours-cap", "over"),), exited=True))
    assert effects == () and after.status is RunStatus.RUNNING


def test_a_warning_is_raised_once_an_attempt_and_again_on_the_next() -> None:
    state = run_one(spec(on=("oom",)))
    warn = Action("incident", "host-memory-pressure", "RAM low")
    state, effects = m.step(state, ev.GuardReading(5.0, 1, (warn,)))
    assert effects == (ev.NoteAttempt(1, {"host_memory_pressure": True}),
                       ev.Incident("host-memory-pressure", "RAM low", {}, key="r:1:host-memory-pressure"))
    assert m.step(state, ev.GuardReading(6.0, 1, (warn,)))[1] == ()
    state, effects = m.step(state, ev.ExitSeen(9.0, 1, "oom", "oom"))
    assert effects[-1].halvings == 1  # [machinery] knobs halved after host-memory pressure
    state, _ = m.step(state, ev.Launched(10.0, 2, "p2", 2, 10.0, halvings=1))
    assert m.step(state, ev.GuardReading(11.0, 2, (warn,)))[1][-1].key == "r:2:host-memory-pressure"


def test_adoption_after_a_restart_resends_an_unsent_stop_or_arms_what_is_left_of_the_grace() -> None:
    sp = spec(grace=30.0)
    attempt = m.AttemptState(1, "p1", AttemptStatus.RUNNING, gpus=2, started_at=0.0)
    unsent = {"attempt": 1, "reason": "abort", "at": 5.0, "signal": "SIGTERM"}
    state = m.RunState.restore(sp, status="stopping", attempts=(attempt,), stop=unsent, verdict_posted=False, now=40)
    state, effects = m.step(state, ev.Registered(40.0))
    assert effects == (ev.Adopt(1),)
    state, effects = m.step(state, ev.Adopted(40.0, 1, None))
    assert state.status is RunStatus.STOPPING
    assert effects[-1] == ev.Signal(1, ev.StopOrder(1, "abort", 5.0, "SIGTERM"), 30.0)
    sent = {**unsent, "sent_at": 20.0}
    state = m.RunState.restore(sp, status="stopping", attempts=(attempt,), stop=sent, verdict_posted=False, now=40)
    state, _ = m.step(state, ev.Registered(40.0))
    assert m.step(state, ev.Adopted(40.0, 1, None))[1][-1] == ev.ArmKill(1, 10.0)


def test_a_restart_between_an_exit_and_its_decision_decides_once() -> None:
    ended = m.AttemptState(1, "p1", AttemptStatus.ENDED, gpus=2, started_at=0.0, ended_at=5.0, outcome="oom",
                           summary="oom")
    state = m.RunState.restore(spec(), status="running", attempts=(ended,), stop=None, verdict_posted=False, now=9)
    state, effects = m.step(state, ev.Registered(9.0))
    assert isinstance(effects[-1], ev.Launch) and effects[-1].n == 2 and state.status is RunStatus.RETRYING
    done = replace(ended, outcome="completed")
    state = m.RunState.restore(spec(), status="finished", attempts=(done,), stop=None, verdict_posted=True, now=9)
    assert m.step(state, ev.Registered(9.0))[1] == ()  # over, its verdict posted: nothing to do


def test_a_retry_waiting_for_a_quarantined_gpu_is_decided_again_after_a_restart() -> None:
    state = run_one()
    state, effects = m.step(state, ev.ExitSeen(10.0, 1, "oom", "oom", ended_at=10.0))
    assert state.undecided == 1 and isinstance(effects[-1], ev.Launch)  # until attempt 2 is launched
    state, effects = m.step(state, ev.WaitingForGpu(10.0, 2, (0,)))
    assert state.status is RunStatus.WAITING_GPU and state.undecided == 1
    assert effects[0] == ev.SetStatus(RunStatus.WAITING_GPU, {"waiting_for": [0]})
    assert effects[1].kind == "gpu-quarantined" and effects[1].key == "r:2:waiting-gpu"
    restarted = m.step(state, ev.Registered(70.0))[1]  # a daemon restarted meanwhile decides the retry again
    assert isinstance(restarted[-1], ev.Launch) and restarted[-1].n == 2
    live, _ = m.step(state, ev.Launched(71.0, 2, "p2", 2, 71.0))
    assert m.step(live, ev.WaitingForGpu(72.0, 3, (0,)))[1] == ()  # an attempt runs: a stale wait


def test_the_final_verdict_is_posted_once_and_a_stored_one_is_not_saved_again() -> None:
    state = run_one()
    state, effects = m.step(state, ev.VerdictRead(3.0, FINAL))
    assert [type(e) for e in effects] == [ev.SaveVerdict, ev.Chart, ev.PostVerdict] and not effects[0].stored
    assert m.step(state, ev.VerdictRead(4.0, FINAL))[1] == ()
    fresh = m.RunState(spec=spec(), status=RunStatus.FINISHED)
    assert m.step(fresh, ev.VerdictRead(4.0, FINAL, stored=True))[1][0] == ev.SaveVerdict(FINAL, True)
    assert m.step(fresh, ev.VerdictRead(4.0, {"status": "PROVISIONAL"}))[1] == ()


def test_grace_over_kills_only_a_live_attempt_that_has_not_exited() -> None:
    state = run_one()
    assert m.step(state, ev.StopGraceOver(40.0, 1, exited=False))[1] == (ev.Kill(1),)
    assert m.step(state, ev.StopGraceOver(40.0, 1, exited=True))[1] == ()
    state, _ = m.step(state, ev.ExitSeen(41.0, 1, "crashed", "boom"))
    assert m.step(state, ev.StopGraceOver(42.0, 1, exited=False))[1] == ()


def test_an_internal_error_ends_the_attempt_unclassified_and_fails_the_run() -> None:
    state = run_one()
    state, effects = m.step(state, ev.InternalError(5.0, 1, "KeyError: 'x'", ended_at=5.0))
    assert effects[0].outcome == "crashed" and effects[0].detail["internal_error"] == "KeyError: 'x'"
    assert effects[1].status is RunStatus.FAILED and state.status is RunStatus.FAILED


def test_a_refused_launch_is_refused_and_a_restart_tries_again() -> None:
    state, _ = m.step(m.RunState(spec=spec()), ev.Registered(0.0))
    state, effects = m.step(state, ev.LaunchRefused(0.0, 1, (Action("refuse", "gpu-held", "GPU 0 held by pid 7"),)))
    assert state.status is RunStatus.REFUSED
    assert effects[-1] == ev.SetStatus(RunStatus.REFUSED, {"refused": "GPU 0 held by pid 7"})
    assert m.step(state, ev.Registered(60.0))[1] == (ev.Launch(1, False, 0, None),)


def test_a_relaunched_run_starts_a_new_sequence_whose_attempts_count_from_the_relaunch() -> None:
    sp = spec(max_attempts=2, on=("oom",))
    done = (m.AttemptState(1, "p1", AttemptStatus.ENDED, outcome="oom"), m.AttemptState(2, "p2", AttemptStatus.ENDED,
                                                                                        outcome="oom"))
    state = m.RunState.restore(sp, status="relaunching", attempts=done, stop=None, verdict_posted=False, now=9,
                               relaunched={"after": 2, "by": "ana", "resume": True})
    state, effects = m.step(state, ev.Registered(9.0))
    assert effects == (ev.Launch(3, True, 0, "relaunched by ana after attempt 2"),)
    state, _ = m.step(state, ev.Launched(10.0, 3, "p1", 2, 10.0))
    state, effects = m.step(state, ev.ExitSeen(11.0, 3, "oom", "oom"))
    assert effects[-1].n == 4 and "attempt 4 of 4" in effects[-1].note  # 2 of the new sequence's 2
    state, _ = m.step(state, ev.Launched(12.0, 4, "p2", 2, 12.0))
    state, effects = m.step(state, ev.ExitSeen(13.0, 4, "oom", "oom"))
    assert state.status is RunStatus.FAILED and not any(isinstance(e, ev.Launch) for e in effects)


def test_statuses_are_their_stored_strings() -> None:
    assert RunStatus.FINISHED == "finished" and f"{RunStatus.STOPPING}" == "stopping"
    assert [s.value for s in RunStatus if s.terminal] == ["finished", "failed", "stopped", "refused"]
    assert [s.value for s in RunStatus if s.ended] == ["finished", "failed", "stopped"]
