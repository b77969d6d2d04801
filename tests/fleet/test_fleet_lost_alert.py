"""The `🚨 box … lost` alert (docs/fleet.md): it names only the runs `status` then shows `host-lost` (not the
box's finished runs), and its silence is measured on the database's clock, as the lapse itself is judged,
so a box whose clock is an hour off still says how long the lost box was silent. A real PostgreSQL; box-b's
rows as its daemon left them, box-a's lease (a real FleetMember) on the lookout. The `✅ box … is back`
message names what the box re-adopts: its runs still going, not the finished ones."""

from __future__ import annotations

import re
import time
from typing import Any

import pytest

from tests.support import wait_for


def _box_b_left(pg_url: str) -> None:
    """box-b's lease lapsed 10 s ago on the database's clock (renewed 40 s ago, a 30 s lease), three runs."""
    from babysit.db.postgres import PostgresStore

    store = PostgresStore(pg_url, host="box-b")
    try:
        now = store.now()
        with store.tx() as db:
            db.execute("INSERT INTO hosts (name, started_at, renewed_at, lease_until, pid, info)"
                       " VALUES ('box-b', ?, ?, ?, 1, '{}')", (now - 3600, now - 40, now - 10))
        for run, status in (("done-b", "finished"), ("live-b", "running"), ("stopped-b", "stopped")):
            store.claim_run(run, now - 3600)
            store.set_run_state(run, status, now - 60)
        store.claim_run("new-b", now - 5)  # registered, no state yet: pending, shown host-lost too
    finally:
        store.close()


def test_the_lost_alert_names_only_live_runs_and_its_silence_on_the_database_s_clock(
        pg_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from babysit.db.fleet import FleetMember
    from babysit.db.postgres import PostgresStore

    _box_b_left(pg_url)
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() + 3600.0)  # box-a's clock runs an hour ahead
    member = FleetMember(pg_url, "box-a", on_wake=lambda: None, on_alert=lambda: None, lease_s=1.5)
    member._judge_after = 0.0  # box-a may judge at its first renewal (no outage behind it)
    member.start()
    back: Any = None
    reader: Any = None
    try:
        wait_for("box-b marked lost", lambda: member.lost_seen == ["box-b"], timeout=30)
        monkeypatch.setattr(time, "time", real)
        back = FleetMember(pg_url, "box-b", on_wake=lambda: None, on_alert=lambda: None, lease_s=1.5, pid=2)
        back.start()  # box-b's daemon starts again: it takes its lease back and says so
        reader = PostgresStore(pg_url, host="box-c")
        (alert,) = [m.payload["text"] for m in reader.messages("") if "box box-b lost" in m.payload.get("text", "")]
        (again,) = [m.payload["text"] for m in reader.messages("") if "box box-b is back" in m.payload.get("text", "")]
    finally:
        for m in (back, member):
            if m is not None:
                m.close()
        if reader is not None:
            reader.close()
    # what it re-adopts, not its finished runs (before: done-b and stopped-b too)
    assert again == "✅ box box-b is back: its daemon re-adopted its runs (live-b, new-b)", again
    # before: "its runs done-b, live-b, new-b, stopped-b show host-lost" (finished ones too)
    assert alert.endswith("; its runs live-b, new-b show host-lost until it comes back"), alert
    silent = int(re.search(r"no lease renewal for (\d+) s", alert).group(1))  # before: 3640 (box-a's clock)
    assert 40 <= silent < 100, alert
