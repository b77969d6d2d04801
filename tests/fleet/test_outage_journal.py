"""The daemon's store through a real PostgreSQL outage (`pg_ctl stop`, then start): every write made while
it is down lands on the local mirror and in the journal, reads answer from the mirror, and once the server
is back the journal is replayed in order with every id kept, exactly once even when replayed twice
(babysit/db/journal.py, docs/fleet.md "The database down")."""

from __future__ import annotations

import shutil
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from babysit.core.snapshot import Snapshot
from babysit.db import journal, mirror
from babysit.db.postgres import PgConnection, PostgresStore
from babysit.db.store import PollRow
from tests.support import wait_for


def _daemon_store(url: str, state: Path) -> PostgresStore:
    store = PostgresStore(url, host="box-a", state_dir=state)
    assert store.claim_run("r1", 1.0) == "box-a"
    store.start_journal()
    return store


def test_writes_while_postgres_is_down_are_babysat_locally_and_replayed_once_with_their_ids(
        pg_url: str, tmp_path: Path, outage: Callable[[], None], postgres: Any) -> None:
    store = _daemon_store(pg_url, tmp_path)
    other = None
    try:
        first = store.begin_attempt("r1", 1, "base", ["python", "train.py"], "local", 1, "a1", 10.0)
        store.mark_running(first.id, started_at=11.0, pid=123)
        launch = store.enqueue("r1", "text", {"text": "launched"}, 11.0)
        store.mark_sent(launch, "ts-1", 11.5)
        store.set_run_state("r1", "running", 11.0, step=5)

        outage()
        # the run ends and is retried, a poll lands, the verdict is final, its post goes out: all while down
        store.mark_ended(first.id, ended_at=20.0, outcome="crashed", exit_code=1)
        assert store.down, "a write on a lost connection must switch the store to its mirror"
        assert [a.status for a in store.attempts("r1")] == ["ended"]  # read back from the mirror
        second = store.begin_attempt("r1", 2, "base", ["python", "train.py"], "local", 1, "a2", 21.0)
        assert second.id > first.id  # ids of this box's reserve: in order, and the database's own
        store.record_polls([PollRow("r1", 2, 30.0, "periodic", Snapshot.from_dict({"step": 9}), launch, {"text": "poll"})])
        verdict = store.save_verdict("r1", {"status": "CONFIRMED", "at_step": 9}, 40.0, final=True)
        posted = store.enqueue("r1", "verdict", {"text": "FINAL"}, 40.0, thread_of=launch,
                               dedupe_key="r1:verdict-final")
        assert store.enqueue("r1", "verdict", {"text": "FINAL"}, 40.0, dedupe_key="r1:verdict-final") == posted
        store.merge_run_facts("r1", 41.0, step=9)
        due = store.due_messages(50.0)
        assert [m.kind for m in due] == ["poll"]  # the run's queue, read from the mirror, in order
        for m in store.messages("r1"):
            if m.status == "pending":
                store.mark_sent(m.id, f"ts-{m.id}", 50.0)  # Slack reachable: sent while down, recorded locally
        assert store.run_state("r1") == ("running", {"step": 9})
        assert store.final_verdict("r1").id == verdict
        assert store.pending_requests() == [] and store.now() > 0  # no database: no requests, this clock
        assert store.journal_pending() >= 8
        copy = tmp_path / "journal-copy.db"
        with sqlite3.connect(copy) as dest:
            store._db.local.backup(dest)

        postgres.start()
        wait_for("the journal replayed", lambda: not store.down and store.journal_pending() == 0)
        assert store.last_replay is not None and store.last_replay["transactions"] >= 8

        other = PostgresStore(pg_url, host="box-b")  # what every other box reads now
        attempts = other.attempts("r1")
        assert [(a.id, a.n, a.status, a.outcome) for a in attempts] == [
            (first.id, 1, "ended", "crashed"), (second.id, 2, "launching", None)]
        assert other.final_verdict("r1").id == verdict
        assert other.run_state("r1") == ("running", {"step": 9})
        messages = other.messages("r1")
        assert [(m.kind, m.status) for m in messages] == [("text", "sent"), ("poll", "sent"), ("header", "sent"),
                                                          ("verdict", "sent")]
        assert next(m for m in messages if m.kind == "verdict").id == posted
        assert next(m for m in messages if m.kind == "poll").payload["snapshot"]["step"] == 9

        before = {t: other._query(f"SELECT COUNT(*) FROM {t}")[0][0] for t in ("attempts", "polls", "outbox", "verdicts")}
        conn = PgConnection(pg_url, "test")
        try:
            replica = sqlite3.connect(copy, isolation_level=None)
            replica.row_factory = sqlite3.Row
            assert journal.replay(conn, replica) >= 8  # the same journal once more (a kill before its removal)
            replica.close()
        finally:
            conn.close()
        after = {t: other._query(f"SELECT COUNT(*) FROM {t}")[0][0] for t in ("attempts", "polls", "outbox", "verdicts")}
        assert after == before
        assert [(m.kind, m.status) for m in other.messages("r1")] == [(m.kind, m.status) for m in messages]

        # connected again: writes go to PostgreSQL at once, after the replayed ones
        store.mark_ended(second.id, ended_at=60.0, outcome="completed", exit_code=0)
        assert other.attempt("r1", 2).outcome == "completed"
        assert store.journal_pending() == 0
    finally:
        store.close()
        if other is not None:
            other.close()


def test_a_journal_left_by_a_daemon_stopped_while_down_is_replayed_when_it_starts(
        pg_url: str, tmp_path: Path, outage: Callable[[], None], postgres: Any) -> None:
    store = _daemon_store(pg_url, tmp_path)
    attempt = store.begin_attempt("r1", 1, "base", ["true"], "local", 0, "a1", 1.0)
    outage()
    store.mark_ended(attempt.id, ended_at=2.0, outcome="completed", exit_code=0)
    bad = store._db.local.execute("INSERT INTO journal (at, statements) VALUES (?, ?)",
                                  (2.5, '[["UPDATE no_such_table SET x = 1", []]]')).lastrowid
    verdict = store.save_verdict("r1", {"status": "CONFIRMED"}, 3.0, final=True)
    store.close()  # the daemon stopped before PostgreSQL came back
    postgres.start()
    again = _daemon_store(pg_url, tmp_path)
    try:
        assert again.journal_pending() == 0
        assert again.attempt("r1", 1).outcome == "completed"
        assert again.final_verdict("r1").id == verdict  # replayed after the one PostgreSQL refused
        refused = again._db.local.execute("SELECT seq, error FROM journal_refused").fetchall()
        assert [r[0] for r in refused] == [bad] and "no_such_table" in refused[0][1]
    finally:
        again.close()


def test_a_run_new_to_the_fleet_and_a_request_wait_while_postgres_is_down(
        pg_url: str, tmp_path: Path, outage: Callable[[], None]) -> None:
    from babysit.core.errors import StateError

    store = _daemon_store(pg_url, tmp_path)
    try:
        asked = store.request("r1", "poll", "U1", 2.0)  # the gateway's bot asks through the daemon's store
        assert [r.id for r in store.pending_requests()] == [asked]  # numbered and addressed by PostgreSQL
        outage()
        store.set_run_state("r1", "running", 5.0)
        assert store.claim_run("r1", 5.0) == "box-a"  # its own run: babysat on
        with pytest.raises(StateError, match="not this box's yet"):
            store.claim_run("r2", 5.0)
        with pytest.raises(StateError, match="PostgreSQL is down"):
            store.request("r1", "abort", "U1", 6.0)  # a request cannot reach a box without the database
        assert store.journal_pending() == 1
    finally:
        store.close()


def test_an_amendment_declared_by_another_process_reaches_the_mirror_before_an_outage(
        pg_url: str, tmp_path: Path, outage: Callable[[], None]) -> None:
    store = _daemon_store(pg_url, tmp_path)
    cli = PostgresStore(pg_url, host="box-a")  # `babysit amend` on the box: PostgreSQL, not the daemon's store
    try:
        cli.add_amendment("r1", "read later", "the read moves to step 200", "2026-12-01T00:00:00Z", 90)
        store.refresh_mirror()  # the daemon's guard round
        outage()
        store.set_run_state("r1", "running", 5.0)  # down now
        assert store.down
        assert [a.title for a in store.amendments("r1")] == ["read later"]  # what a FINAL verdict then counts
    finally:
        store.close()
        cli.close()


def test_the_mirror_holds_this_box_rows_only(pg_url: str, tmp_path: Path) -> None:
    box_b = PostgresStore(pg_url, host="box-b")
    box_b.claim_run("theirs", 1.0)
    box_b.begin_attempt("theirs", 1, "base", ["true"], "local", 0, "b1", 1.0)
    box_b.close()
    store = _daemon_store(pg_url, tmp_path)
    try:
        local = store._db.local
        assert [r[0] for r in local.execute("SELECT run FROM runs")] == ["r1"]
        assert local.execute("SELECT COUNT(*) FROM attempts").fetchone()[0] == 0
    finally:
        store.close()
    shutil.rmtree(tmp_path / "unused", ignore_errors=True)


def test_connected_a_write_answers_with_postgres_rowcount_not_the_mirror(pg_url: str, tmp_path: Path) -> None:
    store = _daemon_store(pg_url, tmp_path)
    gateway = PostgresStore(pg_url, host="box-a")  # another process: its row is not in the daemon's mirror
    try:
        call = gateway.open_owner_call("c", "r1", "go on?", ("yes", "no"), {}, 1.0, "c:r1:1")
        assert store.decide_owner_call(call.id, "yes", "U1", 2.0) is True  # the mirror would say 0 rows
        assert store.decide_owner_call(call.id, "no", "U2", 3.0) is False
        assert gateway.owner_call(call.id).decision == "yes"
    finally:
        store.close()
        gateway.close()


def test_a_refill_of_ids_cut_by_the_outage_goes_on_from_the_reserve(
        pg_url: str, tmp_path: Path, outage: Callable[[], None], monkeypatch: pytest.MonkeyPatch) -> None:
    store = _daemon_store(pg_url, tmp_path)
    try:
        monkeypatch.setattr(journal, "POOL_LOW", 10**9)  # every id taken asks PostgreSQL for more first
        before = store.add_incident("r1", None, 1.0, "first", {})
        outage()
        after = store.add_incident("r1", None, 2.0, "second", {})  # the refill fails: the store goes down
        assert store.down and after > before
        assert [r.kind for r in store.incidents("r1")] == ["second", "first"]
    finally:
        store.close()


def test_an_outage_in_the_middle_of_a_transaction_journals_all_of_it(
        pg_url: str, tmp_path: Path, outage: Callable[[], None], postgres: Any) -> None:
    store = _daemon_store(pg_url, tmp_path)
    other = PostgresStore(pg_url, host="box-b")
    try:
        with store.batch():  # one transaction: its first write reached PostgreSQL, which then went away
            store.add_poll("r1", 1, 1.0, "first", Snapshot.from_dict({"step": 1}))
            outage()
            store.add_poll("r1", 1, 2.0, "second", Snapshot.from_dict({"step": 2}))
        assert store.down and store.journal_pending() == 1
        assert [p.kind for p in store.polls("r1")] == ["second", "first"]
        postgres.start()
        wait_for("the journal replayed", lambda: not store.down and store.journal_pending() == 0)
        assert [p.kind for p in other.polls("r1")] == ["second", "first"]  # the rolled-back part included
    finally:
        store.close()
        other.close()


def test_the_mirror_says_it_was_in_step_as_of_the_daemon_s_last_connected_write(pg_url: str, tmp_path: Path) -> None:
    """What the readers' banner says while PostgreSQL is down (`in step with the database until …`): the
    daemon's last write committed there, not its start (a box whose daemon had not yet met the outage said
    its mirror was hours old)."""
    store = _daemon_store(pg_url, tmp_path)
    try:
        seeded = mirror.synced_at(store._db.local)
        time.sleep(1.1)
        before = time.time()
        store.add_incident("r1", None, 2.0, "later", {})
        assert seeded is not None and mirror.synced_at(store._db.local) >= before > seeded
    finally:
        store.close()
