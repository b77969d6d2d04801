"""A run's reading, owed answers, begun requests and held posts (schema 5's tables) through a real PostgreSQL
outage: copied into the box's mirror when its daemon starts, read from the mirror while the database is
down (a restart reads on, answers what it owes, queues what it held), written there and replayed once it is
back."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from babysit.db import journal
from babysit.db.postgres import PostgresStore
from tests.support import wait_for

LAUNCH = {"kind": "launch", "payload": {"run": "r1", "text": "launched"}, "key": "r1:1:launch", "thread_of": None,
          "thread_key": None}
POLL = {"kind": "poll", "payload": {"run": "r1", "poll_id": 3}, "key": "r1:poll:3", "thread_of": None,
        "thread_key": "r1:1:launch"}


def reading(step: int) -> dict[str, Any]:
    return {"tail": {"offset": 100 * step, "records": step}, "source": {"lines": 2 * step}, "step": step,
            "last_record_at": float(step)}


def test_a_run_s_reading_and_marks_are_in_the_mirror_and_written_there_while_postgres_is_down(
        pg_url: str, tmp_path: Path, outage: Callable[[], None], postgres: Any) -> None:
    before = PostgresStore(pg_url, host="box-a")  # what a daemon before this one wrote
    assert before.claim_run("r1", 1.0) == "box-a"
    before.set_run_state("r1", "running", 1.0, attempt=1)
    before.save_reading("r1", **reading(10))
    before.save_owed_answer("r1", 7, "polled")
    before.mark_request_started("r1", 9, "relaunch")
    before.hold_posts("r1", [LAUNCH, POLL])
    before.close()

    store = PostgresStore(pg_url, host="box-a", state_dir=tmp_path)
    store.start_journal()  # its mirror seeded from PostgreSQL
    other = None
    try:
        outage()
        assert store.run_state("r1") == ("running", {"attempt": 1, **reading(10)})  # what a restart reads on from
        assert store.down, "a read on a lost connection must switch the store to its mirror"
        assert store.owed_answers("r1") == {7: "polled"} and store.started_requests("r1") == {9: "relaunch"}
        assert store.held_posts("r1") == [LAUNCH, POLL]
        store.save_reading("r1", **reading(20))
        assert store.run_state("r1") == ("running", {"attempt": 1, **reading(20)})
        store.forget_request("r1", 7)
        store.mark_request_started("r1", 11, "poll-now")
        store.hold_posts("r1", [{**POLL, "thread_of": 5, "thread_key": None}])

        postgres.start()
        wait_for("the journal replayed", lambda: not store.down and store.journal_pending() == 0)
        other = PostgresStore(pg_url, host="box-b")  # what every other box reads now
        assert other.run_state("r1") == ("running", {"attempt": 1, **reading(20)})
        assert other.owed_answers("r1") == {}
        assert other.started_requests("r1") == {9: "relaunch", 11: "poll-now"}
        assert other.held_posts("r1") == [{**POLL, "thread_of": 5, "thread_key": None}]
    finally:
        store.close()
        if other is not None:
            other.close()


def test_a_journal_an_older_babysit_left_is_replayed_with_its_facts_moved_to_their_tables(
        pg_url: str, tmp_path: Path) -> None:
    """A box whose daemon stopped while PostgreSQL was down, then upgraded: its journal holds schema 4's writes,
    the run's whole facts JSON with its reading and marks inside. Replayed by today's daemon at its start,
    they land in their tables, not in a JSON nobody reads them from any longer; no mark there is erased."""
    setup = PostgresStore(pg_url, host="box-a")
    assert setup.claim_run("r1", 1.0) == "box-a"
    setup.set_run_state("r1", "running", 1.0, attempt=1)
    setup.save_reading("r1", **reading(10))  # what the database held before the outage
    setup.mark_request_started("r1", 9, "relaunch")
    setup.mark_request_started("r1", 11, "poll-now")  # a mark the journal's JSON lacks: kept, never erased
    setup.close()
    old_facts = {"attempt": 1, **reading(30), "owed_answers": {"9": "relaunched as attempt 2"},
                 "requests_started": {"9": "relaunch"}, "held_posts": [LAUNCH]}
    local = journal.open_local(tmp_path / journal.JOURNAL_FILE)
    local.execute("INSERT INTO journal (at, statements) VALUES (?, ?)", (time.time(), json.dumps([[
        "INSERT INTO run_state (run, status, facts, updated_at) VALUES (?, ?, ?, ?) ON CONFLICT (run) DO UPDATE"
        " SET status=excluded.status, facts=excluded.facts, updated_at=excluded.updated_at",
        ["r1", "running", json.dumps(old_facts), 30.0]]])))
    local.close()

    store = PostgresStore(pg_url, host="box-a", state_dir=tmp_path)
    other = PostgresStore(pg_url, host="box-b")
    try:
        assert store.start_journal() == 1
        assert other.run_state("r1") == ("running", {"attempt": 1, **reading(30)})
        assert other.owed_answers("r1") == {9: "relaunched as attempt 2"}
        assert other.started_requests("r1") == {9: "relaunch", 11: "poll-now"}
        assert other.held_posts("r1") == [LAUNCH]
        (text,) = other._query("SELECT facts FROM run_state WHERE run='r1'")[0]
        assert json.loads(text) == {"attempt": 1}
    finally:
        store.close()
        other.close()
