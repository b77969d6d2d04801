"""The state database: schema versioning, attempts, GPU-seconds, outbox order and dedupe, verdicts, amendments.

The conformance suite of the store's backends: every test taking `store` (or `backend`) runs against
SQLite, against a real PostgreSQL (tests/postgres.py), and against it through the daemon's local journal
(`start_journal`: every write mirrored, ids reserved); the few about SQLite's file take `sqlite_store`.
"""

from __future__ import annotations

import json
import os
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from babysit.core.errors import StateError
from babysit.core.snapshot import Snapshot
from babysit.core.spec.amendment import amendment_sha256
from babysit.db.store import SCHEMA_VERSION, Store


class Backend:
    """One backend's database for a test: `open()` a store on it (again), `reader()` a second connection,
    as `babysit status` in another process reads it."""

    def __init__(self, name: str, tmp_path: Path, url: str | None) -> None:
        self.name, self.tmp_path, self.url = name, tmp_path, url

    def open(self) -> Store:
        if self.url is None:
            return Store.in_dir(self.tmp_path / "state")
        from babysit.db.postgres import PostgresStore

        if self.name == "postgresql+journal":  # the daemon's store: the same answers, connected
            store = PostgresStore(self.url, host="box-a", state_dir=self.tmp_path / "state")
            store.start_journal()
            return store
        return PostgresStore(self.url, host="box-a")

    def reader(self) -> Any:
        if self.url is None:
            return sqlite3.connect(self.tmp_path / "state" / "state.db")
        from babysit.db.postgres import PgConnection

        return PgConnection(self.url)


@pytest.fixture(params=["sqlite", "postgresql", "postgresql+journal"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    url = request.getfixturevalue("pg_url") if request.param.startswith("postgresql") else None
    return Backend(request.param, tmp_path, url)


@pytest.fixture
def store(backend: Backend) -> Iterator[Store]:
    opened = backend.open()
    yield opened
    opened.close()


@pytest.fixture
def sqlite_store(tmp_path: Path) -> Store:
    return Store.in_dir(tmp_path / "state")


def test_a_new_store_is_owner_only_wal_and_at_the_current_schema(tmp_path: Path, sqlite_store: Store) -> None:
    assert oct(os.stat(tmp_path / "state").st_mode & 0o777) == "0o700"
    assert oct(os.stat(tmp_path / "state" / "state.db").st_mode & 0o777) == "0o600"
    db = sqlite3.connect(tmp_path / "state" / "state.db")
    assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_a_store_from_a_newer_babysit_is_refused_with_a_hint(tmp_path: Path, sqlite_store: Store) -> None:
    sqlite_store.close()
    db = sqlite3.connect(tmp_path / "state" / "state.db")
    db.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    db.commit()
    db.close()
    with pytest.raises(StateError) as info:
        Store.in_dir(tmp_path / "state")
    assert "schema version" in info.value.message and info.value.hint


def test_reopening_keeps_everything(backend: Backend, store: Store) -> None:
    a = store.begin_attempt("r", 1, "p", ["x"], "local", 2, "/a", now=100.0)
    store.mark_running(a.id, started_at=110.0, pid=1, pid_create_time=5.0)
    store.close()
    again = backend.open()
    assert again.attempt("r", 1).pid == 1


def test_gpu_seconds_are_wall_time_times_gpus_over_every_attempt(store: Store) -> None:
    a1 = store.begin_attempt("r", 1, "p", ["x"], "local", 2, "/a1", now=0.0)
    store.mark_running(a1.id, started_at=100.0, pid=1)
    store.mark_ended(a1.id, ended_at=160.0, outcome="oom")
    a2 = store.begin_attempt("r", 2, "q", ["x"], "local", 2, "/a2", now=160.0)
    assert store.gpu_seconds("r", now=1000.0) == 120.0  # a launching attempt costs nothing yet
    store.mark_running(a2.id, started_at=200.0, pid=2)
    assert store.gpu_seconds("r", now=250.0) == 120.0 + 100.0  # the live attempt counts up to now
    store.mark_ended(a2.id, ended_at=300.0, outcome="completed")
    assert store.gpu_seconds("r", now=10_000.0) == 120.0 + 200.0


def test_an_attempt_is_ended_once_and_two_attempts_cannot_share_a_number(store: Store) -> None:
    a = store.begin_attempt("r", 1, "p", ["x"], "local", 0, "/a", now=0.0)
    store.mark_ended(a.id, ended_at=5.0, outcome="oom", detail={"x": 1})
    store.mark_ended(a.id, ended_at=9.0, outcome="completed")
    assert (store.attempt("r", 1).outcome, store.attempt("r", 1).ended_at) == ("oom", 5.0)
    with pytest.raises(store.IntegrityError):
        store.begin_attempt("r", 1, "p", ["x"], "local", 0, "/a", now=0.0)


def test_outbox_releases_one_message_per_run_in_order_and_dedupes(store: Store) -> None:
    a1 = store.enqueue("a", "launch", {}, now=0.0, dedupe_key="a:1:launch")
    assert store.enqueue("a", "launch", {"again": True}, now=1.0, dedupe_key="a:1:launch") == a1
    a2 = store.enqueue("a", "poll", {}, now=0.0, thread_of=a1)
    b1 = store.enqueue("b", "launch", {}, now=0.0)
    assert [m.id for m in store.due_messages(now=0.0)] == [a1, b1]
    store.mark_retry(a1, "503", next_try_at=10.0)
    assert [m.id for m in store.due_messages(now=5.0)] == [b1], "a's head is not due; a2 must wait behind it"
    store.mark_sent(a1, "ts-1", now=11.0)
    assert [m.id for m in store.due_messages(now=11.0)] == [a2, b1]
    assert store.message(a1).remote_ref == "ts-1" and store.message(a1).tries == 2
    assert store.pending_count() == 2


def test_the_last_message_of_a_kind_among_some_runs_is_the_newest_of_them(store: Store) -> None:
    assert store.last_message("campaign", ["a", "b"]) is None and store.last_message("campaign", []) is None
    store.enqueue("a", "campaign", {"n": 1}, now=0.0)
    store.enqueue("b", "campaign", {"n": 2}, now=1.0)
    store.enqueue("b", "poll", {"n": 3}, now=2.0)
    store.enqueue("c", "campaign", {"n": 4}, now=3.0)  # another campaign's run
    found = store.last_message("campaign", ["a", "b"])
    assert found is not None and (found.run, found.payload) == ("b", {"n": 2})


def test_the_final_verdict_is_stored_once(store: Store) -> None:
    store.save_verdict("r", {"status": "PROVISIONAL", "at_step": 500}, now=1.0, final=False)
    first = store.save_verdict("r", {"status": "FINAL", "label": "A", "at_step": 1000}, now=2.0, final=True)
    again = store.save_verdict("r", {"status": "FINAL", "label": "B", "at_step": 1000}, now=3.0, final=True)
    assert first == again and store.final_verdict("r").body["label"] == "A"
    assert store.latest_verdict("r").body["label"] == "A"


def test_amendments_are_numbered_and_hash_chained(store: Store) -> None:
    one = store.add_amendment("r", "t1", "text one", "2026-08-17T21:30:00Z", 250)
    two = store.add_amendment("r", "t2", "text two", "2026-08-17T22:00:00Z", 250)
    assert (one.n, two.n) == (1, 2)
    assert one.sha256 == amendment_sha256("text one", None)
    assert two.prev_sha256 == one.sha256 and two.sha256 == amendment_sha256("text two", one.sha256)


def test_control_requests_are_queued_and_finished(store: Store) -> None:
    rid = store.request("r", "abort", "slack:U1", now=1.0)
    assert [(q.run, q.kind) for q in store.pending_requests()] == [("r", "abort")]
    store.finish_request(rid, "stopping", now=2.0)
    assert store.pending_requests() == [] and store.request_result(rid) == "stopping"


@pytest.mark.parametrize("attempt", range(3))
def test_processes_opening_a_fresh_store_at_once_migrate_it_once(tmp_path: Path, attempt: int) -> None:
    """`babysit status` started beside a first `babysit up` must not both create the tables, nor fail on
    the switch to WAL (which SQLite refuses at once, busy timeout or not, while another makes it)."""
    import multiprocessing

    ctx = multiprocessing.get_context("fork")
    start = ctx.Event()

    def opener() -> None:
        start.wait(10)
        Store.in_dir(tmp_path / "fresh").close()

    procs = [ctx.Process(target=opener) for _ in range(10)]
    for p in procs:
        p.start()
    start.set()
    for p in procs:
        p.join(30)
    assert [p.exitcode for p in procs] == [0] * 10
    assert Store.in_dir(tmp_path / "fresh").attempts("r") == []


def test_next_due_at_looks_only_at_each_runs_queue_head(store: Store) -> None:
    assert store.next_due_at() is None
    head = store.enqueue("a", "launch", {}, now=10.0)
    store.enqueue("a", "poll", {}, now=11.0)  # due at 11, but behind a head that waits
    store.mark_retry(head, "503", next_try_at=40.0)
    assert store.next_due_at() == 40.0, "a blocked queue must not make the worker spin"
    store.enqueue("b", "launch", {}, now=20.0)
    assert store.next_due_at() == 20.0


def test_a_poll_is_recorded_with_its_post_and_header_update_in_one_go(store: Store) -> None:
    launch = store.enqueue("r", "launch", {"run": "r"}, now=1.0)
    snap = Snapshot.from_dict({"run": "r", "attempt": 1, "at": 5.0, "kind": "first", "step": 7})
    store.record_poll("r", 1, 5.0, "first", snap, thread_of=launch, payload={"run": "r"})
    (poll,) = store.polls("r")
    assert (poll.kind, poll.snapshot, poll.attempt) == ("first", snap, 1)  # the value it was, read back
    post, header = store.messages("r")[1:]  # the outbox's posts: its JSON, for the channels to render
    assert (post.kind, post.thread_of, post.payload["snapshot"]) == ("poll", launch, snap.to_dict())
    assert (header.kind, header.payload["attempt"], header.payload["snapshot"]) == ("header", 1, snap.to_dict())
    assert store.message(post.id).payload["snapshot"] == snap.to_dict()


def test_a_polls_snapshot_is_stored_once_and_its_posts_name_it(backend: Backend, store: Store) -> None:
    store.record_poll("r", 1, 5.0, "first", Snapshot.from_dict({"step": 7, "log_path": "x" * 5000}), thread_of=None,
                      payload={"run": "r"})
    reader = backend.reader()
    try:
        (poll_id,) = reader.execute("SELECT id FROM polls").fetchone()
        payloads = [json.loads(p) for (p,) in reader.execute("SELECT payload FROM outbox ORDER BY id")]
    finally:
        reader.close()
    assert [p.get("poll_id") for p in payloads] == [poll_id, poll_id]
    assert not any("snapshot" in p for p in payloads)  # 5 kB once in polls, not three times
    assert [m.payload["snapshot"]["step"] for m in store.due_messages(now=10.0)] == [7]  # the run's head: its post


def reading(n: int) -> dict[str, Any]:
    """A run's reading as the daemon saves it (run/run_log.py), after its `n`-th record."""
    return {"tail": {"offset": 100 * n, "records": n}, "source": {"lines": 2 * n, "cursors": {"stdout": {"offset": n}}},
            "step": 10 * n, "last_record_at": float(n)}


def test_deferred_readings_land_in_one_commit_at_the_end_and_keep_the_status(backend: Backend, store: Store) -> None:
    store.set_run_state("a", "running", 1.0, launched=True)
    reader = backend.reader()
    with store.deferred_readings():
        store.save_reading("a", **reading(1))
        store.save_reading("b", **reading(3))  # a run with no state yet stays pending
        store.save_reading("a", **reading(2))
        assert reader.execute("SELECT COUNT(*) FROM run_reading").fetchone()[0] == 0  # nothing written yet
        assert store.run_state("a") == ("running", {"launched": True})
        store.set_run_state("a", "stopping", 2.5)  # a status set meanwhile is not overwritten by the flush
    assert store.run_state("a") == ("stopping", {"launched": True, **reading(2)})
    assert store.run_state("b") == ("pending", reading(3))
    assert store.run_states() == {"a": ("stopping", {"launched": True, **reading(2)})}  # b: no status yet
    assert reader.execute("SELECT COUNT(*) FROM run_reading").fetchone()[0] == 2


def test_outside_a_deferred_block_a_reading_is_written_at_once_and_replaces_the_last(
        backend: Backend, store: Store) -> None:
    store.save_reading("a", **reading(1))
    store.save_reading("a", tail={"offset": 5}, source={}, step=None, last_record_at=None)
    rows = backend.reader().execute("SELECT tail, source, step, last_record_at FROM run_reading").fetchall()
    assert [tuple(r) for r in rows] == [('{"offset": 5}', "{}", None, None)]
    assert store.run_state("a") == ("pending", {"tail": {"offset": 5}, "source": {}})  # no step read yet: none said


def test_a_deferred_block_of_many_runs_writes_every_reading(store: Store) -> None:
    runs = [f"r{i}" for i in range(400)]  # more than one UPSERT's worth
    for run in runs:
        store.set_run_state(run, "running", 1.0)
    with store.deferred_readings():
        for i, run in enumerate(runs):
            store.save_reading(run, **reading(i))
    states = store.run_states()
    assert [states[run][1]["step"] for run in runs] == [10 * i for i in range(400)]


def test_facts_merged_inside_a_deferred_block_are_written_at_once(backend: Backend, store: Store) -> None:
    """A fact a restarted daemon must find (a stop signal sent) never waits for a round's end."""
    with store.deferred_readings():
        store.save_reading("a", **reading(1))
        store.merge_run_facts("a", 1.0, stop={"sent_at": 1.0})
        seen = backend.reader().execute("SELECT facts FROM run_state").fetchone()[0]
        assert seen == '{"stop": {"sent_at": 1.0}}'  # the stop now; the reading with the block's end
    assert store.run_state("a") == ("pending", {"stop": {"sent_at": 1.0}, **reading(1)})


def test_a_reading_rolled_back_with_its_batch_leaves_the_one_before(store: Store) -> None:
    store.save_reading("a", **reading(1))
    with pytest.raises(RuntimeError), store.batch():
        store.save_reading("a", **reading(2))
        raise RuntimeError("the round failed")
    assert store.run_state("a")[1] == reading(1)


def test_owed_answers_and_begun_marks_are_kept_one_a_request(backend: Backend, store: Store) -> None:
    """Each request's mark is a row of its own: writing one never erases another's (a daemon that read
    none of a dead one's marks cannot write them away), and answering one forgets it alone."""
    store.mark_request_started("a", 7, "poll-now")
    store.mark_request_started("a", 9, "relaunch")
    store.mark_request_started("b", 7, "poll-now")  # ids are the database's: the same id is never another run's,
    store.save_owed_answer("a", 7, "polled")  # but a run's marks are read by run
    store.save_owed_answer("a", 7, "polled again")
    assert store.started_requests("a") == {7: "poll-now", 9: "relaunch"}
    assert store.owed_answers("a") == {7: "polled again"}
    store.forget_request("a", 7)
    assert (store.owed_answers("a"), store.started_requests("a")) == ({}, {9: "relaunch"})
    assert store.started_requests("b") == {7: "poll-now"}
    again = backend.open()  # what a restarted daemon finds
    assert again.started_requests("a") == {9: "relaunch"} and again.owed_answers("b") == {}
    again.close()


def test_held_posts_are_kept_in_order_and_replaced_whole(store: Store) -> None:
    launch = {"kind": "launch", "payload": {"run": "a", "text": "launched"}, "key": "a:1:launch", "thread_of": None,
              "thread_key": None}
    poll = {"kind": "poll", "payload": {"run": "a", "poll_id": 3}, "key": "a:poll:3", "thread_of": None,
            "thread_key": "a:1:launch"}
    store.hold_posts("a", [launch, poll])
    store.hold_posts("b", [launch])
    assert store.held_posts("a") == [launch, poll] and store.outbox_summary().held == 3
    store.hold_posts("a", [{**poll, "thread_of": 12, "thread_key": None}])  # the launch post queued as id 12
    assert store.held_posts("a") == [{**poll, "thread_of": 12, "thread_key": None}]
    store.hold_posts("a", [])
    assert store.held_posts("a") == [] and store.outbox_summary().held == 1


def test_a_batch_commits_once_and_a_failed_part_of_it_leaves_nothing(backend: Backend, store: Store) -> None:
    reader = backend.reader()
    with store.batch():
        store.add_poll("a", 1, 1.0, "first", Snapshot.from_dict({"step": 1}))
        with pytest.raises(ZeroDivisionError), store.tx() as db:  # one part fails: only it is undone
            db.execute("INSERT INTO run_state (run, status, facts, updated_at) VALUES ('a', 'x', '{}', 2.0)")
            raise ZeroDivisionError
        store.add_poll("a", 1, 3.0, "periodic", Snapshot.from_dict({"step": 3}))
        assert reader.execute("SELECT COUNT(*) FROM polls").fetchone()[0] == 0  # not committed yet
    assert [p.kind for p in store.polls("a")] == ["periodic", "first"]
    assert reader.execute("SELECT COUNT(*) FROM polls").fetchone()[0] == 2
    assert store.run_state("a") == ("pending", {})  # the failed part undone


def test_an_error_out_of_a_batch_undoes_all_of_it(store: Store) -> None:
    with pytest.raises(RuntimeError), store.batch():
        store.add_poll("a", 1, 1.0, "first", Snapshot.from_dict({}))
        raise RuntimeError("the round failed")
    assert store.polls("a") == []
    store.add_poll("a", 1, 2.0, "first", Snapshot.from_dict({}))  # and the store is usable after it
    assert len(store.polls("a")) == 1


def test_a_poll_read_again_is_parsed_once_and_a_row_written_since_is_read_anew(store: Store) -> None:
    """Each poll's snapshot is parsed once however often it is read (a page refreshed every few seconds);
    a new poll, and a row that reused a rolled-back one's id (SQLite reuses the largest id), are read anew."""
    store.add_poll("a", 1, 1.0, "first", Snapshot.from_dict({"step": 1}))
    first = store.polls("a", 1)[0]
    assert store.latest_polls()["a"].snapshot is first.snapshot  # the same parsed value, not a second parse
    with pytest.raises(RuntimeError), store.batch():
        store.add_poll("a", 1, 2.0, "periodic", Snapshot.from_dict({"step": 2}))
        assert store.polls("a", 1)[0].snapshot.step == 2  # read inside the batch, then rolled back
        raise RuntimeError("the round failed")
    store.add_poll("a", 1, 3.0, "periodic", Snapshot.from_dict({"step": 3}))
    assert [p.snapshot.step for p in store.polls("a")] == [3, 1]
    assert store.latest_polls()["a"].snapshot.step == 3


# -- the fleet's parts of the store: two boxes' handles on one PostgreSQL (SQLite has one box) -----------
@pytest.fixture
def two_boxes(pg_url: str) -> Iterator[tuple[Store, Store]]:
    from babysit.db.postgres import PostgresStore

    a, b = PostgresStore(pg_url, host="box-a"), PostgresStore(pg_url, host="box-b")
    yield a, b
    a.close()
    b.close()


def test_a_run_belongs_to_the_box_that_claimed_it_first(two_boxes: tuple[Store, Store], sqlite_store: Store) -> None:
    a, b = two_boxes
    assert a.claim_run("r", now=1.0) == "box-a"
    assert b.claim_run("r", now=2.0) == "box-a"  # runs never move
    assert b.claim_run("s", now=2.0) == "box-b"
    assert a.run_hosts() == {"r": "box-a", "s": "box-b"}
    assert sqlite_store.claim_run("r", now=1.0) is None and sqlite_store.run_hosts() == {}


def test_a_boxs_delivery_sees_only_the_messages_it_wrote(two_boxes: tuple[Store, Store]) -> None:
    a, b = two_boxes
    ma = a.enqueue("r", "launch", {}, now=0.0)
    a.record_poll("r", 1, 1.0, "first", Snapshot.from_dict({"step": 1}), thread_of=ma, payload={"run": "r"})
    mb = b.enqueue("s", "launch", {}, now=0.0)
    assert [m.id for m in a.due_messages(now=5.0)] == [ma] and [m.id for m in b.due_messages(now=5.0)] == [mb]
    assert (a.pending_count(), b.pending_count()) == (3, 1)
    assert len(a.messages()) == 4  # a reader sees every box's


def test_a_request_is_claimed_by_the_owning_box_once(two_boxes: tuple[Store, Store], pg_url: str) -> None:
    from babysit.db.postgres import PostgresStore

    a, b = two_boxes
    a.claim_run("r", now=1.0)
    rid = b.request("r", "abort", "slack:U1", now=2.0)  # asked on box-b, addressed to box-a
    assert b.pending_requests() == []
    twin = PostgresStore(pg_url, host="box-a")  # a second process under box-a's name
    try:
        assert [q.id for q in a.pending_requests()] == [rid]
        a.finish_request(rid, "stopping", now=3.0)
        assert twin.pending_requests() == [] and b.request_result(rid) == "stopping"
    finally:
        twin.close()


def test_a_read_survives_a_database_restart_and_a_write_after_it_succeeds(postgres: Any, pg_url: str) -> None:
    from babysit.db.postgres import PostgresStore

    store = PostgresStore(pg_url, host="box-a")
    try:
        store.enqueue("r", "launch", {}, now=0.0)
        postgres.restart("fast")
        assert len(store.messages("r")) == 1  # the lost connection reopened, the read tried again
        store.enqueue("r", "poll", {}, now=1.0)  # and a transaction begins on a fresh connection
        assert len(store.messages("r")) == 2
    finally:
        store.close()
