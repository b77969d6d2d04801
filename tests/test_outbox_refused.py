"""An outbox that refuses every post while a run exits: the attempt's outcome is what the process did (it
exited 0: completed, the run finished), never an internal error's `failed`; the posts the outbox refused are
held in the run's order and queued when it takes rows again — by the same daemon at its next guard round,
or by a daemon restarted meanwhile — each once. The store is real: SQLite refusing the rows through a TEMP
trigger on the daemon's connection, PostgreSQL refusing the box's role every outbox row by row-level
security under its live connection (tests/backends.py)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import structlog

from babysit.channels.notify import ConsoleChannel, deliver_due
from babysit.core.snapshot import Snapshot
from babysit.db.store import PollRow, Store
from babysit.probes.gpu import FileGpuProbe
from babysit.run.run_posts import RunPosts
from babysit.service.daemon import Daemon
from tests.backends import BACKENDS, Backend, backend, register_verdict_run
from tests.fakes import FakeClock, FakeExecutor, FakeHostProbe, ManualTimers

RUN = "grasp_sft_v2_demosonly_1gpu_disc"


@pytest.fixture(params=BACKENDS)
def store_backend(request: pytest.FixtureRequest) -> Iterator[Backend]:
    with backend(request.param, request) as chosen:
        yield chosen


@pytest.fixture
def make_daemon(tmp_path: Path, store_backend: Backend, monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable]:
    """A daemon on the registered run (one live process of the fake executor, shared across restarts)."""
    register_verdict_run(tmp_path, store_backend, monkeypatch)
    clock = FakeClock()
    host = FakeHostProbe()
    executor = FakeExecutor(clock, host)
    made: list[Daemon] = []

    def make(before: Callable[[Daemon], None] | None = None) -> tuple[Daemon, FakeExecutor, FakeClock]:
        """The daemon, up and its run launched (`before`: done to it first, a refusal the launch meets)."""
        d = Daemon(tmp_path / "babysit.toml", gpu_probe=FileGpuProbe(tmp_path / "gpus.json"),
                   channel=ConsoleChannel(tmp_path / ".babysit", None), clock=clock, host_probe=host,
                   executors={"local": executor}, timers=ManualTimers(clock), accelerated=True)
        store_backend.started(d)
        made.append(d)
        if before is not None:
            before(d)
        d.reconcile_registry()
        d.handle_requests()
        return d, executor, clock

    yield make
    for d in made:
        d.exits.close()
        d.store.close()


def posts(d: Daemon) -> list[tuple[str, int | None]]:
    return [(m.kind, m.payload.get("attempt")) for m in d.store.messages(RUN)]


def deliver_all(d: Daemon, clock: FakeClock) -> None:
    while deliver_due(d.store, d.channel, lambda: clock.now + 1, 50):  # a run's posts one a pass, in order
        pass


def test_a_run_that_exited_0_while_the_outbox_refused_every_post_is_completed_and_its_posts_follow(
        make_daemon, store_backend) -> None:
    d, executor, clock = make_daemon()
    before = posts(d)
    assert before == [("launch", 1)]
    store_backend.refuse_posts(d)  # every outbox row refused, for real; every other write taken
    with structlog.testing.capture_logs() as logged:
        executor.end(RUN, 1, exit_code=0)
        d.guards()  # the exit: recorded, decided; its posts (the end, the FINAL verdict) refused
        d.guards()  # still refused: nothing queued, nothing raised, nothing said again
    assert d.store.run_state(RUN)[0] == "finished"
    attempt = d.store.attempt(RUN, 1)
    assert (attempt.status, attempt.outcome, attempt.exit_code) == ("ended", "completed", 0)
    assert [i.kind for i in d.store.incidents(RUN)] == []  # no internal error
    assert d.store.final_verdict(RUN) is not None
    assert posts(d) == before
    refusals = [e for e in logged if e["event"] == "outbox refused a post; held until it takes rows again"]
    assert len(refusals) == 1 and refusals[0]["run"] == RUN  # said once, however many posts and rounds
    assert d.store.outbox_summary().held == 2  # counted: what /metrics says (babysit_outbox_held_messages)

    store_backend.allow(d)
    d.guards()  # the outbox takes rows again: the held posts queued, in the run's order
    assert posts(d) == [*before, ("verdict", None), ("ended", 1)]  # as an outbox that took them queues them
    assert d.store.outbox_summary().held == 0
    d.guards()
    deliver_all(d, clock)
    assert [m.status for m in d.store.messages(RUN)] == ["sent"] * 3  # each once, whatever the rounds after


def test_posts_held_by_a_daemon_that_stopped_are_queued_by_the_next_one(make_daemon, store_backend) -> None:
    d, executor, clock = make_daemon()
    store_backend.refuse_posts(d)
    executor.end(RUN, 1, exit_code=0)
    d.guards()
    assert d.store.run_state(RUN)[0] == "finished" and posts(d) == [("launch", 1)]
    store_backend.allow(d)
    d.exits.close()
    d.store.close()  # stopped before any round saw the outbox take rows again
    again, _, _ = make_daemon()
    again.guards()
    assert posts(again) == [("launch", 1), ("verdict", None), ("ended", 1)]
    again.guards()
    deliver_all(again, clock)
    assert [m.status for m in again.store.messages(RUN)] == ["sent"] * 3


def poll(d: Daemon, clock: FakeClock) -> None:
    """The run's next poll, as its timer fires it (a poll round)."""
    clock.advance(d.ctx.polls.when(RUN) - clock.now)
    assert "polls" in d.ctx.timers.run_due()


def thread(d: Daemon) -> list[tuple[str, int | None, int | None]]:
    """The run's posts (the fake trainer writes nothing while the clock goes from poll to poll: it stalls,
    and its stall's posts follow the polls'): kind, the poll they carry, the post they thread under."""
    return [(m.kind, m.payload.get("poll_id"), m.thread_of) for m in d.store.messages(RUN)]


def test_a_poll_of_a_run_whose_launch_post_is_held_follows_it_in_its_thread(make_daemon, store_backend) -> None:
    d, _, clock = make_daemon(before=lambda d: store_backend.refuse_posts_of(d, "launch"))
    assert posts(d) == []  # the launch post held
    poll(d, clock)  # the outbox takes polls (and the FINAL verdict the poll's read of the log finds), but the
    first = d.store.polls(RUN)[0].id  # run holds its launch post: the poll's posts wait behind it
    assert posts(d) == [] and d.store.outbox_summary().held == 4
    assert all(h["key"] for h in d.store.held_posts(RUN))  # each queued once, by its key
    store_backend.allow(d)
    d.guards()
    launch = d.store.messages(RUN)[0].id
    assert thread(d)[:4] == [("launch", None, None), ("verdict", None, None), ("poll", first, launch),
                             ("header", first, launch)]
    poll(d, clock)  # nothing held now: queued at once, as ever
    second = d.store.polls(RUN)[0].id
    assert thread(d)[-2:] == [("poll", second, launch), ("header", second, launch)]
    d.guards()
    deliver_all(d, clock)
    assert {m.status for m in d.store.messages(RUN)} == {"sent"}
    assert "internal-error" not in {i.kind for i in d.store.incidents(RUN)}


def test_a_poll_taken_while_the_outbox_refuses_posts_is_recorded_and_its_posts_queued_in_order_once(
        make_daemon, store_backend) -> None:
    d, _, clock = make_daemon()
    store_backend.refuse_posts(d)
    poll(d, clock)  # its row recorded; its post and header refused: held, never an internal error
    first = d.store.polls(RUN)[0].id
    assert posts(d) == [("launch", 1)] and [i.kind for i in d.store.incidents(RUN)] == []
    store_backend.allow(d)
    poll(d, clock)  # the outbox takes rows again, but the first poll's posts are held still: the second's wait
    second = d.store.polls(RUN)[0].id
    # held: the verdict, both polls' posts, and the newest live header (an edit in place: the older is moot)
    assert posts(d) == [("launch", 1)] and d.store.outbox_summary().held == 4
    d.guards()
    launch = d.store.messages(RUN)[0].id
    assert thread(d)[:5] == [("launch", None, None), ("verdict", None, None), ("poll", first, launch),
                             ("poll", second, launch), ("header", second, launch)]
    d.guards()
    deliver_all(d, clock)
    assert [kind for kind, _, _ in thread(d)].count("poll") == 2  # each once
    assert {m.status for m in d.store.messages(RUN)} == {"sent"}


def refuse(store: Store) -> None:
    store._db.execute("CREATE TEMP TRIGGER refuse_post BEFORE INSERT ON outbox"
                      " BEGIN SELECT RAISE(ABORT, 'disk I/O error (the test''s)'); END")


def test_posts_held_behind_a_refused_launch_post_are_threaded_under_it_once_it_is_queued(tmp_path: Path) -> None:
    """A post that threads under a launch post the outbox refused gets the launch's id when both are queued,
    also when the first daemon queued only the launch and a restarted one the rest."""
    store = Store.in_dir(tmp_path)
    posts = RunPosts("r", store, lambda: 1.0)
    refuse(store)
    assert posts.post("launch", {"run": "r"}, "r:1:launch") is None
    launch_key = posts.held_key("launch")
    assert launch_key == "r:1:launch"
    assert posts.post("text", {"run": "r", "text": "a"}, "r:a", thread_key=launch_key) is None
    assert posts.post("text", {"run": "r", "text": "b"}, "r:b", thread_key=launch_key) is None
    assert posts.post("text", {"run": "r", "text": "a"}, "r:a", thread_key=launch_key) is None  # its key: held once
    assert posts.posted("r:a") and not posts.posted("r:c")
    assert store.messages() == [] and store.outbox_summary().held == 3
    assert posts.retry() == {}  # still refused
    store._db.execute("DROP TRIGGER refuse_post")
    # the outbox takes the launch post, then refuses again: what is held stays threaded under its id
    store._db.execute("CREATE TEMP TRIGGER refuse_text BEFORE INSERT ON outbox WHEN NEW.kind = 'text'"
                      " BEGIN SELECT RAISE(ABORT, 'disk I/O error (the test''s)'); END")
    queued = posts.retry()
    assert list(queued) == ["r:1:launch"]
    store._db.execute("DROP TRIGGER refuse_text")
    again = RunPosts("r", store, lambda: 2.0)  # a restarted daemon
    assert again.retry().keys() == {"r:a", "r:b"}
    launch, a, b = store.messages()
    assert (launch.kind, a.payload["text"], b.payload["text"]) == ("launch", "a", "b")
    assert a.thread_of == b.thread_of == launch.id == queued["r:1:launch"]
    assert store.outbox_summary().held == 0 and again.post("text", {"run": "r"}, "r:c") is not None
    store.close()


def test_a_post_whose_wake_up_failed_after_its_commit_is_queued_once_never_held(tmp_path: Path) -> None:
    """The enqueue committed, then the delivery worker's wake-up raised: the post is queued (its id), not
    held, so no guard round queues it again; a poll round's rows alike."""
    store = Store.in_dir(tmp_path)
    woken = []

    def wake() -> None:
        woken.append(1)
        raise RuntimeError("the wake-up failed after the commit (the test's)")

    store.on_enqueue = wake
    posts = RunPosts("r", store, lambda: 1.0)
    new_id = posts.post("text", {"run": "r", "text": "a"}, "r:a")
    assert new_id is not None and posts.held == [] and store.held_posts("r") == []
    assert posts.retry() == {} and posts.post("text", {"run": "r", "text": "b"}, "r:b") is not None
    store.record_polls([PollRow("r", 1, 2.0, "first", Snapshot.from_dict({"step": 1}), new_id, {"run": "r"})])
    assert [m.kind for m in store.messages()] == ["text", "text", "poll", "header"] and len(woken) == 3
    store.close()
