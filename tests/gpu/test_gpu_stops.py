"""Graceful stops of the `gpu` recipe (8 DataLoader workers, bf16) on a real GPU, and OOM retries that
never see a false foreign holder. Run on the GPU machine: `pytest -m gpu tests/gpu/test_gpu_stops.py -s`.

Each stop — `babysit abort`, a foreign CUDA process, the GPU-hour cap — must reach the trainer's main
process alone (its workers keep feeding it until it has checkpointed), end with exit 10 and a
checkpoint, and the checkpoint must resume. Each test prints one `H200:` line for bench/README.md (section 14).
BABYSIT_OOM_TRIALS sets how many OOM→fallback trials run (default 10).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.gpu.cuda import foreign, require_cuda
from tests.scenarios.conftest import Daemon, babysit, store_of
from tests.support import TRAIN_LOG, register, run_toml, wait_for

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module", autouse=True)
def cuda() -> None:
    require_cuda()


def gpu_run(root: Path, name: str, *, steps: int = 100000, args: tuple[str, ...] = (),
            guards: dict[str, float] | None = None, **tables: Any) -> Path:
    cmd = [sys.executable, "-m", "trainer", "--recipe", "gpu", "--steps", str(steps), "--eval-every", "0",
           "--save-every", "0", "--log", f"outputs/{name}/train_log.jsonl", "--checkpoints",
           f"outputs/{name}/checkpoints", *args]
    return register(root, run_toml(name, cmd, log=TRAIN_LOG, gpus=[0], poll=(1, 5), **tables, guards={
        "min_free_host_ram_gib": 1, "stall_minutes": 600, "stop_grace_seconds": 120, **(guards or {})}))


def checkpoint_step(root: Path, name: str) -> int:
    import torch

    files = sorted((root / "outputs" / name / "checkpoints").rglob("*.pt"))
    assert files, f"no checkpoint written under outputs/{name}/checkpoints"
    state = torch.load(files[-1], map_location="cpu", weights_only=False)
    return int(state.get("step", -1))


def resumes(root: Path, name: str, at: int) -> int:
    """Run 3 more steps from the checkpoint; the first logged step must follow it."""
    log = root / "outputs" / name / "resume_log.jsonl"
    subprocess.run([sys.executable, "-m", "trainer", "--recipe", "gpu", "--steps", str(at + 3), "--eval-every", "0",
                    "--save-every", "0", "--log-every", "1", "--log", str(log), "--checkpoints",
                    str(root / "outputs" / name / "checkpoints"), "--resume", "latest"],
                   cwd=root, check=True, timeout=300, capture_output=True)
    records = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    start = next(r for r in records if "config" in r)
    assert start["config"]["resumed_from_step"] == at
    return next(r["step"] for r in records if "train_loss" in r)


def stopped_with_checkpoint(root: Path, name: str, cause: str, t0: float) -> None:
    store = store_of(root)
    (attempt,) = store.attempts(name)
    assert attempt.outcome == "stopped", attempt.detail
    assert attempt.exit_code == 10, f"{attempt.exit_code}: {attempt.detail.get('summary')}"
    assert "killed by signal" not in (attempt.detail.get("stderr_tail") or "")
    elapsed = time.time() - t0  # from the stop's cause to the daemon's exit (checkpoint written)
    step = checkpoint_step(root, name)
    first = resumes(root, name, step)
    assert first == step + 1, (step, first)
    print(f"\nH200: gpu recipe (8 workers) stopped by {cause}: exit 10, {elapsed:.1f} s from the cause to the "
          f"daemon's exit, checkpoint at step {step}, resumed at step {first}")


def test_abort_checkpoints_the_gpu_recipe_with_its_workers(tmp_path: Path) -> None:
    gpu_run(tmp_path, "stop_abort")
    daemon = Daemon(tmp_path, "--exit-when-idle")
    store = store_of(tmp_path)
    wait_for("GPU progress", lambda: (store.run_state("stop_abort")[1].get("step") or 0) >= 30, 300)
    t0 = time.time()
    res = babysit("abort", "stop_abort", "--registry", str(tmp_path / "babysit.toml"), cwd=tmp_path)
    assert res.returncode == 0, res.stdout + res.stderr
    assert daemon.wait(timeout=300) == 0, daemon.output()
    stopped_with_checkpoint(tmp_path, "stop_abort", "babysit abort", t0)


def test_a_foreign_process_stop_checkpoints(tmp_path: Path) -> None:
    gpu_run(tmp_path, "stop_foreign")
    daemon = Daemon(tmp_path, "--exit-when-idle")
    store = store_of(tmp_path)
    wait_for("GPU progress", lambda: (store.run_state("stop_foreign")[1].get("step") or 0) >= 30, 300)
    holder = foreign(2, 120)
    t0 = time.time()
    try:
        assert daemon.wait(timeout=300) == 0, daemon.output()
    finally:
        holder.kill()
    assert any(i.kind == "gpu-held" for i in store.incidents("stop_foreign"))
    stopped_with_checkpoint(tmp_path, "stop_foreign", f"a foreign CUDA process (pid {holder.pid})", t0)


def test_the_gpu_hour_cap_stop_checkpoints(tmp_path: Path) -> None:
    gpu_run(tmp_path, "stop_cap", guards={"gpu_hours_cap": 0.01})  # 36 GPU-seconds
    t0 = time.time()
    daemon = Daemon(tmp_path, "--exit-when-idle")
    assert daemon.wait(timeout=400) == 0, daemon.output()
    store = store_of(tmp_path)
    assert any(i.kind == "gpu-hours-cap" for i in store.incidents("stop_cap"))
    stopped_with_checkpoint(tmp_path, "stop_cap", "the GPU-hour cap (0.01)", t0)


def test_oom_then_fallback_never_sees_a_false_foreign_holder(tmp_path: Path) -> None:
    trials = int(os.environ.get("BABYSIT_OOM_TRIALS", "10"))
    retry = {"max_attempts": 2, "on": ["oom"]}
    attempts = {"micro-1024": ["--backward-chunks", "1"],
                "fallback-gc": ["--batch-size", "64", "--backward-chunks", "4", "--grad-checkpointing"]}
    results = []
    for trial in range(trials):
        root = tmp_path / f"t{trial}"
        root.mkdir()
        name = f"oom_{trial}"
        gpu_run(root, name, steps=5, retry=retry, attempts=attempts)
        t0 = time.time()
        daemon = Daemon(root, "--exit-when-idle")
        assert daemon.wait(timeout=300) == 0, daemon.output()
        store = store_of(root)
        outcomes = [(a.profile, a.outcome) for a in store.attempts(name)]
        held = [i.body for i in store.incidents(name) if i.kind == "gpu-held"]
        results.append((outcomes, len(held), round(time.time() - t0, 1)))
        assert not held, (trial, held)
        assert outcomes == [("micro-1024", "oom"), ("fallback-gc", "completed")], (trial, outcomes)
    print(f"\nH200: {trials} OOM→fallback trials, 0 false gpu-held: {results}")
