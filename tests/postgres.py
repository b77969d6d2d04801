"""A real PostgreSQL for the tests (tests/conftest.py's `postgres` and `pg_url` fixtures).

initdb is slow (5-7 s of the shared CPU), so the first xdist worker to ask makes one cluster in the
session's shared directory; each worker then copies it and runs its own server on its own Unix socket
(stopped when the worker's session ends), with a database `babysit_template` migrated to the current
schema. Each test gets a fresh database cloned from that template (`CREATE DATABASE … TEMPLATE`, a file
copy: milliseconds), so tests never see each other's rows. Where the server binaries are missing, the
tests that need them skip, saying so.
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import socket
import tempfile
import uuid
from pathlib import Path

import pytest

from babysit.db.localserver import LocalPostgres, PostgresUnavailable, find_bin_dir

TEMPLATE = "babysit_template"


def server_root() -> Path:
    """A directory the `postgres` user can reach (pytest's own are root's, mode 0700): under /tmp."""
    root = Path(tempfile.mkdtemp(prefix="babysit-pg-"))
    os.chmod(root, 0o755)
    return root


def make_cluster(shared: Path) -> str:
    """initdb once for the session (under once_per_session's lock), kept in the shared directory (the
    copies are made by this user); the data directory's path."""
    root = server_root()
    try:
        server = LocalPostgres(root)
        server.init()
        shutil.move(str(server.data), shared / "pg-cluster")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return str(shared / "pg-cluster")


def start_worker_server(cluster: Path, *, tcp: bool = False) -> LocalPostgres:
    """A server of its own on a copy of the session's cluster: on its Unix socket, and with `tcp` on
    127.0.0.1 too (a free port), where its urls point."""
    root = server_root()
    server = LocalPostgres(root, port=free_port() if tcp else None)
    shutil.copytree(cluster, server.data, symlinks=True)
    if os.geteuid() == 0:
        entry = pwd.getpwnam("postgres")
        for path in (root, *root.rglob("*")):
            os.chown(path, entry.pw_uid, entry.pw_gid, follow_symlinks=False)
    os.chmod(server.data, 0o700)
    for stale in ("postmaster.pid", "postmaster.opts"):
        (server.data / stale).unlink(missing_ok=True)
    server.start()
    from babysit.db.migrate import upgrade_postgres

    upgrade_postgres(server.create_database(TEMPLATE))
    return server


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def fresh_database(server: LocalPostgres) -> str:
    """A new database at the current schema; its url."""
    import psycopg

    name = "t_" + uuid.uuid4().hex[:16]
    with psycopg.connect(server.url(), autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}" TEMPLATE {TEMPLATE}')
    return server.url(name)


def empty_database(server: LocalPostgres) -> str:
    """A new database with no schema at all (what `babysit db upgrade` starts from)."""
    import psycopg

    name = "e_" + uuid.uuid4().hex[:16]
    with psycopg.connect(server.url(), autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    return server.url(name)


def skip_reason() -> str | None:
    try:
        find_bin_dir()
        LocalPostgres(Path("/nonexistent"))  # as root: is there a postgres user to run initdb as?
    except PostgresUnavailable as exc:
        return str(exc)
    return None


def require() -> None:
    reason = skip_reason()
    if reason:
        pytest.skip(f"PostgreSQL not available: {reason}")


class Freezer:
    """A server frozen in place, as a hung host or storage freezes it: its postmaster and every process of
    it SIGSTOPped. The kernel still takes connections and data on its socket (the listen backlog, the receive
    buffers), so a client connects or sends and then waits for an answer that never comes; `thaw` (SIGCONT)
    and the server reads what was sent meanwhile and carries on. Always thawed in a `finally`: the
    worker's other tests share the server."""

    def __init__(self, server: LocalPostgres) -> None:
        self.server = server
        self.stopped: list[int] = []

    def postmaster(self) -> int:
        return int((self.server.data / "postmaster.pid").read_text().split()[0])

    def freeze(self) -> None:
        """The postmaster first (it forks nothing more), then its children, until none is left running."""
        parent = self.postmaster()
        os.kill(parent, signal.SIGSTOP)
        self.stopped.append(parent)
        while found := [pid for pid in _children(parent) if pid not in self.stopped]:
            for pid in found:
                try:
                    os.kill(pid, signal.SIGSTOP)
                except ProcessLookupError:
                    continue
                self.stopped.append(pid)

    def thaw(self) -> None:
        while self.stopped:
            try:
                os.kill(self.stopped.pop(), signal.SIGCONT)
            except ProcessLookupError:
                pass

    @property
    def frozen(self) -> bool:
        return bool(self.stopped)


def _children(parent: int) -> list[int]:
    """The processes whose parent is `parent` (/proc/PID/stat's fourth field; the name may hold spaces)."""
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(entry.path, "stat").read_text()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == parent:
            found.append(int(entry.name))
    return found
