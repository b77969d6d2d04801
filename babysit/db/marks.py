"""What a restarted daemon must find so that it neither does a thing twice nor loses one: a control
request's owed answer (carried out, its answer refused by the store) and its begun mark (carried out
maybe, not answered: babysit/service/control.py), and a run's posts the outbox refused, held in order
(babysit/run/run_posts.py). One row a request or a post, each written by itself: a mark is never
written over another."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from babysit.db.sqlbase import SqlBase


class RunMarks(SqlBase):
    """The owed_answers, started_requests and held_posts tables."""

    def owed_answers(self, run: str) -> dict[int, str]:
        """The run's requests carried out whose answer is still to write: request id -> answer."""
        return {int(r[0]): r[1] for r in self._query(
            "SELECT request_id, answer FROM owed_answers WHERE run=? ORDER BY request_id", (run,))}

    def started_requests(self, run: str) -> dict[int, str]:
        """The run's requests begun and not yet answered: request id -> action."""
        return {int(r[0]): r[1] for r in self._query(
            "SELECT request_id, action FROM started_requests WHERE run=? ORDER BY request_id", (run,))}

    def mark_request_started(self, run: str, request_id: int, action: str) -> None:
        with self.tx() as db:
            db.execute("INSERT INTO started_requests (run, request_id, action) VALUES (?, ?, ?)"
                       " ON CONFLICT (run, request_id) DO UPDATE SET action=excluded.action", (run, request_id, action))

    def save_owed_answer(self, run: str, request_id: int, answer: str) -> None:
        with self.tx() as db:
            db.execute("INSERT INTO owed_answers (run, request_id, answer) VALUES (?, ?, ?)"
                       " ON CONFLICT (run, request_id) DO UPDATE SET answer=excluded.answer", (run, request_id, answer))

    def forget_request(self, run: str, request_id: int) -> None:
        """The request is answered: neither owed nor begun any longer."""
        with self.tx() as db:
            db.execute("DELETE FROM owed_answers WHERE run=? AND request_id=?", (run, request_id))
            db.execute("DELETE FROM started_requests WHERE run=? AND request_id=?", (run, request_id))

    def held_posts(self, run: str) -> list[dict[str, Any]]:
        """The run's posts the outbox refused, oldest first: {kind, payload, key, thread_of, thread_key}."""
        return [{"kind": r["kind"], "payload": json.loads(r["payload"]), "key": r["dedupe_key"],
                 "thread_of": r["thread_of"], "thread_key": r["thread_key"]}
                for r in self._query("SELECT * FROM held_posts WHERE run=? ORDER BY n", (run,))]

    def hold_posts(self, run: str, held: Sequence[dict[str, Any]]) -> None:
        """The run's held posts are now `held`, in that order (none: the outbox took them all)."""
        with self.tx() as db:
            db.execute("DELETE FROM held_posts WHERE run=?", (run,))
            if held:
                db.executemany("INSERT INTO held_posts (run, n, kind, dedupe_key, payload, thread_of, thread_key)"
                               " VALUES (?, ?, ?, ?, ?, ?, ?)",
                               [(run, n, h["kind"], h.get("key"), json.dumps(h["payload"]), h.get("thread_of"),
                                 h.get("thread_key")) for n, h in enumerate(held)])
