"""The daemon babysits real trainer processes: completion, kill -9 re-adoption, retries, abort, GPU guards."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from tests.scenarios.conftest import Daemon, babysit, pid_alive, store_of, tiny_run
from tests.support import register, wait_for


def channel(root: Path) -> list[dict]:
    path = root / ".babysit" / "channel.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_daemon_babysits_a_run_to_completion_and_posts_its_story(workspace: Path) -> None:
    register(workspace, tiny_run(workspace, "tiny_ok", steps=120))
    daemon = Daemon(workspace, "--exit-when-idle")
    assert daemon.wait(timeout=120) == 0, daemon.output()
    store = store_of(workspace)
    (attempt,) = store.attempts("tiny_ok")
    assert attempt.outcome == "completed" and attempt.exit_code == 0
    assert store.run_state("tiny_ok")[0] == "finished"
    kinds = [m["kind"] for m in channel(workspace)]
    assert kinds[0] == "launch" and "ended" in kinds
    assert store.pending_count() == 0
    assert store.gpu_seconds("tiny_ok", time.time()) == 0.0  # a CPU run costs no GPU-hours


def test_daemon_killed_with_sigkill_mid_run_is_readopted_without_a_second_launch(workspace: Path) -> None:
    register(workspace, tiny_run(workspace, "tiny_adopt", steps=400))
    first = Daemon(workspace)
    store = store_of(workspace)
    wait_for("the run to make progress", lambda: (store.run_state("tiny_adopt")[1].get("step") or 0) >= 20, 90)
    (attempt,) = store.attempts("tiny_adopt")
    first.kill9()
    assert pid_alive(attempt.pid), "the run must outlive its daemon"
    second = Daemon(workspace, "--exit-when-idle")
    assert second.wait(timeout=180) == 0, second.output()
    attempts = store.attempts("tiny_adopt")
    assert len(attempts) == 1 and attempts[0].outcome == "completed"
    log = workspace / "outputs" / "tiny_adopt" / "train_log.jsonl"
    starts = [line for line in log.read_text().splitlines() if '"event": "start"' in line]
    assert len(starts) == 1, "the trainer was launched once"
    launches = [m for m in store.messages("tiny_adopt") if m.kind == "launch"]
    assert len(launches) == 1, "the launch was posted once"
    assert not pid_alive(attempt.pid)


def test_a_second_daemon_on_the_same_state_refuses(workspace: Path) -> None:
    register(workspace, tiny_run(workspace, "tiny_lock", steps=300))
    first = Daemon(workspace)
    store = store_of(workspace)
    wait_for("the launch", lambda: store.attempts("tiny_lock"), 60)
    res = babysit("up", "--accelerated", "--registry", str(workspace / "babysit.toml"), cwd=workspace, timeout=30)
    assert res.returncode == 1
    assert "already runs" in res.stderr
    first.kill9()
    (attempt,) = store.attempts("tiny_lock")
    os.killpg(attempt.pid, 9)


def test_divergence_is_classified_and_retried_with_the_next_profile(workspace: Path) -> None:
    attempts = """
[retry]
max_attempts = 3
on = ["diverged"]

[[attempts]]
profile = "hot"
args = ["--inject-nan-at-step", "30"]

[[attempts]]
profile = "cool"
args = ["--lr-scale", "0.5"]
"""
    register(workspace, tiny_run(workspace, "tiny_retry", steps=80, attempts=attempts))
    daemon = Daemon(workspace, "--exit-when-idle")
    assert daemon.wait(timeout=150) == 0, daemon.output()
    store = store_of(workspace)
    first, second = store.attempts("tiny_retry")
    assert (first.profile, first.outcome, first.exit_code) == ("hot", "diverged", 11)
    assert (second.profile, second.outcome) == ("cool", "completed")
    assert "--lr-scale" in second.argv and "--inject-nan-at-step" not in second.argv
    kinds = [i.kind for i in store.incidents("tiny_retry")]
    assert "diverged" in kinds and "retrying" in kinds
    assert store.run_state("tiny_retry")[0] == "finished"


def test_abort_stops_the_run_gracefully_and_nothing_retries(workspace: Path) -> None:
    register(workspace, tiny_run(workspace, "tiny_abort", steps=5000,
                                 extra='[retry]\non = ["oom", "diverged", "crashed"]'))
    daemon = Daemon(workspace, "--exit-when-idle")
    store = store_of(workspace)
    wait_for("progress", lambda: (store.run_state("tiny_abort")[1].get("step") or 0) >= 10, 90)
    res = babysit("abort", "tiny_abort", "--registry", str(workspace / "babysit.toml"), cwd=workspace)
    assert res.returncode == 0 and "stopping" in res.stdout, res.stdout + res.stderr
    assert daemon.wait(timeout=90) == 0, daemon.output()
    (attempt,) = store.attempts("tiny_abort")
    assert attempt.outcome == "stopped"
    assert attempt.exit_code == 10, "the trainer checkpointed and exited with its stopped-on-request code"
    assert store.run_state("tiny_abort")[0] == "stopped"
    assert (workspace / "outputs" / "tiny_abort" / "checkpoints").exists()


def gpu_file(path: Path, processes: list[dict]) -> None:
    path.write_text(json.dumps({"gpus": [{"index": 0, "name": "Simulated H200", "uuid": "GPU-sim-0",
                                          "util_pct": 95, "memory_used_bytes": 2**30,
                                          "memory_total_bytes": 141 * 2**30, "processes": processes,
                                          "faults": []}]}))


def test_a_gpu_held_by_a_foreign_process_refuses_the_launch(workspace: Path) -> None:
    gpus = workspace / "gpus.json"
    gpu_file(gpus, [{"pid": 1, "name": "policy-server", "used_memory_bytes": 40 * 2**30}])
    register(workspace, tiny_run(workspace, "tiny_held", gpus="[0]", steps=50))
    daemon = Daemon(workspace, "--exit-when-idle", env={"BABYSIT_GPU_PROBE": f"file:{gpus}"})
    assert daemon.wait(timeout=60) == 0, daemon.output()
    store = store_of(workspace)
    assert store.attempts("tiny_held") == []
    assert store.run_state("tiny_held")[0] == "refused"
    (incident,) = [i for i in store.incidents("tiny_held") if i.kind == "gpu-held"]
    assert "policy-server" in json.dumps(incident.body)


def test_a_foreign_process_taking_the_gpu_mid_run_stops_the_run(workspace: Path) -> None:
    gpus = workspace / "gpus.json"
    gpu_file(gpus, [])
    register(workspace, tiny_run(workspace, "tiny_guard", gpus="[0]", steps=5000))
    daemon = Daemon(workspace, "--exit-when-idle", env={"BABYSIT_GPU_PROBE": f"file:{gpus}"})
    store = store_of(workspace)
    wait_for("progress", lambda: (store.run_state("tiny_guard")[1].get("step") or 0) >= 10, 90)
    gpu_file(gpus, [{"pid": 424242, "name": "intruder", "used_memory_bytes": 2**30}])
    assert daemon.wait(timeout=90) == 0, daemon.output()
    (attempt,) = store.attempts("tiny_guard")
    assert attempt.outcome == "stopped" and attempt.exit_code == 10
    assert store.run_state("tiny_guard")[0] == "stopped"
    assert any(i.kind == "gpu-held" for i in store.incidents("tiny_guard"))
    assert attempt.gpu_seconds(time.time()) > 0


TINY_PREREG = """
[prereg]
metric = "eval_chunk_mae"
baseline_step = 50
read_step = 100
[[prereg.bands]]
label = "HEALTHY"
max = 0.05
"""


def test_an_edited_prereg_is_reported_once_and_never_read(workspace: Path) -> None:
    spec = tiny_run(workspace, "tiny_tamper", steps=100, extra=TINY_PREREG)
    register(workspace, spec)
    spec.write_text(spec.read_text().replace("max = 0.05", "max = 0.5"))  # edited after registration
    daemon = Daemon(workspace, "--exit-when-idle")
    assert daemon.wait(timeout=120) == 0, daemon.output()
    verdict = babysit("verdict", "tiny_tamper", "--registry", str(workspace / "babysit.toml"), cwd=workspace)
    assert verdict.returncode == 1 and "edited after registration" in verdict.stderr
    store = store_of(workspace)
    tampered = [i for i in store.incidents("tiny_tamper") if i.kind == "prereg-tampered"]
    assert len(tampered) == 1, "recorded once, whether the daemon or `babysit verdict` saw it first"
    assert [m.kind for m in store.messages("tiny_tamper")].count("incident") >= 1
    assert store.final_verdict("tiny_tamper") is None, "no verdict is read from an edited prereg"
    assert store.run_state("tiny_tamper")[0] == "finished"  # the run itself is still babysat
