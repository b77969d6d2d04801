"""The statement deadline on a healthy PostgreSQL (babysit/db/deadline.py): it bounds each statement, not a
transaction or a connection's life, so a long transaction of quick statements is never cut; it shuts the
one connection whose statement is stuck (here a real lock wait: a live server's stuck statement), not its
neighbours, and the server then ends the abandoned backend at once; and what may legitimately run long
(`babysit db copy`) has none. The frozen server itself is
tests/fleet/test_frozen_db.py's."""

from __future__ import annotations

import shutil
import threading
import time
from pathlib import Path

import psycopg
import pytest

from babysit.db.deadline import WATCHDOG, DeadlineExpired, bounded
from babysit.db.postgres import PgConnection
from tests.fleet.helpers import babysit
from tests.support import wait_for

ROOT = Path(__file__).resolve().parents[2]
V2 = ROOT / "tests" / "fixtures" / "store" / "state_v2.db"  # a box's history, as tests/test_store_schema.py copies it


def _pid(conn: PgConnection) -> int:
    return int(conn.execute("SELECT pg_backend_pid()").fetchone()[0])


def test_a_transaction_longer_than_the_deadline_made_of_quick_statements_is_never_cut(pg_url: str) -> None:
    conn = PgConnection(pg_url, deadline=1.0)
    fired = WATCHDOG.fired
    try:
        backend = _pid(conn)
        started = time.monotonic()
        conn.execute("BEGIN")
        for _ in range(4):
            conn.execute("SELECT pg_sleep(0.4)")  # 0.4 s each: 1.6 s in all, past the 1-s deadline
        conn.execute("COMMIT")
        assert time.monotonic() - started >= 1.6
        time.sleep(1.2)  # past every deadline armed above: each was disarmed when its statement answered
        assert _pid(conn) == backend and not conn.lost and not conn.stalled
        assert WATCHDOG.fired == fired
    finally:
        conn.close()


def test_a_deadline_that_fires_as_its_statement_answers_fails_that_statement_not_the_next(pg_url: str) -> None:
    """The race between an answer and the watchdog, held open: the statement answered, then its deadline
    passed before `bounded` heard of it. The socket is shut all the same, so `bounded` says so there (before:
    it returned as if nothing had happened, and the next statement failed as a lost connection)."""
    conn = psycopg.connect(pg_url, autocommit=True)
    fired = WATCHDOG.fired
    try:
        with pytest.raises(DeadlineExpired, match=r"did not answer within 0\.3 s"), bounded(conn, 0.3):
            assert conn.execute("SELECT 1").fetchone() == (1,)  # answered at once
            wait_for("the deadline to fire", lambda: WATCHDOG.fired > fired, timeout=5)  # then it passes
        with pytest.raises(psycopg.OperationalError):
            conn.execute("SELECT 1")  # shut indeed
    finally:
        conn.close()


def test_the_deadline_shuts_the_stuck_statement_s_connection_alone_and_the_next_call_reconnects(
        pg_url: str) -> None:
    holder = psycopg.connect(pg_url, autocommit=True)
    stuck = PgConnection(pg_url, deadline=1.0)
    busy = PgConnection(pg_url, deadline=1.0)
    try:
        stuck_pid, busy_pid = _pid(stuck), _pid(busy)
        holder.execute("BEGIN")
        holder.execute("LOCK TABLE runs IN ACCESS EXCLUSIVE MODE")
        raised: list[BaseException] = []

        def wait_on_the_lock() -> None:
            try:
                stuck.execute("SELECT count(*) FROM runs")
            except BaseException as exc:  # the test looks at it
                raised.append(exc)

        waiter = threading.Thread(target=wait_on_the_lock)
        started = time.monotonic()
        waiter.start()
        while waiter.is_alive():  # the neighbour's statements answer on, each within its own deadline
            busy.execute("SELECT 1")
            time.sleep(0.01)
        waiter.join()
        assert time.monotonic() - started < 10
        assert len(raised) == 1 and isinstance(raised[0], DeadlineExpired)
        assert "did not answer within 1 s" in str(raised[0]) and "[store] deadline_seconds" in str(raised[0])
        assert stuck.lost and stuck.stalled
        assert _pid(busy) == busy_pid and not busy.lost
        # the server ends the abandoned backend (client_connection_check_interval), the lock still held: it
        # does not wait on it, holding its transaction's locks, until the holder lets go
        with psycopg.connect(pg_url, autocommit=True) as watcher:
            wait_for("the abandoned backend gone", lambda: not watcher.execute(
                "SELECT 1 FROM pg_stat_activity WHERE pid = %s", (stuck_pid,)).fetchone(), timeout=30)
        assert holder.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS
        holder.execute("COMMIT")
        assert stuck.execute("SELECT count(*) FROM runs").fetchone()[0] == 0  # a new connection
        assert _pid(stuck) != stuck_pid and not stuck.stalled
    finally:
        holder.close()
        stuck.close()
        busy.close()


def test_babysit_db_copy_waits_out_a_slow_destination_whatever_the_deadline(
        pg_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The copy is one long transaction: it has no statement deadline, [store] deadline_seconds or not."""
    for name in ("BABYSIT_STORE_URL", "BABYSIT_HOST"):
        monkeypatch.delenv(name, raising=False)
    (tmp_path / ".babysit").mkdir()
    shutil.copy(V2, tmp_path / ".babysit" / "state.db")
    (tmp_path / "babysit.toml").write_text(
        '[store]\ndeadline_seconds = 0.5\n[[runs]]\nname = "r1"\nspec = "r1.toml"\n'
        'registered_at = "2026-08-17T18:41:02Z"\n')
    holder = psycopg.connect(pg_url, autocommit=True)
    try:
        holder.execute("BEGIN")
        holder.execute("LOCK TABLE attempts IN ACCESS EXCLUSIVE MODE")  # the copy's first table, held 2 s
        threading.Timer(2.0, lambda: holder.execute("COMMIT")).start()
        out = babysit(tmp_path, "db", "copy", "--to", pg_url, "--host", "box-a")  # waits 2 s for the lock
        assert out.returncode == 0, out.stderr
        assert "every table compared equal" in out.stdout
    finally:
        wait_for("the lock released", lambda: holder.info.transaction_status == psycopg.pq.TransactionStatus.IDLE)
        holder.close()
