"""The bundled recipes behave as named, on their real curves (fixed seeds, nothing scripted). The drift
recipe's curve is read from the demo's drift_disc run: tests/scenarios/test_demo.py."""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest

from tests.trainer.conftest import eval_curve, read_log, train_losses


@pytest.mark.slow  # 200 steps of the healthy recipe: ~7 CPU-s, 15-25 s on 2 shared cores
def test_healthy_loss_falls_and_eval_error_goes_down(run_trainer, tmp_path: Path) -> None:
    log = tmp_path / "log.jsonl"
    result = run_trainer("--recipe", "healthy", "--steps", "200", "--eval-every", "100", "--log-every", "5",
                         "--log", str(log), "--checkpoints", str(tmp_path / "ck"))
    assert result.returncode == 0, result.stderr
    records = read_log(log)
    losses = list(train_losses(records).values())
    assert statistics.mean(losses[-10:]) < 0.7 * statistics.mean(losses[:4])
    curve = eval_curve(records)
    assert curve[200][0] < curve[100][0]
    assert {"eval/reach_v1", "eval/push_v2", "eval/rig_demos"} <= set(records[-2])
