"""`status` (the CLI's and the gateway's `/babysit status`) of a run whose box is lost or was stopped: its
step is the last one its daemon stored, shown as such, and no ETA or GPU utilization is made up from a
pace nobody has measured since (before: 'host-lost … ETA 10m to step 1000, GPU 97%', the same ten minutes
for as long as the box stayed lost). A real PostgreSQL; box-b's rows as its daemon left them."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from babysit.core.snapshot import Snapshot
from babysit.view import runview
from babysit.view.runtable import cells


def _box_b(pg_url: str, *, lost: bool) -> Any:
    from babysit.db.postgres import PostgresStore

    store = PostgresStore(pg_url, host="box-b")
    now = store.now()
    with store.tx() as db:  # its lease row as its daemon left it: renewed 2 minutes ago
        db.execute("INSERT INTO hosts (name, started_at, renewed_at, lease_until, pid, info, lost_at)"
                   " VALUES ('box-b', ?, ?, ?, 1, ?, ?)",
                   (now - 3600, now - 120, now - 90, '{"stopped": true}' if not lost else "{}",
                    now - 60 if lost else None))
    store.claim_run("rb", now - 3600)
    attempt = store.begin_attempt("rb", 1, "default", ["python", "train.py", "--steps", "1000"], "local", 1,
                                  "/srv/box-b/rb", now - 3600)
    store.mark_running(attempt.id, started_at=now - 3600, pid=4242)
    store.set_run_state("rb", "running", now - 120, step=400, last_record_at=now - 121)
    store.add_poll("rb", 1, now - 300, "scheduled", Snapshot.from_dict({"step": 380, "seconds_per_step": 1.0,
                                                                        "gpus": [{"index": 0, "util_pct": 97.0}]}))
    return store


@pytest.mark.parametrize("lost", [True, False], ids=["lost", "stopped"])
def test_a_run_of_a_box_out_of_sight_shows_its_last_step_and_no_eta(tmp_path: Path, pg_url: str,
                                                                     lost: bool) -> None:
    (tmp_path / "babysit.toml").write_text(f'[store]\nurl = "{pg_url}"\n[host]\nname = "box-a"\n')
    box_b = _box_b(pg_url, lost=lost)
    reader = runview.Reader(tmp_path / "babysit.toml")
    try:
        for logs in (True, False):  # `babysit status` on box-a, and the gateway's answer (no log read)
            (row,) = reader.rows(logs=logs)
            c = cells(row, time.time())
            assert row.status == ("host-lost" if lost else "host-down"), row
            assert c["STEP"] == "400/1000" and c["ETA"] == "—" and c["GPU"] == "—", c  # before: 10m, 97%
            assert "last stored" in (row.note or "") and "on box box-b" in (row.note or ""), row.note
    finally:
        reader.close()
        box_b.close()


def test_a_run_of_a_box_that_is_up_keeps_its_eta(tmp_path: Path, pg_url: str) -> None:
    (tmp_path / "babysit.toml").write_text(f'[store]\nurl = "{pg_url}"\n[host]\nname = "box-a"\n')
    box_b = _box_b(pg_url, lost=False)
    with box_b.tx() as db:
        db.execute("UPDATE hosts SET info = '{}', renewed_at = ? WHERE name = 'box-b'", (box_b.now(),))
    reader = runview.Reader(tmp_path / "babysit.toml")
    try:
        (row,) = reader.rows(logs=False)
        c = cells(row, time.time())
        assert row.status == "running" and c["ETA"] == "10m00s to step 1000" and c["GPU"] == "97%", c
        assert row.note == "on box box-b", row.note
    finally:
        reader.close()
        box_b.close()
