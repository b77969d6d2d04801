"""Fixtures for the Slack tests: a started FakeSlack, the environment pointing at it, a state dir."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from babysit.db.store import Store
from tests.slack.fake_slack import FakeSlack

TOKEN = "xoxb-test-token"
PNG = b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 4


@pytest.fixture
def fake() -> Iterator[FakeSlack]:
    server = FakeSlack(TOKEN).start()
    yield server
    server.stop()


@pytest.fixture
def slack_env(fake: FakeSlack, monkeypatch: pytest.MonkeyPatch) -> FakeSlack:
    monkeypatch.setenv("BABYSIT_SLACK_API_URL", fake.api_url)
    monkeypatch.setenv("SLACK_BOT_TOKEN", TOKEN)
    monkeypatch.delenv("BABYSIT_SLACK_CHANNEL", raising=False)
    return fake


@pytest.fixture
def state(tmp_path: Path) -> Path:
    path = tmp_path / ".babysit"
    path.mkdir()
    return path


@pytest.fixture
def store(state: Path) -> Iterator[Store]:
    db = Store.in_dir(state)
    yield db
    db.close()
