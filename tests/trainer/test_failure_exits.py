"""The failure signals babysit classifies: divergence (11), out of memory (12), resume with nothing to resume."""

from __future__ import annotations

import resource
from pathlib import Path

from tests.trainer.conftest import read_log
from trainer.recipe import RECIPES_DIR


def test_non_finite_loss_exits_11_with_diverged_record(run_trainer, tmp_path: Path) -> None:
    log = tmp_path / "log.jsonl"
    result = run_trainer("--recipe", "tiny", "--inject-nan-at-step", "7", "--log", str(log),
                         "--checkpoints", str(tmp_path / "ck"))
    assert result.returncode == 11, result.stderr
    last = read_log(log)[-1]
    assert last["event"] == "diverged"
    assert last["step"] == 7
    assert last["reason"] == "non-finite train_loss (nan)"
    assert max(r["step"] for r in read_log(log) if "train_loss" in r) == 6


def _limit_address_space() -> None:
    # 3 GiB of address space: a tiny run peaks below 1 GiB; the batch asked for below needs ~12 GiB.
    limit = 3 * 1024**3
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def test_cpu_allocation_failure_under_rlimit_as_exits_12_with_allocator_message(run_trainer,
                                                                               tmp_path: Path) -> None:
    big = tmp_path / "big_images.toml"
    text = (RECIPES_DIR / "tiny.toml").read_text()
    big.write_text(text.replace("image_size = 12", "image_size = 64").replace("channels = 1", "channels = 3"))
    result = run_trainer("--recipe", str(big), "--micro-batch-size", "1000000", "--eval-every", "0",
                         "--log", str(tmp_path / "log.jsonl"), "--checkpoints", str(tmp_path / "ck"),
                         preexec_fn=_limit_address_space)
    assert result.returncode == 12, result.stderr
    assert "DefaultCPUAllocator: can't allocate memory: you tried to allocate 12288000000 bytes" in result.stderr
    assert result.stderr.rstrip().endswith("babysit-trainer: OOM")


def test_resume_without_checkpoint_starts_fresh_and_says_so(run_trainer, tmp_path: Path) -> None:
    log = tmp_path / "log.jsonl"
    result = run_trainer("--recipe", "tiny", "--steps", "5", "--resume", "latest", "--log", str(log),
                         "--checkpoints", str(tmp_path / "ck"))
    assert result.returncode == 0, result.stderr
    assert "no checkpoint in" in result.stderr and "starting fresh" in result.stderr
    records = read_log(log)
    assert records[0]["event"] == "start" and records[0]["step"] == 0
    assert records[-1] == {**records[-1], "event": "completed", "step": 5}


def test_start_record_keeps_numbers_out_of_metrics(run_trainer, tmp_path: Path) -> None:
    log = tmp_path / "log.jsonl"
    result = run_trainer("--recipe", "tiny", "--steps", "2", "--log", str(log), "--checkpoints", str(tmp_path))
    assert result.returncode == 0, result.stderr
    start = read_log(log)[0]
    assert start["event"] == "start" and start["recipe"] == "tiny" and start["device"] == "cpu"
    assert {"world_size", "effective_batch", "micro_batch", "backward_chunks"} <= set(start["config"])
    assert not [k for k, v in start.items() if isinstance(v, (int, float)) and k not in ("step", "ts")]
    assert isinstance(start["ts"], float)
