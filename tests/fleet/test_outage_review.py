"""The database down, reviewed: what the daemon's outage path got wrong, each pinned against a real
PostgreSQL stopped and started under it (docs/fleet.md, "The database down")."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from babysit.commands.up import open_channel
from babysit.daemon import Daemon
from babysit.notify import deliver_due
from babysit.probes.gpu import FileGpuProbe
from babysit.store import PollRow
from tests.reliability.harness import gpu_file
from tests.slack.conftest import TOKEN
from tests.slack.fake_slack import FakeSlack


def wait_for(what: str, check: Callable[[], Any], timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")


@pytest.fixture
def outage(postgres: Any) -> Iterator[Callable[[], None]]:
    """Stops this worker's server on call; it is always started again (other tests share it)."""
    try:
        yield lambda: postgres.stop("fast")
    finally:
        if not postgres.running():
            postgres.start()


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
    from babysit import registry

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
        store.record_polls([PollRow("r1", 1, 2.0, "periodic", {"step": 9}, launch, {"run": "r1", "text": "poll"})])
        assert store.down
        assert deliver_due(store, channel, time.time) == 1  # the poll, threaded under the launch post
        assert deliver_due(store, channel, time.time) == 1  # then the header, edited in place
        assert store.pending_count() == 0
        assert len(slack.calls_to("chat.update")) == 1
    finally:
        daemon.store.close()
