"""A client-side deadline on what babysit sends PostgreSQL (docs/fleet.md, "The database frozen").

A server that took the connection and then stopped answering (its processes stopped, a stuck backend, hung
storage) still has its kernel ACKing TCP: libpq's keepalives and `tcp_user_timeout` never fire, a server-side
`statement_timeout` cannot (the server is what is stuck), and a psycopg 3 sync call waits for ever. psycopg
bounds the connection (`connect_timeout`) and a cancel (`cancel_safe(timeout=)`), not a statement, and a
cancel needs the stuck server to answer it.

So a statement runs `bounded`: one watchdog thread a process, and at the statement's deadline it shuts the
connection's socket down (shutdown(2), not close: libpq still owns the descriptor). The blocked call then
fails as on a lost connection (psycopg's OperationalError, the connection broken) and each caller's existing
path for a lost connection takes over: a reader reads the box's mirror, the daemon journals. The error is
`DeadlineExpired`, so a caller can tell it from a restart (no point connecting again at once).

Per statement, not per connection: a long transaction of quick statements is never cut, and arming costs a
lock and a dict entry (the watchdog wakes only at a deadline, never on a tick).

A server that is alive (a statement waiting on a lock) would keep the abandoned backend, and its transaction's
locks, until the statement ends: `check_client` asks PostgreSQL 14+ to notice the shut socket within a second.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import os
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import psycopg


class DeadlineExpired(psycopg.OperationalError):
    """PostgreSQL did not answer within the deadline; its connection was shut (and is now broken)."""


def expired_message(seconds: float, setting: str) -> str:
    return f"PostgreSQL did not answer within {seconds:g} s, so babysit shut the connection ({setting} sets this wait)"


class Watchdog:
    """Shuts the socket of each armed connection whose deadline passed. One a process (`WATCHDOG`)."""

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._armed: dict[int, tuple[float, Any]] = {}  # token -> (monotonic deadline, psycopg connection)
        self._tokens = itertools.count()
        self._wake = math.inf  # when the thread wakes next (inf: nothing armed)
        self._thread: threading.Thread | None = None
        self.fired = 0  # connections shut so far (tests, logs)

    def arm(self, conn: Any, seconds: float) -> int:
        at = time.monotonic() + seconds
        token = next(self._tokens)
        with self._cond:
            self._armed[token] = (at, conn)
            if self._thread is None or not self._thread.is_alive():  # a forked child has no thread
                self._thread = threading.Thread(target=self._run, name="pg-deadline", daemon=True)
                self._thread.start()
            if at < self._wake:
                self._wake = at
                self._cond.notify()
        return token

    def disarm(self, token: int) -> bool:
        """False when the deadline fired first (the connection was shut)."""
        with self._cond:
            return self._armed.pop(token, None) is not None

    def _run(self) -> None:
        with self._cond:
            while True:
                now = time.monotonic()
                for token, (at, conn) in list(self._armed.items()):
                    if at <= now:
                        del self._armed[token]  # under the lock: its statement cannot have returned and closed it
                        _shut(conn)
                        self.fired += 1
                self._wake = min((at for at, _ in self._armed.values()), default=math.inf)
                self._cond.wait(None if self._wake == math.inf else self._wake - now)


def _shut(conn: Any) -> None:
    """shutdown(2) of the connection's socket: libpq's next read finds it closed and fails the call."""
    with contextlib.suppress(psycopg.Error, OSError):
        sock = socket.socket(fileno=os.dup(conn.pgconn.socket))
        try:
            sock.shutdown(socket.SHUT_RDWR)
        finally:
            sock.close()


WATCHDOG = Watchdog()
CLIENT_CHECK_MS = 1000  # PostgreSQL 14+: how soon a backend notices, mid-statement, that babysit went away


def check_client(conn: Any, seconds: float | None, setting: str = "[store] deadline_seconds") -> None:
    """On a new connection: PostgreSQL 14+ ends its backend within CLIENT_CHECK_MS once babysit shut the
    socket mid-statement (client_connection_check_interval), so a statement abandoned at its deadline on a
    live server (a lock wait) stops holding its transaction's locks then, not when it would have ended."""
    if conn.info.server_version >= 140000:
        with bounded(conn, seconds, setting):
            conn.execute(f"SET client_connection_check_interval = {CLIENT_CHECK_MS}")


@contextlib.contextmanager
def bounded(conn: Any, seconds: float | None, setting: str = "[store] deadline_seconds") -> Iterator[None]:
    """What runs inside on `conn` (a psycopg connection) answers within `seconds`, else fails with
    DeadlineExpired, the connection shut — also when its last statement answered just as the deadline shut
    the socket (what it did may have been done: as for a COMMIT the frozen server took, the journal's replay
    changes nothing). None: no bound (a migration, `babysit db copy`)."""
    if seconds is None:
        yield
        return
    token = WATCHDOG.arm(conn, seconds)
    try:
        yield
    except psycopg.OperationalError as exc:
        if WATCHDOG.disarm(token):
            raise
        raise DeadlineExpired(expired_message(seconds, setting)) from exc
    except BaseException:
        WATCHDOG.disarm(token)
        raise
    else:
        if not WATCHDOG.disarm(token):  # it answered, but as the deadline shut the socket: the connection is
            # broken all the same, and a caller told nothing would take the next statement's failure for a
            # lost connection (the daemon's store down, a reconnect) rather than for this deadline
            raise DeadlineExpired(expired_message(seconds, setting))
