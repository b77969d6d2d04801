"""A PostgreSQL that took the connection and then froze mid-query (its postmaster and every backend
SIGSTOPped: the kernel still ACKs, so libpq's keepalives and tcp_user_timeout never fire) holds babysit no
longer than a statement's deadline (babysit/db/deadline.py, docs/fleet.md "The database frozen"): a reader
(`babysit status`, the live view, the web page) then answers from the box's mirror; the daemon's store goes
down as on a lost connection, journals, keeps guarding its runs, and replays once after SIGCONT, nothing
lost or doubled (a COMMIT the frozen server took and carried out on thawing included); the fleet lease's
stop returns. Before the deadline each of these waited as long as the server stayed frozen.

Bounds: the tests' deadlines are the defaults or 1.5 s; each call is given BOUND_S, far above them, so a
loaded 2-core box does not fail them, and a call that waits for the server still fails."""

from __future__ import annotations

import json
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from babysit.db.deadline import WATCHDOG
from babysit.db.postgres import PostgresStore
from tests.fleet.helpers import PY, babysit, box_env, fleet_box
from tests.support import run_toml, wait_for

BANNER = "the database cannot be reached"
DEADLINE_S = 1.5  # the daemon's, in these tests (its default is 15 s)
BOUND_S = 12.0  # a call still waiting after this was held by the frozen server


@pytest.fixture(scope="module", params=["socket", "tcp"])
def postgres(request: pytest.FixtureRequest, postgres: Any) -> Any:
    """Every test here twice: on the server's Unix socket, and over TCP at 127.0.0.1, as a fleet's boxes
    reach their database (the frozen server's kernel ACKs on both; the deadline shuts either socket)."""
    return postgres if request.param == "socket" else request.getfixturevalue("postgres_tcp")


def _within(call: Callable[[], Any], seconds: float = BOUND_S) -> tuple[Any, float]:
    """`call()`'s result (or exception) and how long it took, on a thread of its own so that a call the
    frozen server holds fails the test instead of hanging it (the fixture's SIGCONT then frees it)."""
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
    took = time.monotonic() - started
    assert not thread.is_alive(), f"still waiting for the frozen server after {seconds:g} s"
    if isinstance(out[0], BaseException):
        raise out[0]
    return out[0], took


@pytest.fixture
def box(tmp_path: Path, pg_url: str, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A box of the fleet with one run, r1, and its mirror (made as `babysit up` makes it)."""
    for name in ("BABYSIT_STORE_URL", "BABYSIT_HOST"):
        monkeypatch.delenv(name, raising=False)
    root = fleet_box(tmp_path, pg_url)
    daemon = PostgresStore(pg_url, host="box-a", state_dir=root / ".babysit")
    daemon.claim_run("r1", 1.0)
    daemon.start_journal()
    daemon.set_run_state("r1", "running", time.time(), step=7)
    daemon.close()
    other = PostgresStore(pg_url, host="box-b")  # another box's run: in the shared view only
    other.claim_run("rb", 1.0)
    other.set_run_state("rb", "running", time.time(), step=3)
    other.close()
    return root


@pytest.fixture
def daemon_store(pg_url: str, tmp_path: Path) -> Iterator[PostgresStore]:
    store = PostgresStore(pg_url, host="box-a", state_dir=tmp_path, deadline_s=DEADLINE_S)
    store.claim_run("r1", 1.0)
    store.start_journal()
    try:
        yield store
    finally:
        store.close()


def _counts(url: str) -> dict[str, int]:
    with psycopg.connect(url, autocommit=True) as conn:
        return {t: conn.execute(f"SELECT COUNT(*) FROM {t} WHERE run = 'r1'").fetchone()[0]
                for t in ("attempts", "incidents", "outbox", "verdicts")}


# -- the daemon ---------------------------------------------------------------------------------------------
def test_the_daemon_s_write_on_a_frozen_postgres_goes_down_within_its_deadline_and_is_replayed_once(
        daemon_store: PostgresStore, pg_url: str, frozen: Any) -> None:
    store = daemon_store
    attempt = store.begin_attempt("r1", 1, "base", ["python"], "local", 1, "a1", 1.0)
    store.mark_running(attempt.id, started_at=2.0, pid=123)
    launch = store.enqueue("r1", "text", {"text": "launched"}, 2.0)

    frozen.freeze()
    fired = WATCHDOG.fired
    _within(lambda: store.mark_ended(attempt.id, ended_at=3.0, outcome="crashed", exit_code=1))
    assert store.down, "an unanswered statement must switch the store to its mirror, as a lost connection does"
    assert WATCHDOG.fired == fired + 1  # one statement waited its deadline: not tried again on a new connection
    # down: nothing waits for the frozen server any more
    (second, incident, verdict), _ = _within(lambda: (
        store.begin_attempt("r1", 2, "base", ["python"], "local", 1, "a2", 4.0),
        store.add_incident("r1", 2, 4.0, "while-frozen", {}),
        store.save_verdict("r1", {"status": "CONFIRMED"}, 5.0, final=True)))
    assert WATCHDOG.fired == fired + 1
    assert [(a.n, a.status) for a in store.attempts("r1")] == [(1, "ended"), (2, "launching")]
    assert store.journal_pending() >= 4

    frozen.thaw()
    wait_for("the journal replayed", lambda: not store.down and store.journal_pending() == 0, timeout=30)
    other = PostgresStore(pg_url, host="box-b")
    try:
        assert [(a.id, a.n, a.status, a.outcome) for a in other.attempts("r1")] == [
            (attempt.id, 1, "ended", "crashed"), (second.id, 2, "launching", None)]
        assert [i.id for i in other.incidents("r1")] == [incident]
        assert other.final_verdict("r1").id == verdict
        assert [m.id for m in other.messages("r1")] == [launch]
    finally:
        other.close()
    assert _counts(pg_url) == {"attempts": 2, "incidents": 1, "outbox": 1, "verdicts": 1}


def test_a_rollback_the_frozen_server_never_answers_takes_the_daemon_s_store_down_at_once(
        daemon_store: PostgresStore, pg_url: str, frozen: Any) -> None:
    """A transaction the daemon gives up (its own error) on a server that froze mid-way: the ROLLBACK waits
    its deadline and the store goes down then, so the next write journals at once instead of reconnecting
    to the frozen server (before: the deadline was swallowed with the ROLLBACK, and the next write waited
    two connection timeouts before going down)."""
    store = daemon_store
    fired = WATCHDOG.fired

    def given_up() -> None:
        with pytest.raises(RuntimeError, match="the caller's own"), store.tx() as db:
            db.execute("UPDATE runs SET host = host WHERE run = 'r1'")
            frozen.freeze()
            raise RuntimeError("the caller's own error")

    _within(given_up)
    assert store.down and WATCHDOG.fired == fired + 1
    _, took = _within(lambda: store.add_incident("r1", 1, 4.0, "while-frozen", {}))
    assert took < 1.0, f"the next write waited {took:.1f} s for the frozen server"
    assert store.journal_pending() == 1 and WATCHDOG.fired == fired + 1
    frozen.thaw()
    wait_for("the journal replayed", lambda: not store.down and store.journal_pending() == 0, timeout=30)
    assert _counts(pg_url)["incidents"] == 1


def test_a_commit_the_frozen_server_took_is_journaled_and_carried_out_once_when_it_thaws(
        daemon_store: PostgresStore, pg_url: str, frozen: Any) -> None:
    """The transaction's statements reached PostgreSQL, then it froze with the COMMIT in its socket: the
    daemon cannot know whether it committed, so it journals it; on SIGCONT the server reads the COMMIT and
    commits, and the replay (each INSERT `ON CONFLICT DO NOTHING`, ids kept) adds nothing twice."""
    store = daemon_store
    attempt = store.begin_attempt("r1", 1, "base", ["python"], "local", 1, "a1", 1.0)

    def batch() -> tuple[int, int]:
        with store.batch():
            posted = store.enqueue("r1", "text", {"text": "ended"}, 2.0, dedupe_key="r1:ended")
            seen = store.add_incident("r1", 1, 2.0, "crashed", {"exit": 1})
            store.mark_ended(attempt.id, ended_at=2.0, outcome="crashed", exit_code=1)
            frozen.freeze()  # every statement answered; the COMMIT at the batch's end is not
        return posted, seen

    (posted, seen), _ = _within(batch)
    assert store.down and store.journal_pending() == 1
    frozen.thaw()
    wait_for("the journal replayed", lambda: not store.down and store.journal_pending() == 0, timeout=30)
    assert _counts(pg_url) == {"attempts": 1, "incidents": 1, "outbox": 1, "verdicts": 0}
    other = PostgresStore(pg_url, host="box-b")
    try:
        assert [m.id for m in other.messages("r1")] == [posted]
        assert [i.id for i in other.incidents("r1")] == [seen]
        assert other.attempt("r1", 1).outcome == "crashed"
    finally:
        other.close()


def test_the_daemon_s_guard_rounds_go_on_while_postgres_is_frozen(
        tmp_path: Path, pg_url: str, frozen: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The daemon itself, in process ([store] deadline_seconds from its babysit.toml): a guard round on the
    frozen server returns within the deadline, the next sees a run's end and records it on the mirror, and
    the database has it once the server thaws."""
    from babysit.channels.notify import ConsoleChannel
    from babysit.probes.gpu import FileGpuProbe
    from babysit.service.daemon import Daemon
    from tests.fakes import FakeClock, FakeExecutor, FakeHostProbe, ManualTimers

    for name in ("BABYSIT_STORE_URL", "BABYSIT_HOST"):
        monkeypatch.delenv(name, raising=False)
    (tmp_path / "gpus.json").write_text(json.dumps({"gpus": [{"index": 0, "util_pct": 90, "processes": []}]}))
    lines = [f'[store]\nurl = "{pg_url}"\ndeadline_seconds = {DEADLINE_S}\n[host]\nname = "box-a"\n[daemon]',
             'state_dir = ".babysit"', ""]
    for run in ("a", "b"):
        (tmp_path / f"{run}.toml").write_text(run_toml(run, ["train"], log=f"{run}.jsonl", gpus=[0],
                                                       guards={"min_free_host_ram_gib": 1}))
        lines += ["[[runs]]", f'name = "{run}"', f'spec = "{run}.toml"', 'registered_at = "2026-01-01T00:00:00Z"', ""]
    (tmp_path / "babysit.toml").write_text("\n".join(lines))
    clock = FakeClock()
    host = FakeHostProbe()
    executor = FakeExecutor(clock, host)
    d = Daemon(tmp_path / "babysit.toml", gpu_probe=FileGpuProbe(tmp_path / "gpus.json"),
               channel=ConsoleChannel(tmp_path / ".babysit", None), clock=clock, host_probe=host,
               executors={"local": executor}, timers=ManualTimers(clock))
    try:
        d.store.start_journal()  # what `babysit up` does
        d.reconcile_registry()
        d.handle_requests()
        assert {d.store.run_state(run)[0] for run in ("a", "b")} == {"running"}

        frozen.freeze()
        clock.advance(60)
        fired = WATCHDOG.fired
        _within(d.guards)
        assert d.store.down and WATCHDOG.fired == fired + 1
        executor.end("a", 1, exit_code=0)
        _within(d.guards)  # the next round: on the mirror, nothing waits
        assert WATCHDOG.fired == fired + 1
        assert d.store.run_state("a")[0] == "finished" and d.store.run_state("b")[0] == "running"

        frozen.thaw()
        wait_for("the journal replayed", lambda: not d.store.down and d.store.journal_pending() == 0, timeout=30)
        other = PostgresStore(pg_url, host="box-b")
        try:
            assert other.run_state("a")[0] == "finished"
            assert [(a.n, a.status, a.exit_code) for a in other.attempts("a")] == [(1, "ended", 0)]
        finally:
            other.close()
    finally:
        frozen.thaw()
        d.exits.close()
        d.store.close()


def test_the_fleet_lease_s_stop_on_a_frozen_postgres_returns(pg_url: str, frozen: Any) -> None:
    """A daemon stopping (Ctrl-C) marks its box down on the lease connection: on a frozen server, the
    renewal in flight and that mark each give up at the deadline, and the daemon stops."""
    from babysit.db.fleet import FleetMember

    member = FleetMember(pg_url, "box-a", on_wake=lambda: None, on_alert=lambda: None, lease_s=1.5,
                         deadline_s=DEADLINE_S)
    member.start()
    frozen.freeze()
    time.sleep(1.0)  # a renewal (every 0.5 s) now waits for the frozen server
    _, took = _within(member.close)
    assert took < BOUND_S


def test_a_lease_thread_still_connecting_when_the_daemon_stops_marks_the_stop_itself_and_takes_no_gateway(
        pg_url: str, frozen: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The daemon stops while its lease's thread is still held by a frozen server (here: connecting to it).
    close() returns without it; when the server answers again, the thread connects and then marks the box
    stopped, takes no gateway, and closes its connection (before: that connection stayed open with the box's
    lease renewed as if it were up, and the gateway could be taken after the stop)."""
    from babysit.db import fleet

    monkeypatch.setattr(fleet, "CLOSE_WAIT_S", 0.5)
    told: list[bool] = []
    frozen.freeze()
    member = fleet.FleetMember(pg_url, "box-a", on_wake=lambda: None, on_alert=lambda: None, lease_s=1.5,
                               deadline_s=DEADLINE_S, on_gateway=told.append)
    member.start(connect=False)  # a daemon started while the database is down: the thread connects
    time.sleep(0.5)  # it is in psycopg.connect, waiting for the frozen server's answer
    _, took = _within(member.close)
    assert took < 2.0 and member._thread is not None and member._thread.is_alive()
    frozen.thaw()
    wait_for("the lease's thread to end", lambda: not member._thread.is_alive(), timeout=BOUND_S)
    with psycopg.connect(pg_url, autocommit=True) as conn:
        row = conn.execute("SELECT info, lease_until <= extract(epoch from clock_timestamp()), gateway_until"
                           " FROM hosts WHERE name = 'box-a'").fetchone()
        left = conn.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name = 'babysit-fleet:box-a'"
                            ).fetchone()[0]
    assert row is not None and json.loads(row[0]) == {"stopped": True} and row[1] and row[2] is None, row
    assert left == 0 and told == [] and not member.gateway


# -- readers -------------------------------------------------------------------------------------------------
def test_a_long_lived_reader_on_a_frozen_postgres_answers_from_the_mirror_and_comes_back(
        box: Path, frozen: Any) -> None:
    """`status --watch`, the live view and the bot keep one reader's connection across looks."""
    from babysit.view.runview import Reader

    reader = Reader(box / "babysit.toml")
    try:
        assert [r.run for r in reader.rows()] == ["r1", "rb"] and reader.banner() is None
        frozen.freeze()
        fired = WATCHDOG.fired
        rows, _ = _within(reader.rows)
        assert [(r.run, r.status) for r in rows] == [("r1", "running")]  # this box's runs, from its mirror
        assert BANNER in (reader.banner() or "") and "did not answer within 3 s" in (reader.banner() or "")
        assert WATCHDOG.fired == fired + 1
        _, took = _within(reader.fleet_boxes)  # the same look: no second wait on the frozen server
        assert took < 2.0  # a connection tried would wait out its 2-s connect timeout
        frozen.thaw()
        assert [r.run for r in reader.rows()] == ["r1", "rb"] and reader.banner() is None
    finally:
        reader.close()


def test_the_web_page_on_a_frozen_postgres_serves_the_mirror_and_the_fleet_once_it_thaws(
        box: Path, frozen: Any) -> None:
    from babysit.web.server import Settings, WebServer
    from tests.web.conftest import fetch

    def page() -> str:
        status, _, body = fetch(web.url)
        assert status == 200, body
        return body.decode()

    web = WebServer(box / "babysit.toml", Settings(port=0, workers=2)).start()
    try:
        shared = page()
        assert 'data-run="rb"' in shared and BANNER not in shared
        frozen.freeze()
        shown, took = _within(page)  # the page's open connection took the statement; the server froze
        assert BANNER in shown and 'data-run="r1"' in shown and 'data-run="rb"' not in shown
        assert took < BOUND_S
        _, took = _within(page)
        assert took < 2.0  # the outage remembered: the mirror at once (a connect would take 2 s, a statement 3)
        frozen.thaw()
        wait_for("the shared view again", lambda: 'data-run="rb"' in page(), timeout=30)
    finally:
        frozen.thaw()
        web.stop()


def test_babysit_status_on_a_postgres_frozen_before_it_connects(box: Path, frozen: Any) -> None:
    frozen.freeze()
    shown, took = _within(lambda: babysit(box, "status", timeout=60))
    frozen.thaw()
    assert shown.returncode == 0, shown.stderr
    banner, *rest = shown.stdout.splitlines()
    assert BANNER in banner and "connection timeout expired" in banner
    assert any(line.split()[:2] == ["r1", "running"] for line in rest), shown.stdout
    assert took < BOUND_S  # one connect timeout (2 s), not one for each of the look's reads


def test_babysit_status_whose_statement_the_server_took_before_it_froze(
        box: Path, pg_url: str, frozen: Any) -> None:
    """`status` connected and its first statement in the server's hands, then the server freezes. The
    statement is held at a known point first (a lock another session holds on the schema's version table),
    then every process of the server is SIGSTOPped."""
    holder = psycopg.connect(pg_url, autocommit=True)
    watcher = psycopg.connect(pg_url, autocommit=True)
    proc = None
    try:
        holder.execute("BEGIN")
        holder.execute("LOCK TABLE babysit_schema_version IN ACCESS EXCLUSIVE MODE")
        proc = subprocess.Popen([PY, "-m", "babysit", "status", "--registry", str(box / "babysit.toml")], cwd=box,
                                env=box_env(box), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        wait_for("status's statement held in the server", lambda: watcher.execute(
            "SELECT 1 FROM pg_stat_activity WHERE application_name = 'babysit:box-a' AND wait_event_type = 'Lock'"
        ).fetchone(), timeout=30)
        frozen.freeze()
        started = time.monotonic()
        try:
            out, err = proc.communicate(timeout=BOUND_S)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"`babysit status` still waiting for the frozen server after {BOUND_S:g} s") from None
        took = time.monotonic() - started
        assert proc.returncode == 0, err
        banner, *rest = out.splitlines()
        assert BANNER in banner and "did not answer within 3 s" in banner, out
        assert any(line.split()[:2] == ["r1", "running"] for line in rest), out
        assert took < BOUND_S
    finally:
        frozen.thaw()
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.communicate()
        holder.close()
        watcher.close()


def test_a_command_on_a_frozen_postgres_fails_within_its_deadline_saying_what_to_do(
        pg_url: str, frozen: Any) -> None:
    """A command's store (`babysit abort`, `amend`, the bot's per-command store) has no mirror: the
    statement's error, naming the server and the setting, after `[store] deadline_seconds`."""
    from babysit.core.errors import StateError

    store = PostgresStore(pg_url, host="cli", deadline_s=DEADLINE_S)
    try:
        frozen.freeze()
        with pytest.raises(StateError) as raised:
            _within(lambda: store.request("r1", "abort", "U1", 1.0))
        assert "did not answer within 1.5 s" in raised.value.message
        assert "[store] deadline_seconds" in raised.value.message
        assert "check the PostgreSQL server" in (raised.value.hint or "")
    finally:
        frozen.thaw()
        store.close()


def test_a_healthy_postgres_under_the_same_deadlines_answers_as_before(box: Path, pg_url: str) -> None:
    """Nothing frozen: the daemon's store, a reader and `status` with the tests' deadlines read and write
    on PostgreSQL, never the mirror."""
    from babysit.view.runview import Reader

    store = PostgresStore(pg_url, host="box-a", state_dir=box / ".babysit", deadline_s=DEADLINE_S)
    store.start_journal()
    reader = Reader(box / "babysit.toml")
    try:
        for n in range(1, 4):
            store.begin_attempt("r1", n, "base", ["python"], "local", 1, f"a{n}", float(n))
        assert not store.down and store.journal_pending() == 0
        assert [r.run for r in reader.rows()] == ["r1", "rb"] and reader.banner() is None
        shown = babysit(box, "status")
        assert shown.returncode == 0 and BANNER not in shown.stdout and "rb" in shown.stdout
    finally:
        reader.close()
        store.close()
