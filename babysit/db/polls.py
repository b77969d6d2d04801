"""Polls and incidents: one run's, recorded and read, and every run's latest at once (the web page and
/metrics ask one query each, not one a run)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from babysit.core.snapshot import Snapshot
from babysit.db.rows import Poll, PollRow, Row
from babysit.db.sqlbase import SqlBase

POLLS_REMEMBERED = 4096  # parsed polls a store keeps (`_poll`): every run's latest of a 4,000-run fleet


class PollTables(SqlBase):
    """The polls and incidents tables (a recorded poll's posts go to the outbox in the same transaction)."""

    def add_poll(self, run: str, attempt: int | None, at: float, kind: str, snapshot: Snapshot) -> int:
        with self.tx() as db:
            return self._insert_id(db, "INSERT INTO polls (run, attempt, at, kind, snapshot) VALUES (?, ?, ?, ?, ?)",
                                   (run, attempt, at, kind, json.dumps(snapshot.to_dict())))

    def record_poll(self, run: str, attempt: int, at: float, kind: str, snapshot: Snapshot,
                    thread_of: int | None, payload: dict[str, Any]) -> None:
        """One poll: `record_polls` of one."""
        self.record_polls([PollRow(run, attempt, at, kind, snapshot, thread_of, payload)])

    def record_polls(self, polls: Sequence[PollRow]) -> None:
        """Each poll's row, its threaded post and its live-header update, all in ONE transaction: a poll
        is recorded and announced together or not at all, and a round of polls costs one commit (a `held`
        poll: its row alone, its run queues its posts behind those it holds). The posts name the poll
        (`poll_id`) and are given its snapshot when read (`_messages`): a snapshot is stored once, not three
        times."""
        if not polls:
            return
        outbox_rows = []
        with self.tx() as db:
            for p in polls:
                poll_id = self._insert_id(db, "INSERT INTO polls (run, attempt, at, kind, snapshot)"
                                          " VALUES (?, ?, ?, ?, ?)",
                                          (p.run, p.attempt, p.at, p.kind, json.dumps(p.snapshot.to_dict())))
                if p.held:
                    continue
                for message_kind, head in (("poll", p.payload), ("header", {**p.payload, "attempt": p.attempt})):
                    outbox_rows.append((p.run, message_kind, json.dumps({**head, "poll_id": poll_id}), p.thread_of,
                                        p.at, p.at, self.host))
            self._insert_many(db, "INSERT INTO outbox (run, kind, payload, thread_of, next_try_at, created_at, host)"
                              " VALUES (?, ?, ?, ?, ?, ?, ?)", outbox_rows)
        self._wake_delivery()

    def add_incident(self, run: str, attempt: int | None, at: float, kind: str, detail: dict[str, Any]) -> int:
        with self.tx() as db:
            return self._insert_id(db, "INSERT INTO incidents (run, attempt, at, kind, detail)"
                                   " VALUES (?, ?, ?, ?, ?)", (run, attempt, at, kind, json.dumps(detail)))

    def polls(self, run: str, limit: int = 50) -> list[Poll]:
        rows = self._query("SELECT * FROM polls WHERE run=? ORDER BY id DESC LIMIT ?", (run, limit))
        return [self._poll(r) for r in rows]

    def _poll(self, r: Any) -> Poll:
        """A polls row as a Poll; the one read before when it is the same row (a poll is never changed once
        written), so a page refreshed every few seconds parses each run's latest snapshot once, not at every
        refresh (1,000 runs: ~80 ms a refresh otherwise; bench/README.md §8)."""
        known = self._polls_read.get(r["id"])
        if known is not None and known.stored == r["snapshot"] and known.run == r["run"]:
            return known
        if len(self._polls_read) >= POLLS_REMEMBERED:
            self._polls_read.clear()
        poll = self._polls_read[r["id"]] = Poll(r["id"], r["run"], r["at"], r["kind"], r["attempt"], r["snapshot"])
        return poll

    def incidents(self, run: str | None = None, limit: int = 50) -> list[Row]:
        sql, args = "SELECT * FROM incidents ORDER BY id DESC LIMIT ?", (limit,)
        if run is not None:
            sql, args = "SELECT * FROM incidents WHERE run=? ORDER BY id DESC LIMIT ?", (run, limit)
        rows = self._query(sql, args)
        return [Row(r["id"], r["run"], r["at"], r["kind"], json.loads(r["detail"]), r["attempt"]) for r in rows]

    def latest_polls(self) -> dict[str, Poll]:
        rows = self._query("SELECT * FROM polls WHERE id IN (SELECT MAX(id) FROM polls GROUP BY run)")
        return {r["run"]: self._poll(r) for r in rows}

    def latest_incidents(self) -> dict[str, Row]:
        rows = self._query("SELECT * FROM incidents WHERE id IN (SELECT MAX(id) FROM incidents GROUP BY run)")
        return {r["run"]: Row(r["id"], r["run"], r["at"], r["kind"], json.loads(r["detail"]), r["attempt"])
                for r in rows}

    def incident_counts(self) -> dict[str, dict[str, int]]:
        """run -> incident kind -> how many were recorded."""
        out: dict[str, dict[str, int]] = {}
        for r in self._query("SELECT run, kind, COUNT(*) AS n FROM incidents GROUP BY run, kind"):
            out.setdefault(r["run"], {})[r["kind"]] = r["n"]
        return out
