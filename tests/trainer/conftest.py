"""Shared helpers: run the real trainer in a subprocess, read its JSONL log."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import shared_dir

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def data_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One generated-demos cache for the whole session, shared by its xdist workers (the trainer writes
    the cache atomically): generation runs about once per corpus."""
    return shared_dir(tmp_path_factory, "trainer-cache")


def trainer_env(data_cache: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["BABYSIT_TRAINER_CACHE"] = str(data_cache)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    return env


RunTrainer = Callable[..., subprocess.CompletedProcess]


@pytest.fixture
def run_trainer(data_cache: Path) -> RunTrainer:
    """`run_trainer(*flags, timeout=…, **popen)`: `python -m trainer FLAGS` to completion."""

    def run(*flags: str, timeout: float = 240, **kwargs: Any) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "trainer", *flags], cwd=REPO, env=trainer_env(data_cache),
                              capture_output=True, text=True, timeout=timeout, **kwargs)

    return run


def read_log(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def train_losses(records: list[dict[str, Any]]) -> dict[int, float]:
    """step -> train_loss; a later record for the same step (after a resume) must agree, checked by callers."""
    return {r["step"]: r["train_loss"] for r in records if "train_loss" in r}


def eval_curve(records: list[dict[str, Any]]) -> dict[int, tuple[float, float]]:
    """step -> (eval_chunk_mae, train_chunk_mae)."""
    return {r["step"]: (r["eval_chunk_mae"], r["train_chunk_mae"]) for r in records if "eval_chunk_mae" in r}
