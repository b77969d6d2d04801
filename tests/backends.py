"""The store a daemon test runs on, either backend, with a way to make it refuse writes for real and take
them again: SQLite through a TEMP trigger on the daemon's own connection (as a failing disk refuses a
write), PostgreSQL through the privileges of the role the box connects as, changed under its live
connection (PostgreSQL itself answers `permission denied`/`violates row-level security policy`, SQLSTATE
42501). What the tests written on SQLite first (tests/test_final_post_retry.py,
tests/test_daemon_inprocess.py) share to run on both.

On PostgreSQL the box connects as a login role of its own, not the superuser (whom no privilege check
stops), with the privileges a fleet's box needs on every table and sequence; its daemon store is journaled,
as `babysit up` makes it. A stopped server is not how these refusals happen in a fleet: the journaled store
then babysits on its local mirror and its writes succeed there (tests/fleet/test_outage*.py); what makes a
fleet daemon's write raise is PostgreSQL refusing the statement on a live connection. Where the SQLite test
refuses one kind of row, the role's refusal is scoped to that row by a restrictive row-level security
policy; `refuse_posts` refuses every outbox row (tests/test_outbox_refused.py).
"""

from __future__ import annotations

import sqlite3
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

BACKENDS = ("sqlite", "postgresql")
HOST = "box-a"


class Backend:
    """One test's store, its registry lines, and its refusals (each undone by `allow`)."""

    name = "sqlite"

    def registry_head(self) -> str:
        """What babysit.toml says before its [[runs]]: nothing on SQLite."""
        return ""

    def started(self, daemon: Any) -> None:
        """The daemon built: what `babysit up` does to its store before its first look."""

    def asker(self, state_dir: Path) -> Any:
        """Another process's store (the CLI, the bot) that queues requests."""
        from babysit.db.store import Store

        return Store.in_dir(state_dir)

    refused = sqlite3.Error  # what the daemon's store raises for a refused statement

    def refuse_verdict_posts(self, daemon: Any) -> None:
        """A FINAL verdict's post refused, every other write taken."""
        daemon.store._db.execute(
            "CREATE TEMP TRIGGER refuse_verdict BEFORE INSERT ON outbox WHEN NEW.kind = 'verdict'"
            " BEGIN SELECT RAISE(ABORT, 'disk I/O error (the test''s)'); END")

    def refuse_posts(self, daemon: Any) -> None:
        """Every outbox row refused (the outbox alone: every other write taken)."""
        daemon.store._db.execute("CREATE TEMP TRIGGER refuse_post BEFORE INSERT ON outbox"
                                 " BEGIN SELECT RAISE(ABORT, 'disk I/O error (the test''s)'); END")

    def refuse_posts_of(self, daemon: Any, kind: str) -> None:
        """The outbox rows of one kind refused, every other row taken."""
        daemon.store._db.execute(f"CREATE TEMP TRIGGER refuse_post BEFORE INSERT ON outbox WHEN NEW.kind = '{kind}'"
                                 " BEGIN SELECT RAISE(ABORT, 'disk I/O error (the test''s)'); END")

    def refuse_answers(self, daemon: Any, run: str) -> None:
        """The answer to `run`'s requests refused, the other runs' answered."""
        daemon.store._db.execute(f"CREATE TEMP TRIGGER refuse_answer BEFORE UPDATE ON control WHEN NEW.run = '{run}'"
                                 " BEGIN SELECT RAISE(ABORT, 'disk I/O error (the test''s)'); END")

    def refuse_listing(self, daemon: Any) -> None:
        """The daemon's read of its requests fails (a temp view shadows the table, over a table since dropped)."""
        for sql in ("CREATE TEMP TABLE gone (x)", "CREATE TEMP VIEW control AS SELECT * FROM gone", "DROP TABLE gone"):
            daemon.store._db.execute(sql)

    def allow(self, daemon: Any) -> None:
        for trigger in ("refuse_verdict", "refuse_post", "refuse_answer"):
            daemon.store._db.execute(f"DROP TRIGGER IF EXISTS {trigger}")
        daemon.store._db.execute("DROP VIEW IF EXISTS temp.control")

    def close(self) -> None:
        pass


class PostgresBackend(Backend):
    name = "postgresql"

    def __init__(self, admin_url: str) -> None:
        self.admin_url = admin_url  # the superuser's url of this test's database
        self.role = "box_" + uuid.uuid4().hex[:12]
        prefix = "postgresql://postgres@"
        assert admin_url.startswith(prefix), admin_url
        self.url = f"postgresql://{self.role}@" + admin_url[len(prefix):]
        self._restricted: list[str] = []
        self.sql(f"CREATE ROLE {self.role} LOGIN", f"GRANT USAGE ON SCHEMA public TO {self.role}",
                 f"GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO {self.role}",
                 f"GRANT USAGE, SELECT, UPDATE ON ALL SEQUENCES IN SCHEMA public TO {self.role}")

    def sql(self, *statements: str) -> None:
        import psycopg

        with psycopg.connect(self.admin_url, autocommit=True) as conn:
            for statement in statements:
                conn.execute(statement)

    def registry_head(self) -> str:
        return f'[store]\nurl = "{self.url}"\n[host]\nname = "{HOST}"\n'

    def started(self, daemon: Any) -> None:
        daemon.store.start_journal()

    def asker(self, state_dir: Path) -> Any:
        from babysit.db.postgres import PostgresStore

        return PostgresStore(self.admin_url, host="cli")

    @property
    def refused(self) -> type[Exception]:
        import psycopg

        return psycopg.errors.InsufficientPrivilege

    def _restrict(self, table: str, action: str, check: str) -> None:
        """The role refused the rows of `table` that fail `check` (row-level security: every other row as
        before; the superuser, the tables' owner, is not subject to it)."""
        self.sql(f"ALTER TABLE {table} ENABLE ROW LEVEL SECURITY",
                 f"CREATE POLICY box_all ON {table} TO {self.role} USING (true) WITH CHECK (true)",
                 f"CREATE POLICY box_refused ON {table} AS RESTRICTIVE FOR {action} TO {self.role}"
                 + (" USING (true)" if action == "UPDATE" else "") + f" WITH CHECK ({check})")
        self._restricted.append(table)

    def refuse_verdict_posts(self, daemon: Any) -> None:
        self._restrict("outbox", "INSERT", "kind <> 'verdict'")

    def refuse_posts(self, daemon: Any) -> None:
        self._restrict("outbox", "INSERT", "false")

    def refuse_posts_of(self, daemon: Any, kind: str) -> None:
        self._restrict("outbox", "INSERT", f"kind <> '{kind}'")

    def refuse_answers(self, daemon: Any, run: str) -> None:
        # claimed as ever (claimed_by, claimed_at), but no answer (handled_at) written for `run`'s requests
        self._restrict("control", "UPDATE", f"run <> '{run}' OR handled_at IS NULL")

    def refuse_listing(self, daemon: Any) -> None:
        self.sql(f"REVOKE UPDATE ON control FROM {self.role}")  # a request is claimed by an UPDATE

    def allow(self, daemon: Any) -> None:
        for table in self._restricted:
            self.sql(f"DROP POLICY box_refused ON {table}", f"DROP POLICY box_all ON {table}",
                     f"ALTER TABLE {table} DISABLE ROW LEVEL SECURITY")
        self._restricted.clear()
        self.sql(f"GRANT UPDATE ON control TO {self.role}")

    def close(self) -> None:
        self.sql(f"DROP OWNED BY {self.role}", f"DROP ROLE {self.role}")


@contextmanager
def backend(name: str, request: Any) -> Iterator[Backend]:
    """The backend `name` for a test (`request`: pytest's, whose `pg_url` fixture gives PostgreSQL's
    database, skipping where the server binaries are missing)."""
    chosen = Backend() if name == "sqlite" else PostgresBackend(request.getfixturevalue("pg_url"))
    try:
        yield chosen
    finally:
        chosen.close()


VERDICT_FIXTURES = Path(__file__).parent / "fixtures" / "verdict"


def register_verdict_run(root: Path, chosen: Backend, monkeypatch: Any) -> None:
    """The verdict fixtures' run registered in `root` on `chosen`'s store, one simulated GPU at 90 %: the
    starting point of the in-process daemon tests that make the store refuse rows (its launch not yet made)."""
    import json
    import shutil

    from babysit.register import registration

    for name in ("BABYSIT_STORE_URL", "BABYSIT_HOST"):
        monkeypatch.delenv(name, raising=False)
    (root / "gpus.json").write_text(json.dumps({"gpus": [{"index": 0, "util_pct": 90, "processes": []}]}))
    (root / "babysit.toml").write_text('[daemon]\nstate_dir = ".babysit"\n' + chosen.registry_head())
    for log in ("demosonly_train_log.jsonl", "rigonly_train_log.jsonl"):
        shutil.copy(VERDICT_FIXTURES / log, root / log)
    spec = (VERDICT_FIXTURES / "run.toml").read_text().replace("[prereg]\n", "gpus = [0]\n\n[prereg]\n", 1)
    (root / "run.toml").write_text(spec)
    registration.register(root / "run.toml", root / "babysit.toml", accelerated=True, wake_daemon=False)
