"""Schema 5's data step: a run's reading (its log offsets), owed answers, begun requests and held posts
leave the JSON of `run_state.facts` for tables of their own, and come back to it on a downgrade.

Shared by SQLite's step (babysit/db/sqlite_schema.py) and PostgreSQL's revision 0005, so both backends
move the same keys the same way; and by a fleet daemon after it replays a journal an older babysit left
(`move_out_replayed`). It describes the JSON shape schema 4 wrote: frozen with it, never changed with the
store's code."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

READING_KEYS = ("tail", "source", "step", "last_record_at")  # run_reading's columns, as facts keys
OWED_KEY = "owed_answers"  # {request id: answer}
STARTED_KEY = "requests_started"  # {request id: action}
HELD_KEY = "held_posts"  # [{kind, payload, key, thread_of, thread_key}], oldest first
MOVED_KEYS = (*READING_KEYS, OWED_KEY, STARTED_KEY, HELD_KEY)

# The tables' columns (each row's run first), as both backends' steps insert them.
READING_COLUMNS = ("run", "tail", "source", "step", "last_record_at")
OWED_COLUMNS = ("run", "request_id", "answer")
STARTED_COLUMNS = ("run", "request_id", "action")
HELD_COLUMNS = ("run", "n", "kind", "dedupe_key", "payload", "thread_of", "thread_key")


@dataclass(frozen=True)
class SplitFacts:
    """One run_state row's facts, split: what stays in the JSON and the rows of each new table."""

    facts: str
    reading: tuple[Any, ...] | None
    owed: tuple[tuple[Any, ...], ...]
    started: tuple[tuple[Any, ...], ...]
    held: tuple[tuple[Any, ...], ...]


def split(run: str, text: str) -> SplitFacts:
    """The moved keys out of a run's facts `text`; a key absent (or null) gives no row, or a NULL column."""
    facts = json.loads(text) if text else {}
    reading = None
    if any(facts.get(k) is not None for k in READING_KEYS):
        tail, source = facts.get("tail"), facts.get("source")
        reading = (run, None if tail is None else json.dumps(tail), None if source is None else json.dumps(source),
                   facts.get("step"), facts.get("last_record_at"))
    owed = tuple((run, int(k), str(v)) for k, v in (facts.get(OWED_KEY) or {}).items() if v is not None)
    started = tuple((run, int(k), str(v)) for k, v in (facts.get(STARTED_KEY) or {}).items())
    held = tuple((run, n, h["kind"], h.get("key"), json.dumps(h.get("payload") or {}), h.get("thread_of"),
                  h.get("thread_key")) for n, h in enumerate(facts.get(HELD_KEY) or ()))
    kept = {k: v for k, v in facts.items() if k not in MOVED_KEYS}
    return SplitFacts(json.dumps(kept), reading, owed, started, held)


def joined(text: str, reading: Iterable[Any] | None, owed: Iterable[Iterable[Any]],
           started: Iterable[Iterable[Any]], held: Iterable[Iterable[Any]]) -> str:
    """`split` undone: a run's facts with its rows of the new tables put back (each row without its run;
    a held post's without its position: `held` comes in order)."""
    facts = json.loads(text) if text else {}
    if reading is not None:
        tail, source, step, last_record_at = reading
        for key, value in (("tail", None if tail is None else json.loads(tail)),
                           ("source", None if source is None else json.loads(source)),
                           ("step", step), ("last_record_at", last_record_at)):
            if value is not None:
                facts[key] = value
    if owed_answers := {str(k): v for k, v in owed}:
        facts[OWED_KEY] = owed_answers
    if begun := {str(k): v for k, v in started}:
        facts[STARTED_KEY] = begun
    if posts := [{"kind": kind, "payload": json.loads(payload), "key": key, "thread_of": thread_of,
                  "thread_key": thread_key} for kind, key, payload, thread_of, thread_key in held]:
        facts[HELD_KEY] = posts
    return json.dumps(facts)


def insert_sql(table: str, columns: tuple[str, ...]) -> str:
    return f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({', '.join('?' * len(columns))})"


def move_out_sqlite(db: Any) -> None:
    """SQLite's step 5 (inside its transaction, the tables made): every run's moved facts into the tables."""
    for run, text in db.execute("SELECT run, facts FROM run_state").fetchall():
        part = split(run, text)
        if part.reading is not None:
            db.execute(insert_sql("run_reading", READING_COLUMNS), part.reading)
        db.executemany(insert_sql("owed_answers", OWED_COLUMNS), part.owed)
        db.executemany(insert_sql("started_requests", STARTED_COLUMNS), part.started)
        db.executemany(insert_sql("held_posts", HELD_COLUMNS), part.held)
        db.execute("UPDATE run_state SET facts=? WHERE run=?", (part.facts, run))


def move_out_replayed(db: Any) -> int:
    """After a fleet journal was replayed (babysit/db/journal.py; `db` a PgConnection, connected): the facts
    that a journal an older babysit wrote put back into `run_state` moved out again, the reading the
    journal's (the newer), the marks and held posts added to those there. One transaction; how many runs
    it moved. Without such a journal: one query."""
    like = " OR ".join(["facts LIKE ?"] * len(MOVED_KEYS))
    db.execute("BEGIN")
    try:
        moved = 0
        for run, text in db.execute(f"SELECT run, facts FROM run_state WHERE {like}",
                                    tuple(f'%"{k}"%' for k in MOVED_KEYS)).fetchall():
            facts = json.loads(text)
            if not set(facts) & set(MOVED_KEYS):
                continue  # the name was in a value, not a key
            part = split(run, text)
            if part.reading is not None:
                db.execute(insert_sql("run_reading", READING_COLUMNS) + " ON CONFLICT (run) DO UPDATE SET"
                           " tail=COALESCE(excluded.tail, run_reading.tail),"
                           " source=COALESCE(excluded.source, run_reading.source),"
                           " step=COALESCE(excluded.step, run_reading.step),"
                           " last_record_at=COALESCE(excluded.last_record_at, run_reading.last_record_at)",
                           part.reading)
            # marks added, never removed: one of a request answered since is never read again (its request is
            # no longer pending), and one removed could be a mark written since, in the same journal
            for table, columns, rows in (("owed_answers", OWED_COLUMNS, part.owed),
                                         ("started_requests", STARTED_COLUMNS, part.started)):
                for row in rows:
                    db.execute(insert_sql(table, columns) + f" ON CONFLICT (run, request_id) DO UPDATE SET"
                               f" {columns[2]}=excluded.{columns[2]}", row)
            held = db.execute("SELECT dedupe_key, n FROM held_posts WHERE run=?", (run,)).fetchall()
            keys, n = {r[0] for r in held}, max((r[1] for r in held), default=-1) + 1
            for row in part.held:  # behind those held already, each once (queued by its key: never twice)
                if row[3] not in keys:
                    db.execute(insert_sql("held_posts", HELD_COLUMNS), (run, n, *row[2:]))
                    n += 1
            db.execute("UPDATE run_state SET facts=? WHERE run=?", (part.facts, run))
            moved += 1
        db.execute("COMMIT")
    except BaseException:
        db.execute("ROLLBACK")
        raise
    return moved
