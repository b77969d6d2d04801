"""A run's state: its status and facts (`run_state`: what the surfaces show of it, one JSON object a run,
written when the status changes or a fact is learnt), and its reading (`run_reading`: how far its output
was read, saved by every round that read some, so a restart reads on from there).

`run_state` reads them together: the facts with the reading's `tail`, `source`, `step` and
`last_record_at` beside them. The reading is one UPSERT a save; a round's saves wait for the round's end
(`deferred_readings`) so that they cost one commit, and never run ahead of the record log they count."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from babysit.db.sqlbase import SqlBase

READING_CHUNK = 150  # readings an UPSERT carries (5 parameters each: under SQLite's old 999 limit)
_READ = ("SELECT s.run, s.status, s.facts, r.tail, r.source, r.step, r.last_record_at FROM run_state s"
         " LEFT JOIN run_reading r ON r.run = s.run")
_UPSERT_READING = ("INSERT INTO run_reading (run, tail, source, step, last_record_at) VALUES {values}"
                   " ON CONFLICT (run) DO UPDATE SET tail=excluded.tail, source=excluded.source,"
                   " step=excluded.step, last_record_at=excluded.last_record_at")


class RunFacts(SqlBase):
    """The run_state and run_reading tables: a run's status, facts and reading."""

    @contextmanager
    def deferred_readings(self) -> Iterator[None]:
        """The `save_reading` calls this thread makes inside are written together at the end, the last of
        each run's: a round's readings of every run cost one commit, not one each; a reader's, one after
        its record log is synced."""
        if getattr(self._local, "readings", None) is not None:
            yield
            return
        self._local.readings = {}
        try:
            yield
        finally:
            self.flush_deferred_readings()
            self._local.readings = None

    def flush_deferred_readings(self) -> None:
        """Write the readings `deferred_readings` holds now (inside a `batch()`, as part of it)."""
        pending = getattr(self._local, "readings", None)
        if pending:
            self._local.readings = {}
            self._write_readings(list(pending.values()))

    def run_state(self, run: str) -> tuple[str, dict[str, Any]]:
        rows = self._query(_READ + " WHERE s.run=?", (run,))
        if not rows:  # a reading saved before any status
            rows = self._query("SELECT 'pending' AS status, '{}' AS facts, tail, source, step, last_record_at"
                               " FROM run_reading WHERE run=?", (run,))
        return (rows[0]["status"], _facts(rows[0])) if rows else ("pending", {})

    def run_states(self) -> dict[str, tuple[str, dict[str, Any]]]:
        return {r["run"]: (r["status"], _facts(r)) for r in self._query(_READ)}

    def set_run_state(self, run: str, status: str, now: float, **facts: Any) -> None:
        """Set the run's status and merge `facts` into what is known of it."""
        self._merge(run, status, facts, now)

    def merge_run_facts(self, run: str, now: float, **facts: Any) -> None:
        """Merge `facts` into what is known of the run, its status left as it is (`pending` for a run with
        no state yet). Written at once: a fact a restarted daemon must find (a stop signal sent)."""
        self._merge(run, None, facts, now)

    def _merge(self, run: str, status: str | None, facts: dict[str, Any], now: float) -> None:
        with self.tx() as db:
            row = db.execute("SELECT status, facts FROM run_state WHERE run=?", (run,)).fetchone()
            merged = {**(json.loads(row[1]) if row else {}), **facts}
            db.execute("INSERT INTO run_state (run, status, facts, updated_at) VALUES (?, ?, ?, ?)"
                       " ON CONFLICT (run) DO UPDATE SET status=excluded.status, facts=excluded.facts,"
                       " updated_at=excluded.updated_at",
                       (run, status or (row[0] if row else "pending"), json.dumps(merged), now))

    def save_reading(self, run: str, *, tail: dict[str, Any], source: dict[str, Any], step: int | None,
                     last_record_at: float | None) -> None:
        """How far the run's output was read: the record log's reading (`tail`), the source's own state,
        the last step and the last record's time. Inside `deferred_readings()`, written at that block's end."""
        reading = (run, tail, source, step, last_record_at)
        pending = getattr(self._local, "readings", None)
        if pending is not None:
            pending[run] = reading
            return
        self._write_readings([reading])

    def _write_readings(self, readings: list[tuple[Any, ...]]) -> None:
        with self.tx() as db:
            for i in range(0, len(readings), READING_CHUNK):
                chunk = readings[i:i + READING_CHUNK]
                args: list[Any] = []
                for run, tail, source, step, last_record_at in chunk:
                    args += [run, json.dumps(tail), json.dumps(source), step, last_record_at]
                db.execute(_UPSERT_READING.format(values=", ".join(["(?, ?, ?, ?, ?)"] * len(chunk))), tuple(args))


def _facts(row: Any) -> dict[str, Any]:
    """A run's facts with its reading beside them (a column not saved: no key)."""
    facts = json.loads(row["facts"])
    for key in ("tail", "source"):
        if row[key] is not None:
            facts[key] = json.loads(row[key])
    for key in ("step", "last_record_at"):
        if row[key] is not None:
            facts[key] = row[key]
    return facts
