"""The daemon's GPU paths on a real NVIDIA GPU (run on the GPU machine: `pytest -m gpu tests/gpu -s`).

Real NVML, real CUDA processes: a foreign process blocks a launch and stops a live run, torchrun's
workers are the run's own, a real CUDA OOM is classified and retried with the fallback profile.
Each test prints one `H200:` line for bench/README.md (section 14).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

from tests.gpu.cuda import foreign, require_cuda
from tests.scenarios.conftest import Daemon, store_of, tiny_run
from tests.support import TRAIN_LOG, register, run_toml, wait_for

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module", autouse=True)
def cuda() -> None:
    require_cuda()



def test_foreign_cuda_process_blocks_the_launch(tmp_path: Path) -> None:
    holder = foreign()
    try:
        register(tmp_path, tiny_run(tmp_path, "gpu_blocked", gpus="[0]", args=("--device", "cuda"), steps=50))
        daemon = Daemon(tmp_path, "--exit-when-idle")
        assert daemon.wait(timeout=120) == 0, daemon.output()
    finally:
        holder.kill()
    store = store_of(tmp_path)
    assert store.attempts("gpu_blocked") == []
    (incident,) = [i for i in store.incidents("gpu_blocked") if i.kind == "gpu-held"]
    assert str(holder.pid) in json.dumps(incident.body)
    print(f"\nH200: launch refused while pid {holder.pid} held GPU 0: {incident.body}")


def test_foreign_cuda_process_stops_a_live_run(tmp_path: Path) -> None:
    register(tmp_path, tiny_run(tmp_path, "gpu_live", gpus="[0]", args=("--device", "cuda"), steps=200000))
    daemon = Daemon(tmp_path, "--exit-when-idle")
    store = store_of(tmp_path)
    wait_for("GPU progress", lambda: (store.run_state("gpu_live")[1].get("step") or 0) >= 50, 180)
    holder = foreign(seconds=60)
    started = time.time()  # the holder has its CUDA context and memory now: NVML can see it
    try:
        wait_for("the guard to fire", lambda: store.run_state("gpu_live")[0] in ("stopping", "stopped"), 60)
        fired = time.time() - started
        assert daemon.wait(timeout=120) == 0, daemon.output()
    finally:
        holder.kill()
    import os
    import shutil
    if os.environ.get("OUT"):
        shutil.copy(tmp_path / ".babysit" / "daemon.log", Path(os.environ["OUT"]) / "gpu_live_daemon.log")
    (attempt,) = store.attempts("gpu_live")
    assert attempt.outcome == "stopped" and attempt.exit_code == 10
    (incident,) = [i for i in store.incidents("gpu_live") if i.kind == "gpu-held"]
    assert str(holder.pid) in json.dumps(incident.body)
    print(f"\nH200: foreign pid {holder.pid} holding GPU memory → stop begun after {fired:.2f} s "
          f"(guard interval 0.5 s accelerated); run exited {attempt.exit_code} (checkpointed)")


def test_torchrun_workers_are_the_runs_own(tmp_path: Path) -> None:
    import torch

    ranks = torch.cuda.device_count()  # one rank a GPU: every worker is the run's own on its GPU
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(ranks), "-m", "trainer",
           "--recipe", "tiny", "--device", "cuda", "--steps", "600", "--log-path", "outputs/gpu_ddp/train_log.jsonl",
           "--checkpoints", "outputs/gpu_ddp/checkpoints"]
    register(tmp_path, run_toml("gpu_ddp", cmd, log=TRAIN_LOG, gpus=range(ranks), poll=(1, 2),
                                guards={"min_free_host_ram_gib": 0.1}))
    daemon = Daemon(tmp_path, "--exit-when-idle")
    assert daemon.wait(timeout=300) == 0, daemon.output()
    store = store_of(tmp_path)
    (attempt,) = store.attempts("gpu_ddp")
    assert attempt.outcome == "completed", attempt.detail
    assert not [i for i in store.incidents("gpu_ddp") if i.kind == "gpu-held"]
    polls = store.polls("gpu_ddp", 50)
    utils = [g.util_pct for p in polls for g in p.snapshot.measured]
    print(f"\nH200: {ranks} torchrun worker(s) on GPUs {list(range(ranks))} counted as the run's own; "
          f"{len(polls)} polls, util readings {utils}")


def test_real_cuda_oom_is_classified_and_retried_with_the_fallback(tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "trainer", "--recipe", "gpu", "--steps", "5", "--eval-every", "0",
           "--save-every", "0", "--log", "outputs/gpu_oom/train_log.jsonl", "--checkpoints",
           "outputs/gpu_oom/checkpoints"]
    # stall_minutes: 600 s accelerated; a fresh machine builds the data cache before step 1
    register(tmp_path, run_toml("gpu_oom", cmd, log=TRAIN_LOG, gpus=[0], poll=(1, 5),
                                guards={"min_free_host_ram_gib": 1, "stall_minutes": 600},
                                retry={"max_attempts": 2, "on": ["oom"]},
                                attempts={"micro-1024": ["--backward-chunks", "1"],
                                          "fallback-gc": ["--batch-size", "64", "--backward-chunks", "4",
                                                          "--grad-checkpointing"]}))
    daemon = Daemon(tmp_path, "--exit-when-idle")
    assert daemon.wait(timeout=540) == 0, daemon.output()
    store = store_of(tmp_path)
    attempts = store.attempts("gpu_oom")
    assert len(attempts) == 2, [(a.profile, a.outcome, a.exit_code, a.detail) for a in attempts]
    first, second = attempts
    assert first.outcome == "oom", first.detail
    assert (first.detail.get("failed_alloc_bytes") or 0) > 0
    assert second.outcome == "completed", second.detail
    print(f"\nH200: attempt 1 ({first.profile}) → {first.detail.get('summary')}; "
          f"attempt 2 ({second.profile}) → {second.outcome}")
