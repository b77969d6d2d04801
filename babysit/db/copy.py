"""`babysit db copy --to postgresql://…`: a box's SQLite history moved into a fleet's PostgreSQL, whole.

Every row of every table keeps its id (outbox threads and poll posts name rows by id), JSON bodies are
copied as the exact text babysit wrote (amendment hashes and the prereg chain stay verifiable), and the
copy is one transaction: a failure leaves the destination as it was. Afterwards each table is read back
from both sides and compared by a digest of its rows; the box's registered runs are recorded as its own
(`runs`), and its queued messages and requests are addressed to it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from babysit.core.errors import StateError
from babysit.db import schema
from babysit.db.postgres import PostgresStore
from babysit.db.store import Store


@dataclass(frozen=True)
class CopyReport:
    rows: dict[str, int]  # table -> rows copied
    digests: dict[str, str]  # table -> sha256 of its rows, the same on both sides


def _columns(table: Any) -> list[str]:
    return [c.name for c in table.columns]


def _order(table: Any) -> str:
    return ", ".join(f'"{c.name}"' for c in table.primary_key.columns)


def _select(table: Any) -> str:
    cols = ", ".join(f'"{c}"' for c in _columns(table))
    return f"SELECT {cols} FROM {table.name} ORDER BY {_order(table)}"


def digest(rows: Iterable[Sequence[Any]]) -> str:
    """Rows' sha256, values written by type: 1000.0 stored as REAL on SQLite and as double on PostgreSQL agree."""
    h = hashlib.sha256()
    for row in rows:
        h.update(repr(tuple(float(v) if isinstance(v, float) else v for v in row)).encode())
        h.update(b"\n")
    return h.hexdigest()


def copy_store(source: Store, dest: PostgresStore, *, host: str, runs: Sequence[str], now: float) -> CopyReport:
    """Copy everything from `source` (SQLite) into `dest` (an empty PostgreSQL at the same schema)."""
    if source.schema_version() != dest.schema_version():
        raise StateError(f"{source.where} is at schema {source.schema_version()}, {dest.where} at "
                         f"{dest.schema_version()}", hint="run `babysit db upgrade` on both first")
    busy = [t.name for t in schema.COPY_ORDER if dest._query(f"SELECT 1 FROM {t.name} LIMIT 1")
            and t.name not in ("hosts",)]
    if busy:
        raise StateError(f"{dest.where} already holds rows in {', '.join(busy)}",
                         hint="copy into an empty database (a fleet's boxes copy one at a time, each into a new "
                              "database, or start fresh on PostgreSQL)")
    taken = dest._query("SELECT run FROM runs")
    clash = sorted(set(runs) & {r[0] for r in taken})
    if clash:
        raise StateError(f"{dest.where}: runs {', '.join(clash)} already belong to another box",
                         hint="rename them on this box first; run names are the fleet's")
    counts: dict[str, int] = {}
    with dest.tx() as db:
        for table in schema.COPY_ORDER:
            rows = [tuple(r) for r in source._query(_select(table))]
            counts[table.name] = len(rows)
            if not rows:
                continue
            cols = _columns(table)
            names = ", ".join(f'"{c}"' for c in cols)
            db.executemany(f"INSERT INTO {table.name} ({names}) VALUES ({', '.join('?' * len(cols))})", rows)
            if "id" in cols:  # the identity continues after the copied ids
                db.execute(f"SELECT setval(pg_get_serial_sequence('{table.name}', 'id'), MAX(id)) FROM {table.name}")
        for run in runs:
            db.execute("INSERT INTO runs (run, host, registered_at) VALUES (?, ?, ?) ON CONFLICT DO NOTHING",
                       (run, host, now))
        db.execute("UPDATE outbox SET host=? WHERE host IS NULL", (host,))
        db.execute("UPDATE control SET host=? WHERE host IS NULL", (host,))
    digests: dict[str, str] = {}
    for table in schema.COPY_ORDER:
        if table.name == "runs":  # made here from the registry: SQLite has none
            continue
        cols = [c for c in _columns(table) if c != "host"]  # outbox and control rows are addressed to the box now
        quoted = ", ".join(f'"{c}"' for c in cols)
        sql = f"SELECT {quoted} FROM {table.name} ORDER BY {_order(table)}"
        left, right = digest(source._query(sql)), digest(dest._query(sql))
        if left != right:
            raise StateError(f"{dest.where}: table {table.name} differs from {source.where} after the copy",
                             hint="report this as a bug (docs/fleet.md); the source is untouched")
        digests[table.name] = left
    return CopyReport(counts, digests)
