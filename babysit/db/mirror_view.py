"""A read-only look at a fleet box's local mirror (`.babysit/fleet-journal.db`, babysit/db/journal.py) for
the box's readers while PostgreSQL cannot be reached: `babysit status`, the live view and the web page show
this box's runs as its daemon last wrote them, saying so and how old the copy is, instead of a database
error. No psycopg here: `babysit status` stays fast."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

from babysit.core.errors import StateError
from babysit.db.store import BUSY_TIMEOUT_S, SCHEMA_VERSION, Store

JOURNAL_FILE = "fleet-journal.db"  # babysit.db.journal.JOURNAL_FILE (that module imports psycopg)


class MirrorStore(Store):
    """The mirror, opened read-only (a write raises): its rows are this box's, as of `as_of`."""

    def __init__(self, path: Path, host: str, as_of: float, unreachable: str) -> None:
        self.path = Path(path)
        self.state_dir = self.path.parent
        self.where = str(self.path)
        self.host = host
        self.as_of = as_of  # when the mirror was last a copy of PostgreSQL
        self.unreachable = unreachable  # why PostgreSQL was not read (its url redacted, the error)
        self._init_common()
        try:
            self._db = sqlite3.connect(f"file:{self.path}?mode=ro", uri=True, timeout=BUSY_TIMEOUT_S,
                                       check_same_thread=False, isolation_level=None)
            self._db.row_factory = sqlite3.Row
        except sqlite3.Error as exc:
            raise StateError(f"{self.path}: cannot read the local mirror: {exc}",
                             hint="check the state directory's permissions") from exc

    @classmethod
    def of_box(cls, state_dir: Path, host: str, unreachable: str) -> MirrorStore | None:
        """The box's mirror if it holds runs of `host`; None: no usable mirror."""
        path = Path(state_dir) / JOURNAL_FILE
        if not path.exists():
            return None
        try:
            store = cls(path, host, 0.0, unreachable)
            if store.schema_version() != SCHEMA_VERSION or not store._query(
                    "SELECT 1 FROM runs WHERE host=? LIMIT 1", (host,)):
                store.close()  # another babysit's schema (read-only: not migrated here), or none of this box's runs
                return None
        except (StateError, sqlite3.Error):
            return None
        try:
            row = store._query("SELECT value FROM mirror_info WHERE key='synced_at'")
            store.as_of = float(row[0][0]) if row else path.stat().st_mtime
        except sqlite3.Error:  # a mirror an older babysit made
            store.as_of = path.stat().st_mtime
        return store

    def banner(self, now: float | None = None) -> str:
        """What a reader prints above the rows."""
        now = time.time() if now is None else now
        at = time.strftime("%H:%M:%S UTC", time.gmtime(self.as_of))
        return (f"⚠️ the database cannot be reached ({self.unreachable}); this box's runs as its local mirror "
                f"holds them (its daemon's copy, in step with the database until {at}, {_ago(now - self.as_of)}"
                " ago); other boxes' runs are not shown")


def _ago(seconds: float) -> str:
    seconds = max(0.0, seconds)
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"
