"""SIGTERM mid-run: finish the step, checkpoint, `stopped` record, exit 10; resume is bit-for-bit."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.trainer.conftest import REPO, read_log, train_losses, trainer_env

STEPS = "200"  # the stop lands at about step 40; a resume is bit-for-bit over any length after it


def _wait_for_step(log: Path, step: int, proc: subprocess.Popen, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, "trainer ended before it could be signalled"
        if log.exists():
            # complete lines only: a read racing an append that crosses a page boundary sees part of a line
            for line in log.read_text().split("\n")[:-1]:
                if line.strip() and json.loads(line).get("step", 0) >= step and "train_loss" in line:
                    return
        time.sleep(0.02)
    raise AssertionError(f"no train record for step {step} within {timeout} s")


def test_sigterm_checkpoints_exits_10_and_resume_reproduces_the_uninterrupted_run(
        run_trainer, data_cache: Path, tmp_path: Path) -> None:
    ref_log = tmp_path / "ref.jsonl"
    reference = run_trainer("--recipe", "tiny", "--steps", STEPS, "--log", str(ref_log),
                            "--checkpoints", str(tmp_path / "ref_ck"))
    assert reference.returncode == 0, reference.stderr

    log, ck = tmp_path / "log.jsonl", tmp_path / "ck"
    flags = ["--recipe", "tiny", "--steps", STEPS, "--save-every", "0", "--log", str(log), "--checkpoints", str(ck)]
    proc = subprocess.Popen([sys.executable, "-m", "trainer", *flags], cwd=REPO, env=trainer_env(data_cache),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _wait_for_step(log, 40, proc)
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 10, stderr

    stopped = read_log(log)[-1]
    assert stopped["event"] == "stopped" and stopped["reason"] == "SIGTERM"
    stop_step = stopped["step"]
    assert 40 <= stop_step < int(STEPS)
    assert (ck / "latest").read_text().strip() == f"step_{stop_step:06d}.pt"
    assert (ck / f"step_{stop_step:06d}.pt").exists()

    resumed = run_trainer(*flags, "--resume", "latest")
    assert resumed.returncode == 0, resumed.stderr
    records = read_log(log)
    after = [r for r in records[records.index(stopped):] if "train_loss" in r]
    assert after[0]["step"] == stop_step + 1
    expected = train_losses(read_log(ref_log))
    assert {r["step"]: r["train_loss"] for r in after} == {s: v for s, v in expected.items() if s > stop_step}
    before = {r["step"]: r["train_loss"] for r in records[: records.index(stopped)] if "train_loss" in r}
    assert before == {s: v for s, v in expected.items() if s <= stop_step}
