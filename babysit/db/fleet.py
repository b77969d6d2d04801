"""A box's place in the fleet (docs/fleet.md): its lease, the lookout for boxes whose lease lapsed, and
the LISTEN that wakes it for requests addressed to it. All on one connection of its own, one thread.

- The lease: one row a box in `hosts`, renewed by ONE UPDATE every `lease_s / 3` (never one write a
  run: a heartbeat storm is what Optuna's heartbeats made of a busy study). Times are the database's
  clock, so boxes whose clocks disagree still agree on who lapsed.
- The lookout, on every renewal: one UPDATE marks every other box whose lease ran out `lost` and, in
  the same transaction, queues one alert for each (an outbox row with a dedupe key, sent by this box):
  when two boxes look at once, the row lock lets one mark it and the other finds nothing to mark.
- LISTEN `babysit_control`: a NOTIFY naming this host wakes the daemon at once; polling (the guard
  round) stays the fallback. A connection that drops delivers no notifications and says nothing
  (psycopg/psycopg2#1679), so every renewal also proves the connection, and after a reconnection the
  daemon is woken to look at everything once (what was notified meanwhile is lost).
- The gateway lease (`gateway`: a box started with `--bot`): `hosts.gateway_until` of one box at a time,
  taken or renewed at each renewal under a transaction-scoped advisory lock (so two boxes looking at a
  lapsed gateway at once cannot both take it). Only its holder opens Socket Mode: Slack then has one
  connection to deliver each command to. A holder that could not renew for a whole lease (cut off from
  the database) gives it up on its own clock, before any other box may take it on the database's.
- Every statement and transaction here answers within the store's deadline (babysit.db.deadline): a
  server that froze mid-renewal loses this connection as a restart does (reconnected with backoff), the
  gateway check runs on, and a daemon stopping on a frozen server marks nothing and still stops.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

import psycopg
import structlog

from babysit.core.status import SHOWN_OUT_OF_SIGHT
from babysit.db.deadline import bounded, check_client
from babysit.db.pgconnection import CONNECT_TIMEOUT_S, DEADLINE_S
from babysit.db.postgres import CONTROL_CHANNEL

log = structlog.get_logger("babysit.fleet")

LEASE_S = 30.0  # a box silent this long is lost (alerted within LEASE_S + LEASE_S / 3)
GATEWAY_LOCK = 0x62616279_67617465  # pg_advisory_xact_lock key of the gateway claim ("baby" "gate")
NOW = "extract(epoch from clock_timestamp())"
RECONNECT_MAX_S = 5.0  # the longest pause between two reconnection tries, before its jitter
RECONNECT_JITTER = 1.5  # each pause is drawn up to this many times its length
CLOSE_WAIT_S = 10.0  # how long close() waits for the lease's thread before leaving the stop to it


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("babysit")
    except PackageNotFoundError:
        return "dev"


class FleetMember:
    """Start it after the daemon's store is open; `close()` at shutdown marks the box stopped (its
    runs are then shown `host-down`, not alerted as lost: someone stopped it on purpose)."""

    def __init__(self, url: str, host: str, *, on_wake: Callable[[], None], on_alert: Callable[[], None],
                 lease_s: float = LEASE_S, pid: int | None = None,
                 on_gateway: Callable[[bool], None] | None = None,
                 report: Callable[[], Mapping[str, Any]] | None = None, deadline_s: float = DEADLINE_S) -> None:
        self.url = url
        self.host = host
        self.on_wake = on_wake  # a request may be waiting (a NOTIFY for this host, or a reconnection)
        self.on_alert = on_alert  # this member queued a message (lost / back): wake the delivery thread
        self.lease_s = lease_s
        self.renew_s = lease_s / 3
        self.pid = pid if pid is not None else os.getpid()
        self._conn: psycopg.Connection[Any] | None = None
        self._stop = threading.Event()
        self._finish_lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self.connected = threading.Event()
        self.queries = 0  # every statement this member sent (the idle-load bench reads it)
        self.lost_seen: list[str] = []  # boxes this member marked lost (tests, logs)
        self._judge_after = 0.0  # monotonic time from which this member may mark other boxes lost
        self.on_gateway = on_gateway  # a box with --bot: told when it takes (True) or loses (False) the gateway
        self.gateway = False  # whether this box holds the gateway lease now
        self._gateway_until = 0.0  # monotonic: the end of the gateway lease as this box last renewed it
        self.report = report  # what this box publishes in hosts.info at each renewal (its GPU reading)
        self.deadline_s = deadline_s  # how long a statement (or transaction) here may wait for the database

    # -- lifecycle ----------------------------------------------------------------------------------------
    def start(self, *, connect: bool = True) -> None:
        """Take the lease now (raising if the database cannot be reached), then keep it on a thread; with
        `connect` False (a daemon started while the database is down) the thread takes it once it can."""
        if connect:
            self._connect()
        self._thread = threading.Thread(target=self._loop, name="fleet", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """The box marked stopped and the connection closed, by the lease's thread as it ends (or here, when
        none runs). A thread still held by the database after CLOSE_WAIT_S (a statement waiting its deadline,
        a connection being made) is left to finish: it marks the stop and closes the connection it holds
        when it returns, and takes no gateway and no new lease meanwhile (before, a connection it made after
        this returned stayed open, its lease renewed as if the box were up)."""
        self._stop.set()
        self._set_gateway(False)
        thread = self._thread
        if thread is None:
            self._finish()
            return
        thread.join(timeout=CLOSE_WAIT_S)
        if thread.is_alive():
            log.warning("the fleet lease's thread is waiting for the database; it marks this box stopped "
                        "when it returns", host=self.host)
        else:
            self._finish()  # done by the thread as it ended; here too should it have died of a bug

    def _finish(self) -> None:
        """Once, by the thread that last holds the connection: the box's lease ended as a stop (the gateway,
        if held, free for another box at once), the connection closed."""
        with self._finish_lock:
            conn, self._conn = self._conn, None
        if conn is not None and not conn.closed:
            with contextlib.suppress(psycopg.Error), bounded(conn, self.deadline_s):
                conn.execute(f"UPDATE hosts SET lease_until = {NOW}, gateway_until = NULL, info = %s"
                             " WHERE name = %s AND pid = %s", (json.dumps({"stopped": True}), self.host, self.pid))
            conn.close()
        self._set_gateway(False)

    # -- the connection -------------------------------------------------------------------------------------
    def _connect(self) -> None:
        conn = psycopg.connect(self.url, autocommit=True, connect_timeout=CONNECT_TIMEOUT_S,
                               application_name=f"babysit-fleet:{self.host}")
        try:
            check_client(conn, self.deadline_s)
            with bounded(conn, self.deadline_s):  # the transaction as a whole
                was_lost = self._register(conn)
            with bounded(conn, self.deadline_s):
                conn.execute(f"LISTEN {CONTROL_CHANNEL}")
        except BaseException:
            conn.close()
            raise
        self.queries += 2
        with self._finish_lock:
            self._conn = conn
        if self._stop.is_set():  # close() came while this connected: the stop is this thread's to mark
            return
        self.connected.set()
        # cut off until now, this box has seen no one's renewals: it judges none before a whole lease
        # connected plus the longest pause another box cut off with it may still be in before it
        # reconnects (the end of a database outage must not make the boxes declare each other lost)
        self._judge_after = time.monotonic() + self.lease_s + RECONNECT_MAX_S * RECONNECT_JITTER
        if was_lost:
            log.warning("this box had been marked lost; it re-adopts its runs", host=self.host)
            self.on_alert()
        if self.on_gateway is not None:
            self._claim_gateway(conn)

    def _register(self, conn: psycopg.Connection[Any]) -> bool:
        """Take (or retake) the lease; True when the other boxes had marked this one lost, in which case
        one 'back' message is queued with it."""
        with conn.transaction():
            row = conn.execute("SELECT lost_at FROM hosts WHERE name = %s FOR UPDATE", (self.host,)).fetchone()
            conn.execute(
                f"INSERT INTO hosts (name, started_at, renewed_at, lease_until, pid, version, lost_at, info)"
                f" VALUES (%s, {NOW}, {NOW}, {NOW} + %s, %s, %s, NULL, %s)"
                f" ON CONFLICT (name) DO UPDATE SET started_at = EXCLUDED.started_at, renewed_at = EXCLUDED.renewed_at,"
                f" lease_until = EXCLUDED.lease_until, pid = EXCLUDED.pid, version = EXCLUDED.version,"
                f" lost_at = NULL, info = EXCLUDED.info",
                (self.host, self.lease_s, self.pid, _version(), self._info()))
            was_lost = bool(row and row[0] is not None)
            if was_lost:
                runs = _live_runs(conn, self.host)  # what it re-adopts: not its runs that were over
                text = (f"✅ box {self.host} is back: its daemon re-adopted its runs"
                        + (f" ({', '.join(runs)})" if runs else ""))
                _queue_alert(conn, self.host, text, f"host-back:{self.host}:{row[0]}")
        self.queries += 3
        return was_lost

    # -- the loop ---------------------------------------------------------------------------------------
    def _loop(self) -> None:
        try:
            self._keep()
        finally:
            if self._stop.is_set():
                self._finish()

    def _keep(self) -> None:
        next_renew = time.monotonic() + self.renew_s
        pause = 0.5
        while not self._stop.is_set():
            if self.gateway and time.monotonic() > self._gateway_until:
                log.warning("gateway lease not renewed for a whole lease; closing the bot's connection",
                            host=self.host)
                self._set_gateway(False)  # before another box may take it (the database's clock)
            try:
                if self._conn is None or self._conn.closed or self._conn.broken:
                    self.connected.clear()
                    self._connect()
                    if self._stop.is_set():
                        return
                    pause = 0.5
                    self.on_wake()  # reconnected: whatever was notified meanwhile is lost; look at all once
                    next_renew = time.monotonic() + self.renew_s
                wait = max(0.0, next_renew - time.monotonic())
                for note in self._conn.notifies(timeout=min(wait, 1.0), stop_after=1):
                    if note.payload in (self.host, ""):
                        self.on_wake()
                if time.monotonic() >= next_renew:
                    self._renew_and_look_out()
                    next_renew = time.monotonic() + self.renew_s
            except psycopg.Error as exc:
                self.connected.clear()
                log.warning("fleet connection lost; retrying", host=self.host, error=str(exc)[:200])
                with self._finish_lock:
                    lost, self._conn = self._conn, None
                with contextlib.suppress(psycopg.Error):
                    if lost is not None:
                        lost.close()
                # jittered: after a failover every box must not reconnect in the same instant
                if self._stop.wait(pause * random.uniform(1.0, RECONNECT_JITTER)):
                    return
                pause = min(pause * 2, RECONNECT_MAX_S)

    def _renew_and_look_out(self) -> None:
        """ONE statement at rest: this box's renewal and, once it may judge, the others' lapses marked (the
        row lock makes one box the one that marks a lapse); a lost box's alert is queued after it."""
        conn = self._conn
        assert conn is not None
        judge = time.monotonic() >= self._judge_after
        info = self._info() if self.report is not None else None
        with bounded(conn, self.deadline_s):
            row = conn.execute(
                f"WITH renewed AS (UPDATE hosts SET renewed_at = {NOW}, lease_until = {NOW} + %s,"
                " info = COALESCE(%s, info) WHERE name = %s AND pid = %s RETURNING 1),"
                f" lost AS (UPDATE hosts SET lost_at = {NOW} WHERE %s AND lease_until < {NOW} AND lost_at IS NULL"
                " AND name <> %s AND info NOT LIKE '%%\"stopped\": true%%'"
                " RETURNING name, lost_at - renewed_at AS silent, started_at)"
                " SELECT (SELECT count(*) FROM renewed),"
                " (SELECT json_agg(json_build_array(name, silent, started_at)) FROM lost)",
                (self.lease_s, info, self.host, self.pid, judge, self.host)).fetchone()
        self.queries += 1
        renewed, lost = row[0], row[1] or []
        for name, silent, started_at in lost:  # silent: on the database's clock, as the lapse was judged
            with bounded(conn, self.deadline_s):
                runs = _live_runs(conn, name)
            text = (f"🚨 box {name} lost: no lease renewal for {silent:.0f} s"
                    + (f"; its run{'s' if len(runs) > 1 else ''} {', '.join(runs)} show{'' if len(runs) > 1 else 's'}"
                       " host-lost until it comes back" if runs else ""))
            with bounded(conn, self.deadline_s):
                _queue_alert(conn, self.host, text, f"host-lost:{name}:{started_at}")
            self.lost_seen.append(name)
            self.queries += 2
            log.error("box lost", box=name, silent_s=round(silent), runs=runs)
        if lost:
            self.on_alert()
        if self.on_gateway is not None and renewed:
            self._claim_gateway(conn)
        if not renewed:  # another daemon took this host's name (same BABYSIT_HOST on two boxes)
            log.error("another process holds this host's lease; two daemons share a host name?", host=self.host)


    def _claim_gateway(self, conn: psycopg.Connection[Any]) -> None:
        """Take or renew the gateway lease unless another box holds it unexpired. The advisory lock makes
        the claims of two boxes one after the other; each UPDATE's snapshot, taken after the lock, sees
        the claim committed before it."""
        asked = time.monotonic()
        with bounded(conn, self.deadline_s), conn.transaction():  # the transaction as a whole
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (GATEWAY_LOCK,))
            row = conn.execute(
                f"UPDATE hosts SET gateway_until = {NOW} + %s WHERE name = %s AND pid = %s AND NOT EXISTS"
                f" (SELECT 1 FROM hosts o WHERE o.name <> %s AND o.gateway_until > {NOW}) RETURNING 1",
                (self.lease_s, self.host, self.pid, self.host)).fetchone()
        self.queries += 4  # BEGIN, the lock, the UPDATE, COMMIT
        if row is not None:
            self._gateway_until = asked + self.lease_s
        self._set_gateway(row is not None)

    def _info(self) -> str:
        """hosts.info as this box publishes it now: its report (never `stopped`, which only close() says).
        A report that cannot be made is published as its error: the lease never waits for it."""
        if self.report is None:
            return "{}"
        try:
            body = dict(self.report())
        except Exception as exc:  # a probe's bug must not cost the box its lease
            log.exception("the box's report for the fleet failed", host=self.host)
            body = {"report_error": f"{type(exc).__name__}: {exc}"[:300]}
        body.pop("stopped", None)
        return json.dumps(body)

    def _set_gateway(self, held: bool) -> None:
        if held == self.gateway or (held and self._stop.is_set()):  # a box stopping takes up no gateway
            return
        self.gateway = held
        log.warning("gateway lease " + ("taken: this box opens the bot's connection" if held else
                                        "lost: this box closes the bot's connection; another box's bot answers"),
                    host=self.host)
        if self.on_gateway is not None:
            self.on_gateway(held)


def _live_runs(conn: psycopg.Connection[Any], host: str) -> list[str]:
    """The box's runs that are not over: those `status` shows host-lost while it is away (one query)."""
    return [r[0] for r in conn.execute(
        "SELECT r.run FROM runs r LEFT JOIN run_state s ON s.run = r.run WHERE r.host = %s"
        " AND COALESCE(s.status, 'pending') = ANY(%s) ORDER BY r.run", (host, list(SHOWN_OUT_OF_SIGHT)))]


def _queue_alert(conn: psycopg.Connection[Any], sender: str, text: str, key: str) -> None:
    """One message of the fleet (no run): sent by `sender`; the key makes a second notice of it a no-op."""
    conn.execute(f"INSERT INTO outbox (run, kind, payload, dedupe_key, next_try_at, created_at, host)"
                 f" VALUES ('', 'text', %s, %s, {NOW}, {NOW}, %s) ON CONFLICT DO NOTHING",
                 (json.dumps({"run": "", "text": text}), key, sender))
