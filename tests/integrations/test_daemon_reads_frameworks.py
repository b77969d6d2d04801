"""End to end: the real daemon babysits real framework runs through what each framework writes anyway.

- a Hugging Face `Trainer` with no babysit code, read from its own TensorBoard event files
  (`report_to=["tensorboard"]`; `[source] kind = "tensorboard"`);
- a Lightning `Trainer` with no babysit code, read from its own `metrics.csv` (`CSVLogger`;
  `[source] kind = "csv"`, `step_offset = 1` for Lightning's `global_step - 1`);
- a Lightning `Trainer` with `BabysitLogger`, whose first profile diverges and is retried.

Every trainer is quiet (no progress bar, no printer) and logs every 100 steps, paced to every 24 s
(tests/integrations/pace.py): its source grows in bursts further apart than half the stall limit, and nothing
else grows in between. Each run must end completed without a stall (or a log-unreadable alarm), its FINAL
verdict must be exactly the values the framework logged, and babysit's s/step within 20 % of the framework's
own timing. The stall limit, 40 s under --accelerated, stays above the silent start of a trainer on two busy
cores (importing torch and transformers took up to ~20 s before the first byte of output).
"""

from __future__ import annotations

import csv
import json
import os
import sys
from decimal import ROUND_HALF_EVEN, Decimal
from pathlib import Path
from typing import Any

import pytest

from babysit.db.store import Store
from tests.integrations.pace import read_times, seconds_per_step
from tests.scenarios.conftest import Daemon, babysit, kill_runs, store_of
from tests.support import TRAIN_LOG, register, run_toml

REPO = Path(__file__).resolve().parents[2]
PY = sys.executable
STALL_MINUTES = 40  # 40 s under --accelerated
EVERY = 100  # steps between two logs (and evals)
BEAT = 0.24  # seconds a step: a log every 24 s, more than half the stall limit
STEPS = 300
PACED = ["--max-steps", str(STEPS), "--every", str(EVERY), "--step-seconds", str(BEAT),
         "--times", "outputs/{name}/times-{attempt}.txt"]

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def register_paced(root: Path, name: str, command: list[str], *, metric: str, precision: int, **tables: Any) -> None:
    """A paced framework run whose verdict reads `metric` between its first and last log."""
    register(root, run_toml(
        name, command, run={"total_steps": STEPS}, env={"PYTHONPATH": str(REPO)}, poll=(1, 2), **tables,
        guards={"min_free_host_ram_gib": 0.1, "stop_grace_seconds": 20, "stall_minutes": STALL_MINUTES},
        prereg={"question": f"Does {metric} fall between steps {EVERY} and {STEPS}?", "metric": metric,
                "baseline_step": EVERY, "read_step": STEPS, "precision": precision,
                "bands": [{"label": "LOWER", "max": 0}], "otherwise": {"label": "NOT-LOWER"}}), env=ENV)


ENV = {k: v for k, v in os.environ.items() if k not in ("BABYSIT_LOG", "RANK")}


def run_daemon(root: Path) -> Store:
    daemon = Daemon(root, "--exit-when-idle", "--no-view", env=ENV)
    assert daemon.wait(timeout=540) == 0, daemon.output()
    return store_of(root)


def assert_completed_without_false_alarms(store: Store, name: str) -> Any:
    attempt = store.attempts(name)[-1]
    assert (attempt.outcome, attempt.exit_code) == ("completed", 0), attempt.detail
    alarms = [(i.kind, i.body) for i in store.incidents(name) if i.kind in ("stalled", "log-unreadable")]
    assert not alarms, alarms
    assert store.run_state(name)[0] == "finished"
    return attempt


def assert_verdict(root: Path, name: str, baseline: float, read: float, precision: int) -> dict[str, Any]:
    """The FINAL verdict reads `baseline` and `read` exactly (docs/verdicts.md: the exact delta, then rounded)."""
    verdict = json.loads((root / ".babysit" / "verdicts" / f"{name}.json").read_text())
    assert (verdict["status"], verdict["at_step"]) == ("FINAL", STEPS), verdict
    exact = Decimal(repr(read)) - Decimal(repr(baseline))
    quantum = Decimal(1).scaleb(-precision)
    assert Decimal(str(verdict["delta"])) == exact.quantize(quantum, rounding=ROUND_HALF_EVEN), (verdict, exact)
    assert Decimal(str(verdict["baseline"])) == Decimal(repr(baseline)).quantize(quantum, rounding=ROUND_HALF_EVEN)
    assert verdict["label"] == ("LOWER" if exact <= 0 else "NOT-LOWER")
    return verdict


def assert_pace_and_bursts(root: Path, store: Store, name: str, attempt: int, framework_sps: float) -> None:
    """babysit's s/step — every poll that had one, and `babysit status` — within 20 % of the framework's;
    and the premise: babysit saw the run quiet for more than half the stall limit, and did not stop it."""
    polls = [p.snapshot for p in store.polls(name, 500) if p.attempt == attempt]
    paced = [p.seconds_per_step for p in polls if p.seconds_per_step]
    assert paced, [p.step for p in polls]
    status = babysit("status", name, "--json", "--registry", str(root / "babysit.toml"), cwd=root, env=ENV)
    assert status.returncode == 0, status.stderr
    for sps in [*paced, json.loads(status.stdout)["seconds_per_step"]]:
        assert abs(sps / framework_sps - 1) <= 0.2, (sps, framework_sps, paced)
    assert any(p.eta_seconds is not None and p.target_step == STEPS for p in polls)
    quiet = [p.seconds_since_last_record for p in polls if p.seconds_since_last_record is not None]
    assert max(quiet) > STALL_MINUTES / 2, quiet  # real seconds (1 s a declared minute): babysit's view of the gaps
    times = read_times(root / "outputs" / name / f"times-{attempt}.txt")
    gaps = [times[s + EVERY] - times[s] for s in range(EVERY, STEPS, EVERY)]
    assert min(gaps) > STALL_MINUTES / 2, gaps  # the trainer's own: every burst came later than stall/2


def test_hf_trainer_read_from_its_tensorboard_events_unchanged(tmp_path: Path) -> None:
    pytest.importorskip("transformers", reason="transformers is not installed (pip install '.[huggingface]')")
    pytest.importorskip("tensorboard", reason="tensorboard is not installed (pip install '.[tensorboard]')")
    name = "hf_tb"
    command = [PY, "-m", "tests.integrations.hf_plain", "--out", "outputs/{name}/hf", *PACED,
               "--history", "outputs/{name}/history.json"]
    # HF writes its event files to <output_dir>/runs/<date>_<host>/, tags "train/loss", "eval/loss", …
    source = {"kind": "tensorboard", "path": "outputs/{name}/hf/runs",
              "metrics": {"train/loss": "train_loss", "eval/loss": "eval_loss"}}
    try:
        register_paced(tmp_path, name, command, source=source, metric="eval_loss", precision=6)
        store = run_daemon(tmp_path)
        attempt = assert_completed_without_false_alarms(store, name)

        history = json.loads((tmp_path / "outputs" / name / "history.json").read_text())
        evals = {h["step"]: h["eval_loss"] for h in history if "eval_loss" in h}
        assert sorted(evals) == [100, 200, 300]
        # TensorBoard keeps a scalar as a float32: the value HF logged, to the float32 HF computed it in
        import numpy

        def f32(x: float) -> float:
            return float(str(numpy.float32(x)))

        verdict = assert_verdict(tmp_path, name, f32(evals[100]), f32(evals[300]), precision=6)
        assert abs(verdict["delta"] - (evals[300] - evals[100])) < 2e-6
        (summary,) = [h for h in history if "train_runtime" in h]
        assert_pace_and_bursts(tmp_path, store, name, attempt.n, summary["train_runtime"] / summary["step"])
    finally:
        kill_runs(tmp_path)


def test_lightning_read_from_its_metrics_csv_unchanged(tmp_path: Path) -> None:
    pytest.importorskip("lightning", reason="lightning is not installed (pip install '.[lightning]')")
    name = "pl_csv"
    command = [PY, "-m", "tests.integrations.lightning_plain", "--logger", "csv", "--out", "outputs/{name}/pl",
               "--lr", "0.005", *PACED, "--logged", "outputs/{name}/logged.json"]
    # step_offset: Lightning logs global_step - 1, the validation after 100 steps is its row 99
    source = {"kind": "csv", "path": "outputs/{name}/pl/metrics.csv", "step_offset": 1}
    try:
        register_paced(tmp_path, name, command, source=source, metric="val_loss", precision=8)
        store = run_daemon(tmp_path)
        attempt = assert_completed_without_false_alarms(store, name)

        logged = json.loads((tmp_path / "outputs" / name / "logged.json").read_text())
        val = {step: value for metric, step, value in logged if metric == "val_loss"}  # the module's own values
        assert sorted(val) == [100, 200, 300]
        with open(tmp_path / "outputs" / name / "pl" / "metrics.csv") as f:
            rows = {int(r["step"]): float(r["val_loss"]) for r in csv.DictReader(f) if r["val_loss"]}
        assert rows == {99: val[100], 199: val[200], 299: val[300]}  # what babysit read, one step early
        assert_verdict(tmp_path, name, val[100], val[300], precision=8)
        framework = seconds_per_step(read_times(tmp_path / "outputs" / name / f"times-{attempt.n}.txt"))
        assert_pace_and_bursts(tmp_path, store, name, attempt.n, framework)
    finally:
        kill_runs(tmp_path)


def test_lightning_with_babysit_logger_diverges_retries_and_reads_its_own_values(tmp_path: Path) -> None:
    pytest.importorskip("lightning", reason="lightning is not installed (pip install '.[lightning]')")
    name = "pl_logger"
    command = [PY, "-m", "tests.integrations.lightning_plain", "--logger", "babysit", "--out", "outputs/{name}/pl",
               "--lr", "0.005", *PACED, "--logged", "outputs/{name}/logged-{attempt}.json"]
    # hot: NaN from step 3, seen at the first log (step 5)
    attempts = {"hot": ["--nan-at", "3", "--every", "5"], "cool": []}
    try:
        register_paced(tmp_path, name, command, log=TRAIN_LOG, retry={"max_attempts": 2, "on": ["diverged"]},
                       attempts=attempts, metric="val_loss", precision=8)
        store = run_daemon(tmp_path)
        first, second = store.attempts(name)
        # diverged either way: the logger's exit 11, or babysit's live guard stopping it first on the NaN record
        assert (first.profile, first.outcome) == ("hot", "diverged"), first.detail
        assert second.profile == "cool"
        assert_completed_without_false_alarms(store, name)

        logged = json.loads((tmp_path / "outputs" / name / "logged-2.json").read_text())
        val = {step: value for metric, step, value in logged if metric == "val_loss"}
        assert sorted(val) == [100, 200, 300]
        assert_verdict(tmp_path, name, val[100], val[300], precision=8)
        framework = seconds_per_step(read_times(tmp_path / "outputs" / name / "times-2.txt"))
        assert_pace_and_bursts(tmp_path, store, name, 2, framework)
    finally:
        kill_runs(tmp_path)
