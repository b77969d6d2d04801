"""A FINAL verdict whose post the store refused (its enqueue raised) is queued again by the same daemon at
its next guard round, once: before, only a restarted daemon (whose start reads the stored verdict as not
posted) queued it. The daemon is driven in process (tests/fakes.py); the store is a real SQLite whose
connection refuses the verdict's outbox row through a TEMP trigger, as a failing disk would refuse it; on a real
PostgreSQL (the daemon's store journaled, as `babysit up` makes it) PostgreSQL refuses the box's role that row,
under its live connection, then takes it again (tests/backends.py)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from babysit.channels.notify import ConsoleChannel, deliver_due
from babysit.probes.gpu import FileGpuProbe
from babysit.service.daemon import Daemon
from tests.backends import BACKENDS, backend, register_verdict_run
from tests.fakes import FakeClock, FakeExecutor, FakeHostProbe, ManualTimers

RUN = "grasp_sft_v2_demosonly_1gpu_disc"


@pytest.fixture(params=BACKENDS)
def store_backend(request: pytest.FixtureRequest):
    with backend(request.param, request) as chosen:
        yield chosen


@pytest.fixture
def daemon(tmp_path: Path, store_backend, monkeypatch: pytest.MonkeyPatch):
    register_verdict_run(tmp_path, store_backend, monkeypatch)
    clock = FakeClock()
    host = FakeHostProbe()
    executor = FakeExecutor(clock, host)
    state = tmp_path / ".babysit"
    d = Daemon(tmp_path / "babysit.toml", gpu_probe=FileGpuProbe(tmp_path / "gpus.json"),
               channel=ConsoleChannel(state, None), clock=clock, host_probe=host, executors={"local": executor},
               timers=ManualTimers(clock), accelerated=True)
    store_backend.started(d)
    d.reconcile_registry()
    d.handle_requests()
    yield d, executor, clock
    d.exits.close()
    d.store.close()


def verdict_posts(d: Daemon) -> list:
    return [m for m in d.store.messages(RUN) if m.kind == "verdict"]


def test_a_final_verdict_whose_enqueue_raised_is_queued_at_the_next_round_once(daemon, store_backend) -> None:
    d, executor, clock = daemon
    store_backend.refuse_verdict_posts(d)  # the store refuses the verdict's post, for real
    executor.end(RUN, 1, exit_code=0)
    d.guards()  # the exit: the FINAL verdict read, saved, charted; its post refused by the store
    assert d.store.run_state(RUN)[0] == "finished"
    assert d.store.final_verdict(RUN) is not None and verdict_posts(d) == []
    d.guards()  # still refused: nothing queued, nothing raised into the round
    assert verdict_posts(d) == []
    store_backend.allow(d)
    d.guards()  # the store takes writes again: the same daemon queues it
    posts = verdict_posts(d)
    assert len(posts) == 1 and posts[0].payload["verdict"]["status"] == "FINAL"
    assert posts[0].payload["chart_path"] is not None  # the chart drawn at the verdict, not lost
    d.guards()
    while deliver_due(d.store, d.channel, lambda: clock.now + 1, 50):  # a run's posts one a pass, in order
        pass
    assert [m.status for m in verdict_posts(d)] == ["sent"]  # once, whatever the rounds after


def test_a_verdict_post_that_was_committed_is_not_queued_again(daemon) -> None:
    """The enqueue's commit went through and the error came after it (the wake): the round's retry finds
    the row by its key and queues nothing more."""
    d, executor, _ = daemon
    calls = []

    def wake() -> None:
        calls.append(1)
        if len(verdict_posts(d)) == 1 and len(calls) < 50:
            raise sqlite3.OperationalError("the wake failed after the commit (the test's)")

    d.store.on_enqueue = wake
    executor.end(RUN, 1, exit_code=0)
    d.guards()
    d.store.on_enqueue = None
    d.guards()
    d.guards()
    assert len(verdict_posts(d)) == 1
