"""A run's state: its status and its facts (what is known of it: log offsets, marks of what was done, the
posts it holds), one JSON object a run. Every guard and poll round merges into the facts of every run, so
merges can wait to be written together (`deferred_facts`) and serialize only the keys they change."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from babysit.db.sqlbase import SqlBase

MERGE_CHUNK = 200  # runs a merge statement carries (4 parameters each: under SQLite's old 999 limit)
HELD_POSTS_FACT = "held_posts"  # a run's facts: its posts the outbox refused, held (babysit/run/run_posts.py)
OWED_ANSWERS_FACT = "owed_answers"  # a run's facts: control answers the store refused, by request id (daemon.py)
STARTED_REQUESTS_FACT = "requests_started"  # a run's facts: requests begun and not yet answered, id -> action


class RunFacts(SqlBase):
    """The run_state table: a run's status and facts."""

    @contextmanager
    def deferred_facts(self) -> Iterator[None]:
        """`merge_run_facts` calls this thread makes inside are kept and written together, in one
        transaction, at the end: a round's log offsets for every run cost one commit, not one each."""
        if getattr(self._local, "facts", None) is not None:
            yield
            return
        self._local.facts = {}
        try:
            yield
        finally:
            self.flush_deferred_facts()
            self._local.facts = None

    def flush_deferred_facts(self) -> None:
        """Write the merges `deferred_facts` holds now (inside a `batch()`, as part of it)."""
        pending = getattr(self._local, "facts", None)
        if pending:
            self._local.facts = {}
            self._merge_facts(pending)

    def run_state(self, run: str) -> tuple[str, dict[str, Any]]:
        rows = self._query("SELECT status, facts FROM run_state WHERE run=?", (run,))
        if not rows:
            return "pending", {}
        return rows[0]["status"], json.loads(rows[0]["facts"])

    def set_run_state(self, run: str, status: str, now: float, **facts: Any) -> None:
        """Set the run's status and merge `facts` into what is known of it."""
        with self.tx() as db:
            merge_run_state(db, run, status, facts, now)

    def merge_run_facts(self, run: str, now: float, *, at_once: bool = False, **facts: Any) -> None:
        """Merge `facts` into what is known of the run, its status left as it is (`pending` for a run
        with no state yet). Inside `deferred_facts()` the merge waits for the end of that block, unless
        `at_once` (a fact a restarted daemon must find, such as a stop signal having been sent)."""
        pending = getattr(self._local, "facts", None)
        if pending is not None and not at_once:
            merged = pending.setdefault(run, [now, {}])
            merged[0] = now
            merged[1].update(facts)
            return
        self._merge_facts({run: [now, facts]})

    def _merge_facts(self, facts_by_run: dict[str, list[Any]]) -> None:
        """Every run's merge in one transaction, read and written in chunks of MERGE_CHUNK runs: two
        statements a chunk, not two a run (a round of log offsets over 50 runs: 2 round trips, not 100)."""
        if len(facts_by_run) == 1:
            ((run, (now, facts)),) = facts_by_run.items()
            with self.tx() as db:
                row = db.execute("SELECT status, facts FROM run_state WHERE run=?", (run,)).fetchone()
                db.execute("INSERT INTO run_state (run, status, facts, updated_at) VALUES (?, ?, ?, ?)"
                           " ON CONFLICT (run) DO UPDATE SET facts=excluded.facts, updated_at=excluded.updated_at",
                           (run, row[0] if row else "pending", self._merged_facts(run, row[1] if row else None, facts),
                            now))
            return
        items = list(facts_by_run.items())
        with self.tx() as db:
            for i in range(0, len(items), MERGE_CHUNK):
                chunk = items[i:i + MERGE_CHUNK]
                marks = ", ".join("?" * len(chunk))
                known = {r[0]: (r[1], r[2]) for r in db.execute(
                    f"SELECT run, status, facts FROM run_state WHERE run IN ({marks})", tuple(r for r, _ in chunk))}
                rows: list[Any] = []
                for run, (now, facts) in chunk:
                    status, old = known.get(run, ("pending", None))
                    rows += [run, status, self._merged_facts(run, old, facts), now]
                db.execute("INSERT INTO run_state (run, status, facts, updated_at) VALUES "
                           + ", ".join(["(?, ?, ?, ?)"] * len(chunk))
                           + " ON CONFLICT (run) DO UPDATE SET facts=excluded.facts, updated_at=excluded.updated_at",
                           tuple(rows))

    def _merged_facts(self, run: str, old: str | None, facts: Mapping[str, Any]) -> str:
        """`json.dumps({**json.loads(old), **facts})`, the same text, each key's value serialized once.

        Every guard round and poll round merges each run's log offsets into its facts: the whole stored
        text was parsed and every value serialized again, for the few keys that changed (7.5 % of a
        300-run poll round's CPU, py-spy). The pieces of the text this store wrote last are kept by run;
        when the row still holds that text (no other writer since, no rollback: a rolled-back write
        leaves the old text, which is not the kept one), only the merged keys are serialized."""
        kept = self._facts_written.get(run)
        if kept is not None and kept[0] == old:
            pieces = dict(kept[1])
        else:  # first merge of this run by this store, or another writer's text: parsed once
            pieces = {k: json_piece(k, v) for k, v in (json.loads(old) if old else {}).items()}
        for key, value in facts.items():
            pieces[key] = json_piece(key, value)
        text = "{" + ", ".join(pieces.values()) + "}"
        self._facts_written[run] = (text, pieces)
        return text

    def run_states(self) -> dict[str, tuple[str, dict[str, Any]]]:
        return {r["run"]: (r["status"], json.loads(r["facts"])) for r in self._query("SELECT * FROM run_state")}

_KEY_TEXT: dict[str, str] = {}  # a facts key as json.dumps writes it in a dict, with its ": " (a few dozen names)


def json_piece(key: str, value: Any) -> str:
    """`"key": value` exactly as json.dumps writes that item of a dict; an int, None or a finite float
    without a json.dumps call (each call builds an encoder: most of a small value's cost)."""
    head = _KEY_TEXT.get(key)
    if head is None:
        head = _KEY_TEXT[key] = json.dumps(key) + ": "
    kind = type(value)
    if kind is int:
        return head + int.__repr__(value)
    if value is None:
        return head + "null"
    if kind is float and math.isfinite(value):
        return head + float.__repr__(value)
    return head + json.dumps(value)


def merge_run_state(db: Any, run: str, status: str | None, facts: dict[str, Any],
                     now: float) -> None:
    """Inside a write transaction: merge `facts` into the run's, setting its status unless None."""
    row = db.execute("SELECT status, facts FROM run_state WHERE run=?", (run,)).fetchone()
    merged = {**(json.loads(row[1]) if row else {}), **facts}
    new_status = status if status is not None else (row[0] if row else "pending")
    db.execute(
        "INSERT INTO run_state (run, status, facts, updated_at) VALUES (?, ?, ?, ?)"
        " ON CONFLICT (run) DO UPDATE SET status=excluded.status, facts=excluded.facts,"
        " updated_at=excluded.updated_at", (run, new_status, json.dumps(merged), now))
