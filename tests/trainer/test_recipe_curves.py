"""The bundled recipes behave as named, on their real curves (fixed seeds, nothing scripted)."""

from __future__ import annotations

import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import once_per_session
from tests.trainer.conftest import REPO, eval_curve, read_log, train_losses, trainer_env


@pytest.mark.slow  # 300 steps of the healthy recipe: a CPU-minute on 2 shared cores
def test_healthy_loss_falls_and_eval_error_goes_down(run_trainer, tmp_path: Path) -> None:
    log = tmp_path / "log.jsonl"
    result = run_trainer("--recipe", "healthy", "--steps", "300", "--eval-every", "100", "--log-every", "5",
                         "--log", str(log), "--checkpoints", str(tmp_path / "ck"))
    assert result.returncode == 0, result.stderr
    records = read_log(log)
    losses = list(train_losses(records).values())
    assert statistics.mean(losses[-10:]) < 0.7 * statistics.mean(losses[:4])
    curve = eval_curve(records)
    assert curve[300][0] < curve[100][0]
    assert {"eval/reach_v1", "eval/push_v2", "eval/rig_demos"} <= set(records[-2])


@pytest.fixture(scope="session")
def drift_curve(tmp_path_factory: pytest.TempPathFactory, data_cache: Path) -> dict[int, tuple[float, float]]:
    """One full 1,000-step drift run shared by the drift assertions (once per session, whichever xdist
    worker asks first: a module fixture would run it again on every worker holding one of them)."""

    def run() -> list[list[float]]:
        out = tmp_path_factory.mktemp("drift")
        result = subprocess.run([sys.executable, "-m", "trainer", "--recipe", "drift", "--log",
                                 str(out / "log.jsonl"), "--checkpoints", str(out / "ck")], cwd=REPO,
                                env=trainer_env(data_cache), capture_output=True, text=True, timeout=280)
        assert result.returncode == 0, result.stderr
        return [[step, *pair] for step, pair in eval_curve(read_log(out / "log.jsonl")).items()]

    return {int(step): (ev, tr) for step, ev, tr in once_per_session(tmp_path_factory, "drift-curve", run)}


@pytest.mark.slow
def test_drift_evaluates_at_the_quarter_steps(drift_curve: dict[int, tuple[float, float]]) -> None:
    assert {250, 500, 750, 1000} <= drift_curve.keys()


@pytest.mark.slow
def test_drift_eval_error_reaches_its_minimum_then_climbs_after_step_500(
        drift_curve: dict[int, tuple[float, float]]) -> None:
    eval_mae = {step: pair[0] for step, pair in drift_curve.items()}
    best_step = min(eval_mae, key=eval_mae.__getitem__)
    assert 150 <= best_step <= 600, eval_mae
    assert eval_mae[1000] - eval_mae[500] > 0.01, eval_mae
    assert eval_mae[750] > eval_mae[500], eval_mae


@pytest.mark.slow
def test_drift_train_error_keeps_falling_while_eval_climbs(drift_curve: dict[int, tuple[float, float]]) -> None:
    train_mae = {step: pair[1] for step, pair in drift_curve.items()}
    assert train_mae[1000] < train_mae[750] < train_mae[500] < train_mae[250]
