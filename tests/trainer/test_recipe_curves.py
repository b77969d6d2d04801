"""The bundled recipes behave as named, on their real curves (fixed seeds, nothing scripted)."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

import pytest

from tests.trainer.conftest import eval_curve, read_log, train_losses


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
def drift_curve(demo_run: dict[str, Any]) -> dict[int, tuple[float, float]]:
    """The drift recipe's full 1,000-step curve, as `babysit demo` trained it: its drift_disc run is
    `python -m trainer --recipe drift` (plus `--save-every 500`, which changes no value: its evals are the
    ones trainer/recipes/drift.toml documents), one thread, run once a session (tests/conftest.py) for the
    demo's test and these; a second run of its own cost ~60 CPU-s. Its start record must say so: the plain
    recipe, from step 0, one attempt, to its end."""
    log = Path(demo_run["ws"]) / "outputs" / "drift_disc" / "train_log.jsonl"
    assert log.exists(), demo_run["stdout"][-3000:] + demo_run["stderr"][-3000:]
    records = read_log(log)
    starts = [r for r in records if r.get("event") == "start"]
    assert len(starts) == 1 and starts[0]["recipe"] == "drift", starts
    config = starts[0]["config"]
    assert (config["steps"], config["seed"], config["image_augment"], config["resumed_from_step"],
            config["world_size"]) == (1000, 0, 0.0, None, 1), config
    assert records[-1].get("event") == "completed", records[-1]
    return eval_curve(records)


@pytest.mark.slow
@pytest.mark.timeout(900)  # may wait for the demo another worker runs (tests/conftest.py)
def test_drift_evaluates_at_the_quarter_steps(drift_curve: dict[int, tuple[float, float]]) -> None:
    assert {250, 500, 750, 1000} <= drift_curve.keys()


@pytest.mark.slow
@pytest.mark.timeout(900)  # may wait for the demo another worker runs (tests/conftest.py)
def test_drift_eval_error_reaches_its_minimum_then_climbs_after_step_500(
        drift_curve: dict[int, tuple[float, float]]) -> None:
    eval_mae = {step: pair[0] for step, pair in drift_curve.items()}
    best_step = min(eval_mae, key=eval_mae.__getitem__)
    assert 150 <= best_step <= 600, eval_mae
    assert eval_mae[1000] - eval_mae[500] > 0.01, eval_mae
    assert eval_mae[750] > eval_mae[500], eval_mae


@pytest.mark.slow
@pytest.mark.timeout(900)  # may wait for the demo another worker runs (tests/conftest.py)
def test_drift_train_error_keeps_falling_while_eval_climbs(drift_curve: dict[int, tuple[float, float]]) -> None:
    train_mae = {step: pair[1] for step, pair in drift_curve.items()}
    assert train_mae[1000] < train_mae[750] < train_mae[500] < train_mae[250]
