"""The database down, reviewed: what the daemon's outage path got wrong, each pinned against a real
PostgreSQL stopped and started under it (docs/fleet.md, "The database down")."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from babysit.channels.notify import deliver_due
from babysit.commands.up import open_channel
from babysit.core.snapshot import Snapshot
from babysit.db import journal
from babysit.db.store import PollRow
from babysit.probes.gpu import FileGpuProbe
from babysit.service.daemon import Daemon
from tests.reliability.harness import gpu_file
from tests.slack.conftest import TOKEN
from tests.slack.fake_slack import FakeSlack
from tests.support import wait_for


@pytest.fixture
def slack(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeSlack]:
    fake = FakeSlack(TOKEN).start()
    monkeypatch.setenv("SLACK_BOT_TOKEN", TOKEN)
    monkeypatch.setenv("BABYSIT_SLACK_API_URL", fake.api_url)
    monkeypatch.setenv("BABYSIT_SLACK_CHANNEL", "C0RUNS")
    for key in ("BABYSIT_STORE_URL", "BABYSIT_HOST"):
        monkeypatch.delenv(key, raising=False)
    try:
        yield fake
    finally:
        fake.stop()


def _box(tmp_path: Path, url: str) -> Path:
    gpu_file(tmp_path / "gpus.json")
    (tmp_path / "babysit.toml").write_text(f'[daemon]\nchannel = "C0RUNS"\n[store]\nurl = "{url}"\n'
                                           '[host]\nname = "box-a"\n')
    return tmp_path / "babysit.toml"


def _daemon(path: Path) -> Daemon:
    """The daemon as `babysit up` builds it (its channel from `open_channel`), its store journaling."""
    from babysit.runtime import registry

    reg = registry.load(path)
    daemon = Daemon(path, gpu_probe=FileGpuProbe(path.parent / "gpus.json"), channel=open_channel(reg.state_dir, None, reg))
    daemon.store.claim_run("r1", 1.0)
    daemon.store.start_journal()
    return daemon


def test_a_poll_header_update_goes_out_while_postgres_is_down(
        tmp_path: Path, pg_url: str, outage: Callable[[], None], slack: FakeSlack) -> None:
    """The live header under the launch post is re-rendered from the launch post's row: read through the
    daemon's own store (its mirror while down), not a second PostgreSQL connection that fails and holds up
    every run's posts until the database is back."""
    daemon = _daemon(_box(tmp_path, pg_url))
    store, channel = daemon.store, daemon.channel
    try:
        launch = store.enqueue("r1", "launch", {"run": "r1", "attempt": 1, "profile": "base", "argv": ["python"]},
                               1.0, dedupe_key="r1:1:launch")
        assert deliver_due(store, channel, time.time) == 1
        outage()
        store.record_polls([PollRow("r1", 1, 2.0, "periodic", Snapshot.from_dict({"step": 9}), launch, {"run": "r1", "text": "poll"})])
        assert store.down
        assert deliver_due(store, channel, time.time) == 1  # the poll, threaded under the launch post
        assert deliver_due(store, channel, time.time) == 1  # then the header, edited in place
        assert store.pending_count() == 0
        assert len(slack.calls_to("chat.update")) == 1
    finally:
        daemon.store.close()


def _store(url: str, state: Path) -> Any:
    from babysit.db.postgres import PostgresStore

    store = PostgresStore(url, host="box-a", state_dir=state)
    store.claim_run("r1", 1.0)
    store.start_journal()
    return store


def _remove_mirror(state: Path) -> None:
    for suffix in ("", "-wal", "-shm"):  # `rm .babysit/fleet-journal.db*` by hand
        (state / f"{journal.JOURNAL_FILE}{suffix}").unlink(missing_ok=True)


def test_a_mirror_removed_during_an_outage_is_replayed_from_the_open_file_and_made_again(
        pg_url: str, tmp_path: Path, outage: Callable[[], None], postgres: Any) -> None:
    """The replay's first pass reads the journal through a second connection at the mirror's path: a file
    removed meanwhile made it read an empty new one (no journal table), fail, and try again forever, the
    store never connected again and the journal lost when the daemon stopped."""
    from babysit.db.postgres import PostgresStore

    store = _store(pg_url, tmp_path)
    other = PostgresStore(pg_url, host="box-b")
    try:
        outage()
        store.add_incident("r1", None, 2.0, "while-down", {})
        assert store.down
        _remove_mirror(tmp_path)
        store.add_incident("r1", None, 3.0, "after-rm", {})
        postgres.start()
        wait_for("the store connected again", lambda: not store.down, timeout=20)
        assert [r.kind for r in other.incidents("r1")] == ["after-rm", "while-down"]
        assert (tmp_path / journal.JOURNAL_FILE).exists()  # a mirror again, for the next outage
        assert [r[0] for r in sqlite3.connect(tmp_path / journal.JOURNAL_FILE).execute("SELECT run FROM runs")] == ["r1"]
    finally:
        store.close()
        other.close()


def test_a_mirror_removed_while_connected_is_made_again_at_the_guard_round(
        pg_url: str, tmp_path: Path, outage: Callable[[], None], postgres: Any) -> None:
    """Removed while PostgreSQL answers, the mirror would take the next outage's journal into a file that
    vanishes when the daemon stops: those writes were lost for good."""

    store = _store(pg_url, tmp_path)
    _remove_mirror(tmp_path)
    store.refresh_mirror()  # the daemon's guard round
    outage()
    store.add_incident("r1", None, 2.0, "while-down", {})
    assert store.down
    store.close()  # the daemon stopped before PostgreSQL came back
    postgres.start()
    again = _store(pg_url, tmp_path)
    try:
        assert [r.kind for r in again.incidents("r1")] == ["while-down"]
    finally:
        again.close()
