"""A throwaway PostgreSQL server of the machine's own binaries, on a Unix socket in a directory of its own:
what the tests, the fleet benchmarks and `babysit demo --fleet` run against. Nothing listens on TCP, no
system service is needed, and `stop()` leaves nothing running.

Debian puts the server binaries in /usr/lib/postgresql/N/bin (`apt-get install postgresql`); `initdb`
refuses to run as root, so as root the cluster is made and run as the `postgres` user.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import subprocess
from pathlib import Path

SUPERUSER = "postgres"


class PostgresUnavailable(RuntimeError):
    """No PostgreSQL server binaries here (or no user to run them as): a test skips with this reason."""


def find_bin_dir() -> Path:
    """The newest /usr/lib/postgresql/N/bin with initdb and pg_ctl, or the directory of `pg_ctl` on PATH."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"), key=lambda p: int(Path(p).parts[4]))
    if found:
        return Path(found[-1]).parent
    on_path = shutil.which("pg_ctl")
    if on_path and shutil.which("initdb"):
        return Path(on_path).parent
    raise PostgresUnavailable("no PostgreSQL server binaries (initdb, pg_ctl): `apt-get install postgresql`")


class LocalPostgres:
    """One cluster under `root` (data in root/data, the socket in root/sock), started and stopped here."""

    def __init__(self, root: Path, *, bin_dir: Path | None = None, settings: str = "", port: int | None = None) -> None:
        self.root = Path(root)
        self.settings = settings  # more `-c name=value` options (a bench turns statement logging on)
        self.port = port  # also on TCP, 127.0.0.1:port (as a fleet's boxes reach their database), not only the socket
        self.bin_dir = bin_dir or find_bin_dir()
        self.data = self.root / "data"
        self.sock = self.root / "sock"
        self._as_user: str | None = None
        if os.geteuid() == 0:
            try:
                pwd.getpwnam("postgres")
            except KeyError as exc:
                raise PostgresUnavailable("running as root and no `postgres` user to run initdb as") from exc
            self._as_user = "postgres"

    def url(self, database: str = "postgres") -> str:
        if self.port is not None:
            return f"postgresql://{SUPERUSER}@127.0.0.1:{self.port}/{database}"
        return f"postgresql://{SUPERUSER}@/{database}?host={self.sock}"

    def _run(self, *argv: str, timeout: float = 120) -> str:
        cmd = [str(self.bin_dir / argv[0]), *argv[1:]]
        if self._as_user:
            cmd = ["runuser", "-u", self._as_user, "--", *cmd]
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        if out.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed ({out.returncode}): {out.stderr.strip() or out.stdout.strip()}")
        return out.stdout

    def _chown(self, path: Path) -> None:
        if self._as_user:
            entry = pwd.getpwnam(self._as_user)
            os.chown(path, entry.pw_uid, entry.pw_gid)

    def init(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        self._chown(self.root)
        self.sock.mkdir(exist_ok=True)
        self._chown(self.sock)
        if not (self.data / "PG_VERSION").exists():
            self._run("initdb", "-D", str(self.data), "-U", SUPERUSER, "--auth=trust", "-E", "UTF8",
                      "--no-instructions", "-A", "trust")

    def start(self) -> None:
        """initdb when needed, then start and wait until it accepts connections. fsync is off: a test
        server's data need not survive the machine, and the shared CPU is spared."""
        self.init()
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.data / "server.log"), "-w", "-t", "60",
                  "-o", f"-k {self.sock} {self._listen()} -c fsync=off -c synchronous_commit=off "
                        f"-c full_page_writes=off -c max_connections=200 {self.settings}", "start")

    def _listen(self) -> str:
        """The socket alone, or the socket and 127.0.0.1:port."""
        return "-c listen_addresses=''" if self.port is None else f"-c listen_addresses=127.0.0.1 -p {self.port}"

    def restart(self, mode: str = "fast") -> None:
        """`pg_ctl restart -m fast`: every connection is cut, as a managed database's failover does."""
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.data / "server.log"), "-w", "-t", "60", "-m", mode,
                  "restart")

    def stop(self, mode: str = "fast") -> None:
        with contextlib.suppress(RuntimeError, FileNotFoundError):
            self._run("pg_ctl", "-D", str(self.data), "-w", "-t", "60", "-m", mode, "stop")

    def running(self) -> bool:
        try:
            self._run("pg_ctl", "-D", str(self.data), "status")
        except RuntimeError:
            return False
        return True

    def create_database(self, name: str) -> str:
        """A new, empty database; its url."""
        import psycopg

        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)
