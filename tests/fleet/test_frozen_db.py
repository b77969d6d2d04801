"""A PostgreSQL that took the connection and then froze mid-query (its postmaster and every backend
SIGSTOPped: the kernel still ACKs, so libpq's keepalives and tcp_user_timeout never fire) must not hold
babysit. Before a client-side deadline, each of these waited for as long as the server stayed frozen."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from babysit.db.postgres import PostgresStore
from tests.fleet.helpers import outage_spec

HANG = pytest.mark.xfail(strict=True, reason="no client-side deadline: the call waits for the frozen server")
BOUND_S = 20.0  # far above any deadline babysit sets: a call still waiting then is held by the server


def _within(seconds: float, call: Callable[[], Any]) -> tuple[bool, Any, float]:
    """`call()` on a thread of its own: (returned within `seconds`, its result or exception, seconds taken)."""
    out: list[Any] = []

    def run() -> None:
        try:
            out.append(call())
        except BaseException as exc:  # the test looks at it
            out.append(exc)

    started = time.monotonic()
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    return not thread.is_alive(), (out[0] if out else None), time.monotonic() - started


def _box(tmp_path: Path, pg_url: str, monkeypatch: pytest.MonkeyPatch) -> Path:
    for name in ("BABYSIT_STORE_URL", "BABYSIT_HOST"):
        monkeypatch.delenv(name, raising=False)
    box = tmp_path / "box-a"
    box.mkdir()
    outage_spec(box, "r1", ["python", "train.py"])
    (box / "babysit.toml").write_text(
        f'[store]\nurl = "{pg_url}"\n[host]\nname = "box-a"\n\n[[runs]]\nname = "r1"\nspec = "r1.toml"\n'
        'registered_at = "2026-01-01T00:00:00Z"\n')
    return box


@HANG
def test_the_daemon_s_store_call_on_a_frozen_postgres(pg_url: str, tmp_path: Path, frozen: Any) -> None:
    store = PostgresStore(pg_url, host="box-a", state_dir=tmp_path)
    store.claim_run("r1", 1.0)
    store.start_journal()
    try:
        attempt = store.begin_attempt("r1", 1, "base", ["python"], "local", 1, "a1", 1.0)
        frozen.freeze()
        done, _, _ = _within(BOUND_S, lambda: store.mark_ended(attempt.id, ended_at=2.0, outcome="completed",
                                                                exit_code=0))
        assert done, "the daemon's write waited for the frozen server"
    finally:
        frozen.thaw()
        store.close()


@HANG
def test_a_long_lived_reader_on_a_frozen_postgres(pg_url: str, tmp_path: Path, frozen: Any,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """`status --watch`, the live view, the web page's threads and the bot keep one reader's connection."""
    from babysit.view.runview import Reader

    box = _box(tmp_path, pg_url, monkeypatch)
    daemon = PostgresStore(pg_url, host="box-a", state_dir=box / ".babysit")
    daemon.claim_run("r1", 1.0)
    daemon.start_journal()  # the box's mirror
    daemon.close()
    reader = Reader(box / "babysit.toml")
    try:
        assert [r.run for r in reader.rows()] == ["r1"]
        frozen.freeze()
        done, _, _ = _within(BOUND_S, reader.rows)
        assert done, "the reader waited for the frozen server"
    finally:
        frozen.thaw()
        reader.close()


@HANG
def test_the_fleet_lease_s_close_on_a_frozen_postgres(pg_url: str, frozen: Any) -> None:
    """A daemon stopping (Ctrl-C) marks its box down on the lease connection."""
    from babysit.db.fleet import FleetMember

    member = FleetMember(pg_url, "box-a", on_wake=lambda: None, on_alert=lambda: None, lease_s=3.0)
    member.start()
    try:
        frozen.freeze()
        done, _, _ = _within(BOUND_S, member.close)
        assert done, "the daemon's stop waited for the frozen server"
    finally:
        frozen.thaw()


def _with_mirror(box: Path, pg_url: str) -> None:
    daemon = PostgresStore(pg_url, host="box-a", state_dir=box / ".babysit")
    daemon.claim_run("r1", 1.0)
    daemon.start_journal()  # what `babysit up` makes with the database up: the box's mirror
    daemon.set_run_state("r1", "running", time.time(), step=7)
    daemon.close()


def test_babysit_status_on_a_postgres_frozen_before_it_connects(pg_url: str, tmp_path: Path, frozen: Any,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.fleet.helpers import babysit

    box = _box(tmp_path, pg_url, monkeypatch)
    _with_mirror(box, pg_url)
    frozen.freeze()
    try:
        started = time.monotonic()
        shown = babysit(box, "status", timeout=BOUND_S)
        took = time.monotonic() - started
    finally:
        frozen.thaw()
    assert shown.returncode == 0, shown.stderr
    assert "the database cannot be reached" in shown.stdout, shown.stdout
    print(f"status took {took:.1f} s")


@HANG
def test_babysit_status_on_a_postgres_that_freezes_mid_query(pg_url: str, tmp_path: Path, frozen: Any,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """`status` connected, its first statement in the server's hands, then the server freezes: its
    statement waits on a lock another session holds (a point the test can find it at), then SIGSTOP."""
    import subprocess

    import psycopg

    from tests.fleet.helpers import PY, box_env, wait_for

    box = _box(tmp_path, pg_url, monkeypatch)
    _with_mirror(box, pg_url)
    holder = psycopg.connect(pg_url, autocommit=True)
    watcher = psycopg.connect(pg_url, autocommit=True)
    proc = None
    try:
        holder.execute("BEGIN")
        holder.execute("LOCK TABLE babysit_schema_version IN ACCESS EXCLUSIVE MODE")
        proc = subprocess.Popen([PY, "-m", "babysit", "status", "--registry", str(box / "babysit.toml")], cwd=box,
                                env=box_env(box), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        wait_for("status's statement waiting in the server", lambda: watcher.execute(
            "SELECT 1 FROM pg_stat_activity WHERE application_name LIKE 'babysit%' AND wait_event_type = 'Lock'"
        ).fetchone(), timeout=30)
        frozen.freeze()
        try:
            out, err = proc.communicate(timeout=BOUND_S)
        except subprocess.TimeoutExpired:
            raise AssertionError("`babysit status` waited for the frozen server") from None
        assert proc.returncode == 0, err
        assert "the database cannot be reached" in out
    finally:
        frozen.thaw()
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()
        holder.close()
        watcher.close()
