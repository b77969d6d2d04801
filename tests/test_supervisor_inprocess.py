"""A supervisor driven in process: a fake clock, a fake executor and host probe, timers the test fires, and
real parts elsewhere (the store, the spec, the log, a FileGpuProbe). Declared hours pass in a blink, and
each check is seen to read the host, the GPUs and the hours once."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from babysit.core import run_events as ev
from babysit.core.spec.run_toml import load_spec
from babysit.db.store import Store
from babysit.probes.gpu import FileGpuProbe
from babysit.run.context import DaemonContext
from babysit.run.supervisor import RunSupervisor
from tests.fakes import FakeClock, FakeExecutor, FakeHostProbe, ManualTimers
from tests.support import run_toml

GIB = 2**30


class Rig:
    def __init__(self, tmp_path: Path, guards: dict[str, float] | None = None) -> None:
        self.root = tmp_path
        self.clock = FakeClock()
        self.host = FakeHostProbe()
        self.timers = ManualTimers(self.clock)
        self.executor = FakeExecutor(self.clock, self.host)
        self.gpu_file = tmp_path / "gpus.json"
        self.set_gpu_processes([])
        spec_file = tmp_path / "r.toml"
        spec_file.write_text(run_toml("r", ["python", "train.py", "--steps", "1000"], log="log.jsonl", gpus=[0],
                                      guards={"min_free_host_ram_gib": 1, "stop_grace_seconds": 30, **(guards or {})},
                                      poll=(5, 30)))
        state = tmp_path / ".babysit"
        self.store = Store.in_dir(state)
        self.ctx = DaemonContext(store=self.store, state_dir=state, gpu_probe=FileGpuProbe(self.gpu_file),
                                 executors={"local": self.executor}, scale=60.0, clock=self.clock,
                                 host_probe=self.host, timers=self.timers)
        self.sup = RunSupervisor(self.ctx, load_spec(spec_file), None)
        self.step = 0

    def set_gpu_processes(self, processes: list[dict]) -> None:
        self.gpu_file.write_text(json.dumps({"gpus": [
            {"index": 0, "util_pct": 95, "util_samples": 5, "memory_used_bytes": 10 * GIB,
             "memory_total_bytes": 141 * GIB, "processes": processes}]}))

    def log(self, records: int, seconds_per_step: float) -> None:
        """`records` records, one step each, `seconds_per_step` apart, ending now on the fake clock."""
        with open(self.root / "log.jsonl", "a") as f:
            for i in range(records):
                self.step += 1
                ts = self.clock.now - (records - 1 - i) * seconds_per_step
                f.write(json.dumps({"step": self.step, "ts": ts, "train_loss": 1.0}) + "\n")

    def incidents(self) -> list[str]:
        return [i.kind for i in self.store.incidents("r")]


@pytest.fixture
def rig(tmp_path: Path):
    made: list[Rig] = []

    def make(**kw: dict[str, float]) -> Rig:
        made.append(Rig(tmp_path, **kw))
        return made[-1]

    yield make
    for r in made:
        r.store.close()


def test_launch_then_the_first_poll_at_its_declared_minute_with_the_logs_pace(rig) -> None:
    r = rig()
    r.sup.start()
    (run, n, argv, env) = r.executor.launches[0]
    assert (run, n, argv[-2:]) == ("r", 1, ["--steps", "1000"])
    assert env["BABYSIT_RUN"] == "r" and env["CUDA_VISIBLE_DEVICES"] == "0"  # the executor's launch_env
    assert r.sup.ctx.polls.when("r") == r.timers.when("polls") == r.clock.now + 5 * 60
    r.timers.advance(299)
    assert r.store.polls("r", 5) == []
    r.log(20, seconds_per_step=2.0)
    r.timers.advance(1)
    (poll,) = r.store.polls("r", 5)
    assert poll.kind == "first" and poll.snapshot.step == 20
    assert poll.snapshot.seconds_per_step == pytest.approx(2.0)
    assert poll.snapshot.eta_seconds == pytest.approx(980 * 2.0)
    assert r.sup.ctx.polls.when("r") == pytest.approx(poll.at + 30 * 60)


def test_a_starved_gpu_with_the_trainers_own_wait_share_is_an_input_starvation_incident(rig) -> None:
    r = rig()
    r.gpu_file.write_text(json.dumps({"gpus": [{"index": 0, "util_pct": 12, "util_samples": 5, "processes": []}]}))
    r.sup.start()
    with open(r.root / "log.jsonl", "a") as f:  # steps advance, each one 60 % waiting on the DataLoader
        for step in range(1, 11):
            f.write(json.dumps({"step": step, "ts": r.clock.now - 10 + step, "train_loss": 1.0,
                                "data_wait_frac": 0.6}) + "\n")
    r.timers.advance(5 * 60)
    (poll,) = r.store.polls("r", 5)
    assert "input-starvation" in poll.snapshot.flags and poll.snapshot.data_wait_frac == pytest.approx(0.6)
    (incident,) = [i for i in r.store.incidents("r") if i.kind == "input-starvation"]
    assert incident.body["data_wait_frac"] == pytest.approx(0.6) and incident.body["gpus"][0]["util_pct"] == 12
    (post,) = [m for m in r.store.messages("r") if m.kind == "incident"]
    assert "waits on its input 60% of each step" in post.payload["message"]


def test_a_poll_that_fails_is_said_and_tried_again_a_minute_later(rig) -> None:
    r = rig()
    r.sup.start()
    r.log(5, seconds_per_step=2.0)
    r.host.failing = OSError(5, "Input/output error")  # the host read fails at the first poll
    r.timers.advance(5 * 60)
    assert r.store.polls("r", 5) == [] and "internal-error" in r.incidents()
    assert r.sup.ctx.polls.when("r") == pytest.approx(r.clock.now + 60)  # not the end of the run's polls
    r.host.failing = None
    r.timers.advance(60)
    (poll,) = r.store.polls("r", 5)
    assert poll.kind == "first" and poll.snapshot.step == 5


def test_each_check_reads_the_host_once_and_the_poll_and_the_guards_agree_on_the_projection(rig) -> None:
    r = rig(guards={"gpu_hours_cap": 0.5})
    r.sup.start()
    r.timers.advance(60)
    r.log(10, seconds_per_step=2.0)  # 990 steps left at 2 s: 0.55 GPU-h more, past the 0.5 cap
    reads = r.host.reads
    r.sup.guard()
    assert r.host.reads == reads + 1
    (warning,) = [i for i in r.store.incidents("r") if i.kind == "gpu-hours-cap"]
    r.sup.polls.now_alone()
    assert r.host.reads == reads + 2
    (poll,) = r.store.polls("r", 5)
    assert "gpu-hours-projection" in poll.snapshot.flags
    assert round(poll.snapshot.gpu_hours_projected or 0.0, 4) == warning.body["gpu_hours_projected"]


class CountedArgv(tuple):
    """An attempt's command that counts the times it is read through."""

    reads = 0

    def __iter__(self) -> Iterator[str]:
        type(self).reads += 1
        return super().__iter__()


def test_the_commands_steps_are_read_from_it_once_an_attempt_not_at_every_check(rig) -> None:
    """Every check derives the run's end step; the attempt's command is read for its --steps once (a
    1,000-run guard round read every run's command again at every round: bench/scale.py)."""
    r = rig()
    r.sup.start()
    r.timers.advance(60)
    r.log(10, seconds_per_step=2.0)
    CountedArgv.reads = 0
    r.sup.attempt = dataclasses.replace(r.sup.attempt, argv=CountedArgv(r.sup.attempt.argv))
    for _ in range(5):
        r.sup.guard()
    r.sup.polls.now_alone()
    (poll,) = r.store.polls("r", 5)
    assert poll.snapshot.end_step == 1000 and poll.snapshot.eta_seconds == pytest.approx(990 * 2.0)
    assert CountedArgv.reads == 1


def test_the_cap_stops_the_run_now_and_sigkills_it_after_the_grace_period(rig) -> None:
    r = rig(guards={"gpu_hours_cap": 0.05})  # 180 GPU-seconds
    r.sup.start()
    proc = r.executor.process("r", 1)
    proc.obeys_stop = False  # it ignores SIGTERM: only the SIGKILL after the grace period ends it
    r.timers.advance(100)
    r.sup.guard()
    assert proc.signals == []
    r.timers.advance(100)
    r.sup.guard()
    assert proc.signals == [signal.SIGTERM]  # sent within the guard check, not by a thread later
    assert "gpu-hours-cap" in r.incidents()
    assert r.timers.when("kill:r") == pytest.approx(r.clock.now + 30)
    r.timers.advance(29)
    assert r.executor.kills == []
    r.timers.advance(2)
    assert r.executor.kills == [1] and proc.signal == signal.SIGKILL
    (attempt,) = r.store.attempts("r")
    assert attempt.status == "ended" and attempt.detail.get("stopped_by") == "gpu-hours-cap"
    assert r.store.run_state("r")[0] == "stopped"
    assert r.sup.ctx.polls.when("r") is None and r.timers.when("polls") is None and r.timers.when("exit-check:r") is None  # nothing left scheduled


def test_a_foreign_gpu_holder_is_read_again_on_a_timer_then_stops_the_run(rig) -> None:
    r = rig()
    r.sup.start()
    r.timers.advance(60)
    r.set_gpu_processes([{"pid": os.getpid(), "name": "policy_server", "used_memory_bytes": GIB}])
    r.sup.guard()
    proc = r.executor.process("r", 1)
    assert proc.signals == [] and r.timers.when("recheck:r") == pytest.approx(r.clock.now + 2)
    r.timers.advance(2)
    assert proc.signals == [signal.SIGTERM]
    assert "gpu-held" in r.incidents()


def test_an_exit_is_asked_for_on_a_timer_and_ends_the_run_with_nothing_left_scheduled(rig) -> None:
    r = rig()
    r.sup.start()
    r.log(5, seconds_per_step=1.0)
    r.executor.end("r", 1, exit_code=0)
    r.timers.advance(1)
    (attempt,) = r.store.attempts("r")
    assert (attempt.status, attempt.outcome) == ("ended", "completed")
    assert r.store.run_state("r")[0] == "finished"
    assert not r.timers.pending


def test_a_daemon_that_died_between_a_stopped_attempts_exit_and_its_decision_never_relaunches(
        rig, monkeypatch: pytest.MonkeyPatch) -> None:
    r = rig()
    r.sup.start()
    r.timers.advance(60)
    assert r.sup.request("abort", "ana") == "stopping"  # the trainer checkpoints and exits on the SIGTERM
    real_do, died = RunSupervisor._do, []

    def dying(self: RunSupervisor, effect: ev.Effect) -> str | None:
        if died:
            return None  # the daemon is dead: nothing after the exit's record is carried out
        reply = real_do(self, effect)
        died.extend([True] if isinstance(effect, ev.RecordExit) else [])
        return reply

    with monkeypatch.context() as m:  # the daemon dies right after recording the exit (crash point after-mark-ended)
        m.setattr(RunSupervisor, "_do", dying)
        r.timers.advance(1)
    assert died
    (attempt,) = r.store.attempts("r")
    assert attempt.status == "ended" and r.store.run_state("r")[0] == "stopping"
    restarted = RunSupervisor(r.ctx, r.sup.spec, None)  # the next daemon
    restarted.start()
    assert [n for (_, n, _, _) in r.executor.launches] == [1]  # a stopped run is never launched again
    assert r.store.run_state("r")[0] == "stopped"
    assert len(r.store.attempts("r")) == 1


def _restarted(r: Rig) -> tuple[RunSupervisor, ManualTimers]:
    """The next daemon over the same store and processes: its own timers (the dead one's died with it)."""
    timers = ManualTimers(r.clock)
    sup = RunSupervisor(dataclasses.replace(r.ctx, timers=timers), r.sup.spec, None)
    sup.start()
    return sup, timers


def test_a_stop_the_dead_daemon_recorded_but_never_sent_is_sent_by_the_next_one(
        rig, monkeypatch: pytest.MonkeyPatch) -> None:
    r = rig()
    r.sup.start()
    proc = r.executor.process("r", 1)
    proc.obeys_stop = False
    r.timers.advance(60)
    with monkeypatch.context() as m:  # the daemon dies after recording the abort, before signalling
        m.setattr(RunSupervisor, "send_stop", lambda self, attempt, stop, grace: None)
        assert r.sup.request("abort", "ana") == "stopping"
    assert proc.signals == [] and r.store.run_state("r")[0] == "stopping"
    r.clock.now += 5
    _, timers = _restarted(r)
    assert proc.signals == [signal.SIGTERM]  # sent on adoption
    assert r.store.run_state("r")[0] == "stopping"  # not "running" again
    assert timers.when("kill:r") == pytest.approx(r.clock.now + 30)  # a whole grace period from the signal
    timers.advance(31)
    assert r.executor.kills == [1]
    (attempt,) = r.store.attempts("r")
    assert attempt.status == "ended" and attempt.detail.get("stopped_by") == "abort"
    assert r.store.run_state("r")[0] == "stopped"


def test_a_stop_already_sent_is_not_sent_again_and_its_sigkill_keeps_its_time(rig) -> None:
    r = rig()
    r.sup.start()
    proc = r.executor.process("r", 1)
    proc.obeys_stop = False
    r.timers.advance(60)
    assert r.sup.request("abort", "ana") == "stopping"
    assert proc.signals == [signal.SIGTERM]
    r.clock.now += 10  # the daemon dies; the next one starts 10 s into the 30-s grace period
    _, timers = _restarted(r)
    assert proc.signals == [signal.SIGTERM]
    assert timers.when("kill:r") == pytest.approx(r.clock.now + 20)
    timers.advance(21)
    assert r.executor.kills == [1] and r.store.run_state("r")[0] == "stopped"
