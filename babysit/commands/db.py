"""`babysit db upgrade | version | copy`: the state database's schema and its move to PostgreSQL (docs/fleet.md)."""

from __future__ import annotations

import argparse
import time
from dataclasses import replace

from babysit.core.errors import RegistryError
from babysit.db import migrate
from babysit.db.redact import redact
from babysit.db.store import SCHEMA_VERSION, Store
from babysit.db.url import host_name, store_url
from babysit.runtime import registry


def run_upgrade(args: argparse.Namespace) -> int:
    reg = registry.load(registry.resolve_registry_path(args.registry))
    url = store_url(reg)
    if url is None:
        before, after = migrate.upgrade_sqlite(reg.state_dir / "state.db")
    else:
        before, after = migrate.upgrade_postgres(url)
    where = migrate.describe(url, reg.state_dir)
    print(f"{where}: schema {before} -> {after}" if before != after else f"{where}: already at schema {after}")
    return 0


def run_version(args: argparse.Namespace) -> int:
    reg = registry.load(registry.resolve_registry_path(args.registry))
    url = store_url(reg)
    if url is None:
        store = Store.in_dir(reg.state_dir)
        version = store.schema_version()
        store.close()
        print(f"sqlite {reg.state_dir / 'state.db'}: schema {version} (this babysit: {SCHEMA_VERSION})")
        return 0
    from babysit.db.postgres import VERSION_TABLE, PgConnection

    conn = PgConnection(url, deadline=reg.store.deadline_seconds)
    try:
        exists = conn.execute("SELECT to_regclass(?) IS NOT NULL", (VERSION_TABLE,)).fetchone()[0]
        row = conn.execute(f"SELECT version_num FROM {VERSION_TABLE}").fetchone() if exists else None
    finally:
        conn.close()
    version = int(row[0]) if row else 0
    print(f"postgresql {redact(url)}: schema {version} (this babysit: {SCHEMA_VERSION})"
          + ("" if version == SCHEMA_VERSION else " — run `babysit db upgrade`"))
    return 0 if version == SCHEMA_VERSION else 1


def run_copy(args: argparse.Namespace) -> int:
    from babysit.db.copy import copy_store
    from babysit.db.postgres import PostgresStore

    reg = registry.load(registry.resolve_registry_path(args.registry))
    if not (reg.state_dir / "state.db").exists():
        raise RegistryError(f"{reg.state_dir / 'state.db'}: no SQLite state to copy",
                            hint="run it on the box whose history should move (its babysit.toml's state_dir)")
    dest_url = store_url(replace(reg, store=replace(reg.store, url=args.to)), environ={})
    assert dest_url is not None
    host = args.host or host_name(reg)
    source = Store.in_dir(reg.state_dir)
    dest = PostgresStore(dest_url, host=host, deadline_s=None)  # one long transaction: no statement deadline
    try:
        report = copy_store(source, dest, host=host, runs=reg.names, now=time.time())
    finally:
        source.close()
        dest.close()
    total = sum(report.rows.values())
    print(f"copied {total} rows from {source.where} to {dest.where} as host {host}; every table compared equal")
    for table, n in report.rows.items():
        if n:
            print(f"  {table}: {n}")
    print(f"next: set [store] url in {reg.path} (or $BABYSIT_STORE_URL) and restart `babysit up`")
    return 0
