"""The daemon driven in process: its registry, store and GPU file are real; its clock, executor, host probe
and timers are the tests' (tests/fakes.py). A control request is acted on when it arrives, not by a tick;
a guard round observes each run once. The requests a store error left are looked at again on both backends
(`any_daemon`: SQLite, and a real PostgreSQL refusing the box's role, tests/backends.py)."""

from __future__ import annotations

import contextlib
import json
import signal
from collections.abc import Callable
from pathlib import Path

import pytest

from babysit.campaign import clicks
from babysit.channels.notify import ConsoleChannel
from babysit.db.store import Store
from babysit.probes.gpu import FileGpuProbe
from babysit.service.daemon import Daemon
from tests.backends import BACKENDS, Backend, backend
from tests.fakes import FakeClock, FakeExecutor, FakeHostProbe, ManualTimers
from tests.support import run_toml

RUNS = ("a", "b", "c")


def _daemon(tmp_path: Path, store: Backend):
    (tmp_path / "gpus.json").write_text(json.dumps({"gpus": [{"index": 0, "util_pct": 90, "processes": []}]}))
    lines = [store.registry_head() + "[daemon]", 'state_dir = ".babysit"', ""]
    for name in RUNS:
        (tmp_path / f"{name}.toml").write_text(run_toml(name, ["train"], log=f"{name}.jsonl", gpus=[0],
                                                        guards={"min_free_host_ram_gib": 1}))
        lines += ["[[runs]]", f'name = "{name}"', f'spec = "{name}.toml"', 'registered_at = "2026-01-01T00:00:00Z"', ""]
    (tmp_path / "babysit.toml").write_text("\n".join(lines))
    clock = FakeClock()
    host = FakeHostProbe()
    executor = FakeExecutor(clock, host)
    timers = ManualTimers(clock)
    d = _up(tmp_path, store, clock, host, executor, timers)
    try:
        yield d, clock, executor, host, timers
    finally:
        d.exits.close()
        d.store.close()


def _up(tmp_path: Path, store: Backend, clock: FakeClock, host: FakeHostProbe, executor: FakeExecutor,
        timers: ManualTimers, before_first_look: Callable[[Daemon], None] | None = None) -> Daemon:
    """A daemon over the registry, up as start() brings it (a restarted one finds the same live processes)."""
    d = Daemon(tmp_path / "babysit.toml", gpu_probe=FileGpuProbe(tmp_path / "gpus.json"),
               channel=ConsoleChannel(tmp_path / ".babysit", None), clock=clock, host_probe=host,
               executors={"local": executor}, timers=timers)
    store.started(d)
    d.reconcile_registry()
    if before_first_look is not None:
        before_first_look(d)
    d.handle_requests()  # the first look, as start() takes it
    return d


@pytest.fixture
def daemon(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    yield from _daemon(tmp_path, Backend())


@pytest.fixture(params=BACKENDS)
def any_daemon(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """The daemon on SQLite, then on PostgreSQL (its store journaled, as `babysit up` makes it), with the
    backend that refuses its writes for real."""
    for name in ("BABYSIT_STORE_URL", "BABYSIT_HOST"):
        monkeypatch.delenv(name, raising=False)
    with backend(request.param, request) as store:
        for parts in _daemon(tmp_path, store):
            yield (*parts, store)


def test_every_registered_run_is_launched_through_the_injected_executor(daemon) -> None:
    d, _, executor, _, timers = daemon
    assert sorted(run for run, *_ in executor.launches) == list(RUNS)
    first = {d.ctx.polls.when(run) for run in RUNS}
    assert None not in first and timers.when("polls") == min(first)  # one timer for every run's polls


def test_an_abort_from_another_process_is_acted_on_when_it_arrives(daemon) -> None:
    d, _, executor, _, _ = daemon
    assert d.handle_requests() is False  # nothing written by anyone else: no query at all
    asker = Store.in_dir(d.state_dir)  # the CLI or the bot: another connection
    try:
        request = asker.request("b", "abort", "test", 0.0)
        assert d.handle_requests() is True
        assert executor.process("b", 1).signals == [signal.SIGTERM]
        assert executor.process("a", 1).signals == [] and executor.process("c", 1).signals == []
        assert asker.request_result(request) == "stopping"
    finally:
        asker.close()


def test_a_guard_round_observes_each_running_run_once(daemon) -> None:
    d, clock, _, host, _ = daemon
    clock.advance(60)
    reads = host.reads
    d.guards()
    assert host.reads == reads + len(RUNS)


def test_an_exit_seen_by_the_guard_rounds_backstop_ends_its_run_alone(daemon) -> None:
    d, _, executor, _, _ = daemon
    executor.end("a", 1, exit_code=0)
    d.guards()  # the exit-check timer was never fired: the guard round's backstop sees the exit
    assert d.store.run_state("a")[0] == "finished"
    assert {d.store.run_state(run)[0] for run in ("b", "c")} == {"running"}


def test_polls_falling_due_together_are_one_round_on_one_timer_in_one_commit(daemon) -> None:
    d, clock, executor, _, timers = daemon
    executor.end("a", 1, exit_code=0)
    d.guards()  # a is over: its poll leaves the calendar
    assert d.ctx.polls.when("a") is None
    due = d.ctx.polls.when("b")
    assert due == d.ctx.polls.when("c") == timers.when("polls")
    statements: list[str] = []
    d.store._db.set_trace_callback(statements.append)  # what the store sends SQLite, read, not replaced
    clock.advance(due - clock.now)
    assert timers.run_due().count("polls") == 1  # beside the exit checks of b and c
    d.store._db.set_trace_callback(None)
    assert [(p.kind, p.attempt) for run in ("b", "c") for p in d.store.polls(run)] == [("first", 1)] * 2
    assert d.store.polls("a") == []
    assert sum(s.strip().upper() == "COMMIT" for s in statements) == 1  # rows, posts and log offsets at once
    assert timers.when("polls") == d.ctx.polls.when("b") == pytest.approx(due + 30 * 60)


def test_an_on_demand_poll_leaves_the_schedule_and_says_when_nothing_runs(daemon) -> None:
    d, _, executor, _, timers = daemon
    due = timers.when("polls")
    asker = Store.in_dir(d.state_dir)
    try:
        polled = asker.request("b", "poll-now", "test", 0.0)
        executor.end("c", 1, exit_code=0)
        d.guards()
        idle = asker.request("c", "poll-now", "test", 0.0)
        d.handle_requests()
        assert asker.request_result(polled) == "polled" and asker.request_result(idle) == "not running"
    finally:
        asker.close()
    assert [p.kind for p in d.store.polls("b")] == ["on-demand"]
    assert timers.when("polls") == due == d.ctx.polls.when("b")


def test_a_round_the_store_refuses_records_nothing_and_comes_again_a_minute_later(daemon) -> None:
    d, clock, _, _, timers = daemon
    due = timers.when("polls")
    d.store._db.execute("PRAGMA query_only = ON")  # SQLite itself refuses every write, as a full disk would
    try:
        clock.advance(due - clock.now)
        timers.run_due()
    finally:
        d.store._db.execute("PRAGMA query_only = OFF")
    assert all(d.store.polls(run) == [] for run in RUNS)
    assert all(d.ctx.polls.when(run) == pytest.approx(due + 60) for run in RUNS)  # one declared minute on
    clock.advance(60)
    timers.run_due()
    assert [p.kind for run in RUNS for p in d.store.polls(run)] == ["first"] * len(RUNS)


def test_a_request_left_by_a_store_error_is_looked_at_again_by_the_next_round(any_daemon) -> None:
    """The store refuses the answer to one request (a's): the requests after it in the same look are carried
    out and answered all the same, and a's is answered at the next round, though nobody queued anything
    since (before: the look had noted the store's version first, so b's abort and a's answer waited for some
    other request or message to be queued, however long that took)."""
    d, _, executor, _, _, store = any_daemon
    asker = store.asker(d.state_dir)
    store.refuse_answers(d, "a")
    try:
        first, second = asker.request("a", "abort", "test", 0.0), asker.request("b", "abort", "test", 0.0)
        with contextlib.suppress(Exception):
            d.handle_requests()
        assert executor.process("b", 1).signals == [signal.SIGTERM]  # the one after it, carried out
        assert asker.request_result(second) == "stopping" and asker.request_result(first) is None
        store.allow(d)
        d.guards()  # the round's backstop: nothing new was queued, the answer is still owed
        assert asker.request_result(first) == "stopping"
        assert executor.process("a", 1).signals == [signal.SIGTERM]  # stopped once: a's stop is not sent twice
    finally:
        asker.close()


@pytest.mark.parametrize("action,answer", [("abort", "stopping"), ("poll-now", "polled")])
def test_an_answer_owed_when_the_daemon_stops_is_written_once_by_the_next_without_carrying_it_out_again(
        any_daemon, tmp_path: Path, action: str, answer: str) -> None:
    """The request was carried out (the stop signal sent, the poll taken) but the store refused its answer, and
    the daemon stopped before a round wrote it: the next daemon writes that answer, once, and does not carry
    the request out again (before: the owed answer lived in the first daemon's memory alone; the next one
    polled again, or answered a second abort of its own)."""
    d, clock, executor, host, timers, store = any_daemon
    asker = store.asker(d.state_dir)
    store.refuse_answers(d, "a")
    again = None
    try:
        request = asker.request("a", action, "test", 0.0)
        with contextlib.suppress(Exception):
            d.handle_requests()
        assert asker.request_result(request) is None
        signals, polls = list(executor.process("a", 1).signals), len(d.store.polls("a"))
        assert (signals, polls) == (([signal.SIGTERM], 0) if action == "abort" else ([], 1))
        store.allow(d)
        d.exits.close()
        d.store.close()  # stopped before any round wrote the answer
        again = _up(tmp_path, store, clock, host, executor, timers)
        again.guards()
        assert asker.request_result(request) == answer
        assert executor.process("a", 1).signals == signals and len(again.store.polls("a")) == polls  # once
    finally:
        asker.close()
        if again is not None:
            again.exits.close()
            again.store.close()


class _Died(BaseException):
    """The daemon's process ending at that line (no `except Exception` of its own runs): SIGKILL, the OOM
    killer, a power cut between carrying a request out and writing its answer."""


@pytest.mark.parametrize("action,answer", [("abort", "already stopping"), ("poll-now", "interrupted")])
def test_a_request_the_daemon_died_in_before_answering_is_not_carried_out_twice_by_the_next(
        any_daemon, tmp_path: Path, action: str, answer: str) -> None:
    """The daemon carried the request out (the stop sent, the poll posted) and died before writing its answer:
    the next daemon does not do it again. A poll, marked begun in the run's facts before it was taken, is
    answered `interrupted …` (saying how to check and to ask again), not posted twice; an abort is looked at
    again and finds the run's recorded stop: `already stopping`, no second signal (before: the poll was taken
    and posted again, and the abort answered `not running` about a run still stopping)."""
    d, clock, executor, host, timers, store = any_daemon
    asker = store.asker(d.state_dir)
    again = None
    try:
        request = asker.request("a", action, "test", 0.0)

        def died(*_: object) -> None:
            raise _Died

        d.store.finish_request = died  # type: ignore[method-assign]
        with pytest.raises(_Died):
            d.handle_requests()
        signals, polls = list(executor.process("a", 1).signals), len(d.store.polls("a"))
        assert (signals, polls) == (([signal.SIGTERM], 0) if action == "abort" else ([], 1))
        assert asker.request_result(request) is None
        d.exits.close()
        d.store.close()
        again = _up(tmp_path, store, clock, host, executor, timers)
        again.guards()
        result = asker.request_result(request)
        assert result is not None and result.startswith(answer), result
        if action == "poll-now":
            assert "babysit status a" in result and "ask again" in result
        assert executor.process("a", 1).signals == signals and len(again.store.polls("a")) == polls  # once
        again.guards()  # answered: nothing is owed or begun any longer, nothing is done again
        assert again.store.owed_answers("a") == {} and again.store.started_requests("a") == {}
        assert executor.process("a", 1).signals == signals and len(again.store.polls("a")) == polls
    finally:
        asker.close()
        if again is not None:
            again.exits.close()
            again.store.close()


def _dies_answering(d: Daemon) -> None:
    def died(*_: object) -> None:
        raise _Died

    d.store.finish_request = died  # type: ignore[method-assign]
    with pytest.raises(_Died):
        d.handle_requests()
    d.exits.close()
    d.store.close()


def test_an_owner_s_click_the_daemon_died_in_is_answered_as_interrupted_in_the_gateway_s_own_terms(
        any_daemon, tmp_path: Path) -> None:
    """An owner's click (a control request the gateway reads as JSON, clicks.Answer) that the daemon began and
    died in: the next daemon's answer is one the gateway reads, said to the clicker alone, telling how to
    check and to click again (before: plain text, which the gateway showed as `Owner call: interrupted: … —
    ask again if it did not. Nothing was done.`, wrong where the decision had been made)."""
    d, clock, executor, host, timers, store = any_daemon
    asker = store.asker(d.state_dir)
    again = None
    try:
        request = asker.request("a", clicks.request_action(7, "launch"), "slack:U1", 0.0)
        _dies_answering(d)
        again = _up(tmp_path, store, clock, host, executor, timers)
        shown = clicks.Answer.from_result(asker.request_result(request) or "")
        assert not shown.accepted
        assert shown.text.startswith("Owner call #7 (*launch*): babysit stopped while carrying out this decision")
        assert "babysit status a" in shown.text and "Click again" in shown.text and "Nothing was done" not in shown.text
    finally:
        asker.close()
        if again is not None:
            again.exits.close()
            again.store.close()


def test_a_begun_mark_survives_a_failed_read_of_the_run_s_marks_and_a_new_request_after_it(
        any_daemon, tmp_path: Path) -> None:
    """A poll the first daemon began and died in; the next daemon's read of the run's begun marks fails once
    (the store refusing), and a new poll of the same run is in the same look. The new poll's begun mark is
    a row of its own, beside the first's: the first poll is answered `interrupted` at the next round, never
    taken twice (when the marks were one JSON object, a mark written over an empty copy erased the old)."""
    d, clock, executor, host, timers, store = any_daemon
    asker = store.asker(d.state_dir)
    again = None
    try:
        first = asker.request("a", "poll-now", "test", 0.0)
        _dies_answering(d)
        second = asker.request("a", "poll-now", "test", 0.0)

        failed: list[str] = []

        def flaky_once(daemon: Daemon) -> None:
            real = daemon.store.started_requests

            def started_requests(run: str) -> dict[int, str]:
                if not failed:
                    failed.append(run)
                    raise RuntimeError("the store refused the read (once)")
                return real(run)

            daemon.store.started_requests = started_requests  # type: ignore[method-assign]

        again = _up(tmp_path, store, clock, host, executor, timers, before_first_look=flaky_once)
        assert failed == ["a"] and asker.request_result(second) == "polled"
        again.guards()
        result = asker.request_result(first)
        assert result is not None and result.startswith("interrupted"), result
        assert [p.kind for p in again.store.polls("a")] == ["on-demand", "on-demand"]  # the first's and the second's
    finally:
        asker.close()
        if again is not None:
            again.exits.close()
            again.store.close()


def test_requests_the_store_could_not_list_are_listed_again_by_the_next_round(any_daemon) -> None:
    """The look's read of the requests failed (a real SQLite error: a temp view shadows the table, over a
    table since dropped; on PostgreSQL the box's role may no longer claim them: its UPDATE on the table
    revoked): the next round reads them again, though nothing new was queued (before: the store's version
    was noted first, and the abort waited for some other request or message)."""
    d, _, executor, _, _, store = any_daemon
    asker = store.asker(d.state_dir)
    try:
        request = asker.request("b", "abort", "test", 0.0)
        store.refuse_listing(d)
        with pytest.raises(store.refused):
            d.handle_requests()
        store.allow(d)
        d.guards()
        assert asker.request_result(request) == "stopping"
        assert executor.process("b", 1).signals == [signal.SIGTERM]
    finally:
        asker.close()


def test_an_answer_refused_in_a_look_that_queued_nothing_is_written_at_the_next_round(any_daemon) -> None:
    """The same owed answer, from a look that queued no message (a poll asked of a run that has ended): on
    PostgreSQL the store's version counts the outbox's newest id, so a look whose abort queued its
    `stopping` post is looked at again whatever; a look that queued nothing is brought back by the owed
    answer alone (before the fix: never, until someone queued something)."""
    d, _, executor, _, _, store = any_daemon
    executor.end("c", 1, exit_code=0)
    d.guards()  # c is over: a poll of it is answered, and queues nothing
    asker = store.asker(d.state_dir)
    store.refuse_answers(d, "c")
    try:
        request = asker.request("c", "poll-now", "test", 0.0)
        with contextlib.suppress(Exception):
            d.handle_requests()
        assert asker.request_result(request) is None
        store.allow(d)
        d.guards()
        assert asker.request_result(request) == "not running"
    finally:
        asker.close()
