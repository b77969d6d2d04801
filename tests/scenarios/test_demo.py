"""`babysit demo`, the README's command 1, run to its end once a session, and the tests that read what it
leaves: its own story (verdict, amendment, retry, campaign), and the drift recipe's curve, which is its
drift_disc run's (a second 1,000-step drift run of the trainer tests' own cost ~60 CPU-s and 4-5 minutes
of a worker). One file, so the curve's tests run after the demo on the worker that ran it, not blocked
on another's."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import once_per_session, shared_dir
from tests.scenarios.conftest import babysit, kill_runs
from tests.trainer.conftest import eval_curve, read_log


@pytest.fixture(scope="session")
def demo_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The demo run once a session, whichever xdist worker asks first: {"ws", "returncode", "stdout",
    "stderr"}."""

    def run() -> dict[str, Any]:
        root = shared_dir(tmp_path_factory, "demo")
        try:
            res = babysit("demo", "--dir", str(root / "ws"), cwd=root, timeout=800)
        finally:  # a demo cut short leaves its trainers running (runs outlive daemons): not in a test
            kill_runs(root / "ws")
        return {"ws": str(root / "ws"), "returncode": res.returncode, "stdout": res.stdout, "stderr": res.stderr}

    return once_per_session(tmp_path_factory, "demo-run", run)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_demo_babysits_to_a_final_verdict(demo_run: dict) -> None:
    ws = Path(demo_run["ws"])
    assert demo_run["returncode"] == 0, demo_run["stdout"][-3000:] + demo_run["stderr"][-3000:]
    out = demo_run["stdout"]
    verdict = json.loads((ws / ".babysit" / "verdicts" / "drift_disc.json").read_text())
    assert verdict["status"] == "FINAL" and verdict["read_step"] == 1000
    assert verdict["label"] == "AMBIGUOUS-BY-INSTRUMENT"  # the raw rule says SAME-DRIFT, the ×2.5 one AMBIGUOUS
    assert [r["label"] for r in verdict["rules"]] == ["SAME-DRIFT", "AMBIGUOUS"]
    (amendment,) = verdict["amendments"]
    assert 250 <= amendment["data_seen_through_step"] < 500, "declared before the data it touches"
    assert (ws / ".babysit" / "verdicts" / "drift_disc.png").stat().st_size > 10_000
    for text in ("diverged", "retrying", "FINAL", "amendment 1 recorded"):
        assert text in out
    # `babysit run -- CMD` once, with no run.toml written by hand: its preset said, exit 0
    assert 'nanogpt_run: its printed lines match preset "nanogpt"' in out
    assert "babysit run: nanogpt_run finished: completed after 1 attempt(s) (exit 0" in out
    # the campaign's ending tells the truth: drift_aug's HEALTHY is read against drift_disc, whose
    # instrument disagrees with itself, so nothing is convicted, banked or proposed on it (issue 25)
    show = out[out.index("$ babysit campaign show drift_saga"):]
    assert "⏸ outcome SUSPENDED: parent drift_disc read FINAL AMBIGUOUS-BY-INSTRUMENT" in show
    assert "🔴 no-augment   live" in show and "convicted  " not in show
    assert "conclusion SUSPENDED" in out and "CONVICTED.” does not stand" in out
    assert not (ws / "runs" / "banked").exists() and not (ws / "runs" / "proposals").exists()


@pytest.fixture(scope="session")
def drift_curve(demo_run: dict[str, Any]) -> dict[int, tuple[float, float]]:
    """The drift recipe's full 1,000-step curve, as `babysit demo` trained it: its drift_disc run is
    `python -m trainer --recipe drift` (plus `--save-every 500`, which changes no value: its evals are the
    ones trainer/recipes/drift.toml documents), one thread, run once a session for the
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
@pytest.mark.timeout(900)  # may wait for the demo another worker runs
def test_drift_evaluates_at_the_quarter_steps(drift_curve: dict[int, tuple[float, float]]) -> None:
    assert {250, 500, 750, 1000} <= drift_curve.keys()


@pytest.mark.slow
@pytest.mark.timeout(900)  # may wait for the demo another worker runs
def test_drift_eval_error_reaches_its_minimum_then_climbs_after_step_500(
        drift_curve: dict[int, tuple[float, float]]) -> None:
    eval_mae = {step: pair[0] for step, pair in drift_curve.items()}
    best_step = min(eval_mae, key=eval_mae.__getitem__)
    assert 150 <= best_step <= 600, eval_mae
    assert eval_mae[1000] - eval_mae[500] > 0.01, eval_mae
    assert eval_mae[750] > eval_mae[500], eval_mae


@pytest.mark.slow
@pytest.mark.timeout(900)  # may wait for the demo another worker runs
def test_drift_train_error_keeps_falling_while_eval_climbs(drift_curve: dict[int, tuple[float, float]]) -> None:
    train_mae = {step: pair[1] for step, pair in drift_curve.items()}
    assert train_mae[1000] < train_mae[750] < train_mae[500] < train_mae[250]
