"""A campaign's tables (docs/campaigns.md): the campaigns registered, the runs each added with their frozen
delta and grid, its event history, and the owner calls put to its owners with every click on them."""

from __future__ import annotations

import json
from typing import Any

from babysit.db.rows import OwnerCall, Row
from babysit.db.sqlbase import SqlBase


class CampaignTables(SqlBase):
    """campaigns, campaign_runs, campaign_events, owner_calls and owner_call_clicks."""

    def save_campaign(self, name: str, file: str, sha256: str, now: float) -> None:
        """Record a campaign (its file and the hash of what it declared); the first registration time stays."""
        with self.tx() as db:
            db.execute("INSERT INTO campaigns (name, file, sha256, registered_at) VALUES (?, ?, ?, ?)"
                       " ON CONFLICT (name) DO UPDATE SET file=excluded.file, sha256=excluded.sha256",
                       (name, file, sha256, now))

    def campaign(self, name: str) -> dict[str, Any] | None:
        rows = self._query("SELECT * FROM campaigns WHERE name=?", (name,))
        return dict(rows[0]) if rows else None

    def campaigns(self) -> list[dict[str, Any]]:
        return [dict(r) for r in self._query("SELECT * FROM campaigns ORDER BY registered_at, name")]

    def add_campaign_run(self, run: str, campaign: str, spec: str, parent: str | None, suspect: str | None,
                         delta: dict[str, Any], grid: str, grid_sha256: str, now: float) -> dict[str, Any]:
        """A run joins a campaign with its delta and its grid, frozen: a second call returns the first record."""
        with self.tx() as db:
            db.execute("INSERT INTO campaign_runs VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
                       (run, campaign, spec, parent, suspect, json.dumps(delta), grid, grid_sha256, now))
        found = self.campaign_run(run)
        assert found is not None
        return found

    def campaign_run(self, run: str) -> dict[str, Any] | None:
        rows = self._query("SELECT * FROM campaign_runs WHERE run=?", (run,))
        return _campaign_run(rows[0]) if rows else None

    def campaign_runs(self, campaign: str) -> list[dict[str, Any]]:
        return [_campaign_run(r) for r in
                self._query("SELECT * FROM campaign_runs WHERE campaign=? ORDER BY added_at, run", (campaign,))]

    def add_campaign_event(self, campaign: str, run: str | None, kind: str, body: dict[str, Any], now: float,
                           dedupe_key: str | None = None) -> int:
        """Append to a campaign's history; the same `dedupe_key` twice (a redone step) appends once."""
        with self.tx() as db:
            if dedupe_key is not None:
                row = db.execute("SELECT id FROM campaign_events WHERE dedupe_key=?", (dedupe_key,)).fetchone()
                if row:
                    return row[0]
            return self._insert_id(db, "INSERT INTO campaign_events (campaign, run, at, kind, body, dedupe_key)"
                                   " VALUES (?, ?, ?, ?, ?, ?)",
                              (campaign, run, now, kind, json.dumps(body), dedupe_key))

    def campaign_events(self, campaign: str, kind: str | None = None) -> list[Row]:
        sql, args = "SELECT * FROM campaign_events WHERE campaign=? ORDER BY id", (campaign,)
        if kind is not None:
            sql, args = "SELECT * FROM campaign_events WHERE campaign=? AND kind=? ORDER BY id", (campaign, kind)
        return [Row(r["id"], r["run"] or "", r["at"], r["kind"], json.loads(r["body"])) for r in self._query(sql, args)]

    def has_campaign_event(self, dedupe_key: str) -> bool:
        return bool(self._query("SELECT 1 FROM campaign_events WHERE dedupe_key=?", (dedupe_key,)))

    def open_owner_call(self, campaign: str, run: str, question: str, options: tuple[str, ...],
                        body: dict[str, Any], now: float, dedupe_key: str) -> OwnerCall:
        """Record an owner call before it is posted; the same key twice returns the first."""
        with self.tx() as db:
            self._insert_row(db, "INSERT INTO owner_calls (campaign, run, question, options, body, created_at,"
                             " dedupe_key) VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
                             (campaign, run, question, json.dumps(list(options)), json.dumps(body), now, dedupe_key))
        return _owner_call(self._query("SELECT * FROM owner_calls WHERE dedupe_key=?", (dedupe_key,))[0])

    def owner_call(self, call_id: int) -> OwnerCall | None:
        rows = self._query("SELECT * FROM owner_calls WHERE id=?", (call_id,))
        return _owner_call(rows[0]) if rows else None

    def owner_calls(self, campaign: str) -> list[OwnerCall]:
        return [_owner_call(r) for r in self._query("SELECT * FROM owner_calls WHERE campaign=? ORDER BY id",
                                                    (campaign,))]

    def decide_owner_call(self, call_id: int, decision: str, by: str, now: float) -> bool:
        """The first decision wins, atomically: False when the call was already decided (or is unknown)."""
        with self.tx() as db:
            return db.execute("UPDATE owner_calls SET decision=?, decided_by=?, decided_at=? WHERE id=?"
                              " AND decision IS NULL", (decision, by, now, call_id)).rowcount == 1

    def set_owner_call_result(self, call_id: int, result: str) -> None:
        with self.tx() as db:
            db.execute("UPDATE owner_calls SET result=? WHERE id=?", (result[:500], call_id))

    def add_click(self, call_id: int | None, user: str | None, action: str | None, outcome: str, reason: str,
                  now: float) -> int:
        """Every owner-call click, accepted or refused (forged, replayed, not allowed, already decided)."""
        with self.tx() as db:
            return self._insert_id(db, "INSERT INTO owner_call_clicks (call_id, at, \"user\", action, outcome, reason)"
                                   " VALUES (?, ?, ?, ?, ?, ?)",
                              (call_id, now, (user or "")[:64] or None, (action or "")[:64] or None, outcome,
                               reason[:300]))

    def clicks(self, call_id: int | None = None) -> list[dict[str, Any]]:
        if call_id is None:
            return [dict(r) for r in self._query("SELECT * FROM owner_call_clicks ORDER BY id")]
        return [dict(r) for r in self._query("SELECT * FROM owner_call_clicks WHERE call_id=? ORDER BY id",
                                             (call_id,))]


def _campaign_run(r: Any) -> dict[str, Any]:
    return {**dict(r), "delta": json.loads(r["delta"])}


def _owner_call(r: Any) -> OwnerCall:
    return OwnerCall(id=r["id"], campaign=r["campaign"], run=r["run"], question=r["question"],
                     options=tuple(json.loads(r["options"])), body=json.loads(r["body"]), created_at=r["created_at"],
                     decision=r["decision"], decided_by=r["decided_by"], decided_at=r["decided_at"], result=r["result"])
