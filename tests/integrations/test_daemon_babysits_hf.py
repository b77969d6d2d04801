"""End to end: the real daemon babysits a real Hugging Face `Trainer` that has only the callback added.

The first profile's loss goes NaN: the attempt must end classified `diverged` (exit 11), be retried with the
next profile, which completes, and the FINAL verdict must read exactly the eval losses HF itself logged.
"""

from __future__ import annotations

import json
import os
import sys
from decimal import ROUND_HALF_EVEN, Decimal
from pathlib import Path

import pytest

from tests.conftest import missing
from tests.scenarios.conftest import Daemon, kill_runs, store_of
from tests.support import TRAIN_LOG, register, run_toml

pytestmark = pytest.mark.skipif(missing("transformers", "accelerate"),
                                reason="HF Trainer needs transformers and accelerate (pip install '.[huggingface]')")

REPO = Path(__file__).resolve().parents[2]


COMMAND = [sys.executable, "-m", "tests.integrations.hf_tiny", "--out", "outputs/{name}/hf",
           "--history", "outputs/{name}/history-{attempt}.json"]
SPEC = run_toml(  # stall_minutes: 240 s accelerated; importing transformers on two busy cores takes a while
    "hf_tiny", COMMAND, log=TRAIN_LOG, env={"PYTHONPATH": str(REPO)}, poll=(1, 30),
    guards={"min_free_host_ram_gib": 0.1, "stop_grace_seconds": 20, "stall_minutes": 240},
    retry={"max_attempts": 2, "on": ["diverged"]}, attempts={"hot": ["--nan-at", "12"], "cool": ["--max-steps", "30"]},
    prereg={"question": "Does the eval loss fall between steps 10 and 30?", "metric": "eval_loss", "baseline_step": 10,
            "read_step": 30, "bands": [{"label": "LOWER", "max": 0}], "otherwise": {"label": "NOT-LOWER"}})


@pytest.mark.slow
def test_daemon_classifies_a_nan_hf_run_diverged_retries_it_and_reads_hfs_own_evals(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("BABYSIT_LOG", "RANK")}
    try:
        register(tmp_path, SPEC, env=env)
        daemon = Daemon(tmp_path, "--exit-when-idle", env=env)
        assert daemon.wait(timeout=500) == 0, daemon.output()
        store = store_of(tmp_path)
        first, second = store.attempts("hf_tiny")
        # the callback (exit 11) and the daemon's live guard (a graceful SIGTERM) see the same NaN grad norm
        # at the same log: whichever acts first ends it, diverged either way, and it names the metric
        assert (first.profile, first.outcome) == ("hot", "diverged"), first.detail
        assert first.exit_code == 11 or first.exit_signal == 15, first.detail
        assert str(first.detail.get("nonfinite", "")).startswith("grad_norm = nan"), first.detail
        assert (second.profile, second.outcome, second.exit_code) == ("cool", "completed", 0), second.detail
        assert store.run_state("hf_tiny")[0] == "finished"

        history = json.loads((tmp_path / "outputs" / "hf_tiny" / "history-2.json").read_text())
        evals = {h["step"]: h["eval_loss"] for h in history if "eval_loss" in h}
        verdict = json.loads((tmp_path / ".babysit" / "verdicts" / "hf_tiny.json").read_text())
        assert verdict["status"] == "FINAL" and verdict["at_step"] == 30
        exact = Decimal(repr(evals[30])) - Decimal(repr(evals[10]))  # docs/verdicts.md: exact, then rounded
        assert Decimal(str(verdict["delta"])) == exact.quantize(Decimal("0.0001"), rounding=ROUND_HALF_EVEN)
        assert verdict["label"] == ("LOWER" if exact <= 0 else "NOT-LOWER")
    finally:
        kill_runs(tmp_path)
