"""The outbox: every message to a channel (Slack, the terminal) is a row committed before it is sent, sent
in order per run by the delivery worker, retried until it goes or fails for good."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from babysit.db.rows import OutboxMessage, OutboxSummary
from babysit.db.sqlbase import SqlBase


class OutboxTable(SqlBase):
    """The outbox table: messages queued, due, sent, retried, failed."""

    def enqueue(self, run: str, kind: str, payload: dict[str, Any], now: float, *, thread_of: int | None = None,
                dedupe_key: str | None = None) -> int:
        """Queue a message; the same `dedupe_key` twice (a restarted daemon redoing a step) queues it once."""
        with self.tx() as db:
            if dedupe_key is not None:
                row = db.execute("SELECT id FROM outbox WHERE dedupe_key=?", (dedupe_key,)).fetchone()
                if row:
                    return row[0]
            new_id = self._insert_id(
                db, "INSERT INTO outbox (run, kind, payload, thread_of, dedupe_key, next_try_at, created_at, host)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (run, kind, json.dumps(payload), thread_of, dedupe_key, now, now, self.host))
        self._wake_delivery()
        return new_id


    def due_messages(self, now: float, limit: int = 100) -> list[OutboxMessage]:
        """The oldest pending message of each run, if due: a run's messages go out strictly in order. In a
        fleet, this box's messages only (each is sent by the box that wrote it: once)."""
        rows = self._query(
            "SELECT * FROM outbox WHERE id IN (SELECT MIN(id) FROM outbox WHERE status='pending'"
            " AND COALESCE(host, '') = ? GROUP BY run) AND next_try_at <= ? ORDER BY id LIMIT ?",
            (self.host or "", now, limit))
        return self._messages(rows)

    def message(self, message_id: int) -> OutboxMessage:
        return self._messages(self._query("SELECT * FROM outbox WHERE id=?", (message_id,)))[0]

    def messages(self, run: str | None = None) -> list[OutboxMessage]:
        if run is None:
            return self._messages(self._query("SELECT * FROM outbox ORDER BY id"))
        return self._messages(self._query("SELECT * FROM outbox WHERE run=? ORDER BY id", (run,)))

    def last_message(self, kind: str, runs: Sequence[str]) -> OutboxMessage | None:
        """The newest message of `kind` posted for any of `runs` (a campaign's last post), else None."""
        if not runs:
            return None
        rows = self._query(f"SELECT * FROM outbox WHERE kind=? AND run IN ({','.join('?' * len(runs))})"
                           " ORDER BY id DESC LIMIT 1", (kind, *runs))
        return self._messages(rows)[0] if rows else None

    def _messages(self, rows: list[Any]) -> list[OutboxMessage]:
        """Messages as the channels render them: a poll's post and header (which name the poll since
        `record_polls`; older rows carry the snapshot itself) get the poll's snapshot."""
        out = [_message(r) for r in rows]
        wanted = sorted({m.payload["poll_id"] for m in out if "poll_id" in m.payload})
        snapshots: dict[int, Any] = {}
        for i in range(0, len(wanted), 500):  # SQLite's bound-parameter limit
            chunk = wanted[i:i + 500]
            snapshots.update((r["id"], json.loads(r["snapshot"])) for r in self._query(
                f"SELECT id, snapshot FROM polls WHERE id IN ({','.join('?' * len(chunk))})", tuple(chunk)))
        return [replace(m, payload={**m.payload, "snapshot": snapshots[m.payload["poll_id"]]})
                if "poll_id" in m.payload else m for m in out]

    def mark_sent(self, message_id: int, remote_ref: str | None, now: float) -> None:
        with self.tx() as db:
            db.execute("UPDATE outbox SET status='sent', sent_at=?, remote_ref=?, tries=tries+1, error=NULL"
                       " WHERE id=?", (now, remote_ref, message_id))

    def mark_retry(self, message_id: int, error: str, next_try_at: float) -> None:
        with self.tx() as db:
            db.execute("UPDATE outbox SET tries=tries+1, error=?, next_try_at=? WHERE id=?",
                       (error[:500], next_try_at, message_id))

    def mark_failed(self, message_id: int, error: str, now: float) -> None:
        with self.tx() as db:
            db.execute("UPDATE outbox SET status='failed', tries=tries+1, error=?, sent_at=? WHERE id=?",
                       (error[:500], now, message_id))

    def next_due_at(self) -> float | None:
        """When the next message may go: the earliest next_try_at among each run's queue head (a message
        behind its run's head waits for the head, whatever its own next_try_at). None: nothing pending."""
        return self._query(
            "SELECT MIN(next_try_at) AS t FROM outbox WHERE id IN"
            " (SELECT MIN(id) FROM outbox WHERE status='pending' AND COALESCE(host, '') = ? GROUP BY run)",
            (self.host or "",))[0]["t"]

    def has_message(self, dedupe_key: str) -> bool:
        return bool(self._query("SELECT 1 FROM outbox WHERE dedupe_key=?", (dedupe_key,)))

    def pending_count(self) -> int:
        """Messages this box has still to send."""
        return self._query("SELECT COUNT(*) AS n FROM outbox WHERE status='pending' AND COALESCE(host, '') = ?",
                           (self.host or "",))[0]["n"]

    def outbox_summary(self) -> OutboxSummary:
        """Messages by status, the oldest pending one's creation time, the newest delivery error, and the
        posts the runs hold that the outbox refused."""
        counts = {r["status"]: r["n"] for r in self._query("SELECT status, COUNT(*) AS n FROM outbox GROUP BY status")}
        oldest = self._query("SELECT MIN(created_at) AS t FROM outbox WHERE status='pending'")[0]["t"]
        last = self._query("SELECT id, run, error FROM outbox WHERE error IS NOT NULL ORDER BY id DESC LIMIT 1")
        held = self._query("SELECT COUNT(*) AS n FROM held_posts")[0]["n"]
        return OutboxSummary(counts, oldest, last[0]["error"] if last else None, last[0]["run"] if last else None,
                             held)


def _message(r: Any) -> OutboxMessage:
    return OutboxMessage(
        id=r["id"], run=r["run"], kind=r["kind"], payload=json.loads(r["payload"]), thread_of=r["thread_of"],
        status=r["status"], tries=r["tries"], next_try_at=r["next_try_at"], created_at=r["created_at"],
        sent_at=r["sent_at"], remote_ref=r["remote_ref"], error=r["error"])
