"""Shared by the framework tests: one torch thread (two shared cores; more threads only spin), a log path."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture
def one_thread() -> Iterator[None]:
    torch = pytest.importorskip("torch", reason="torch is not installed (pip install '.[trainer]')")
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def babysit_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """$BABYSIT_LOG as babysit sets it for an attempt."""
    log = tmp_path / "outputs" / "run" / "train_log.jsonl"
    monkeypatch.setenv("BABYSIT_LOG", str(log))
    monkeypatch.setenv("BABYSIT_ATTEMPT", "1")
    monkeypatch.delenv("RANK", raising=False)
    return log
