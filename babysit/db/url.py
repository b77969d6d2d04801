"""Which state database a box uses: `[store] url` in babysit.toml or $BABYSIT_STORE_URL (this one wins);
none: SQLite in the state directory, as babysit has always done. Nothing heavy imported here."""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping

from babysit.core.errors import RegistryError
from babysit.core.spec.run_toml import HOST_NAME
from babysit.db.mirror_view import MirrorStore
from babysit.db.redact import redact
from babysit.db.store import Store
from babysit.runtime.registry import Registry

URL_ENV = "BABYSIT_STORE_URL"
HOST_ENV = "BABYSIT_HOST"
SCHEMES = ("postgresql://", "postgres://")


def store_url(registry: Registry, environ: Mapping[str, str] | None = None) -> str | None:
    """The configured PostgreSQL url, or None for SQLite; anything else is refused by name."""
    env = os.environ if environ is None else environ
    url = env.get(URL_ENV) or registry.store.url
    if not url:
        return None
    if not url.startswith(SCHEMES):
        source = f"${URL_ENV}" if env.get(URL_ENV) else f"{registry.path}: store.url"
        raise RegistryError(f"{source}: expected a postgresql://… url, got {redact(url)!r}",
                            hint="leave it out for SQLite in the state directory (docs/fleet.md)")
    return url


def host_name(registry: Registry, environ: Mapping[str, str] | None = None) -> str:
    """This box's name in the fleet: $BABYSIT_HOST, else [host] name, else the machine's hostname."""
    env = os.environ if environ is None else environ
    name = env.get(HOST_ENV) or registry.host.name or socket.gethostname().split(".")[0]
    if not HOST_NAME.fullmatch(name):
        raise RegistryError(f"host name {name!r} (${HOST_ENV}, [host] name or the hostname): expected letters, "
                            "digits, '.', '_' or '-', at most 63", hint="set [host] name in babysit.toml")
    return name


def open_store(registry: Registry, environ: Mapping[str, str] | None = None, *, daemon: bool = False,
               reader: bool = False) -> Store:
    """The box's store: PostgreSQL when a url is configured (psycopg imported only then), else SQLite.
    `daemon`: the daemon's, which starts from the box's local mirror while PostgreSQL is unreachable.
    `reader`: a reader's with a mirror to fall back on, which gives up on a silent database in seconds and
    on an unanswered statement after `[store] read_deadline_seconds` (the others' after `deadline_seconds`)."""
    url = store_url(registry, environ)
    if url is None:
        return Store.in_dir(registry.state_dir)
    from babysit.db.postgres import PostgresStore

    settings = registry.store
    return PostgresStore(url, host=host_name(registry, environ), state_dir=registry.state_dir,
                         may_start_down=daemon, reader=reader,
                         deadline_s=settings.read_deadline_seconds if reader else settings.deadline_seconds,
                         own_runs=registry.names)


def open_existing(registry: Registry, environ: Mapping[str, str] | None = None, *,
                  mirror_ok: bool = False) -> Store | None:
    """The box's store for a reader (`status`, the web page, the bot): None on SQLite while no daemon has
    made `state.db` yet (a reader never creates the state directory). `mirror_ok`: with PostgreSQL
    unreachable, the box's local mirror read-only (a `MirrorStore`: its banner says so) when it has one."""
    url = store_url(registry, environ)
    if url is None and not (registry.state_dir / "state.db").exists():
        return None
    if url is None or not mirror_ok:
        return open_store(registry, environ)
    from babysit.db.postgres import DatabaseUnreachable

    try:
        return open_store(registry, environ, reader=True)
    except DatabaseUnreachable as exc:
        reason = str(exc.__cause__ or exc).strip().splitlines()[0][:160]
        mirror = box_mirror(registry, reason, environ)
        if mirror is None:
            raise
        return mirror


def box_mirror(registry: Registry, reason: str, environ: Mapping[str, str] | None = None) -> MirrorStore | None:
    """The box's local mirror, read-only, its banner saying PostgreSQL is unreachable for `reason`; None when
    the box has none (no daemon of this box ever ran with the database up)."""
    return MirrorStore.of_box(registry.state_dir, host_name(registry, environ), reason)


def fleet_owner(registry: Registry, run: str, environ: Mapping[str, str] | None = None) -> str | None:
    """The box that owns `run` in this box's fleet; None on SQLite (no query) or when no box does."""
    if store_url(registry, environ) is None:
        return None
    store = open_store(registry, environ)
    try:
        return store.run_hosts().get(run)
    finally:
        store.close()
