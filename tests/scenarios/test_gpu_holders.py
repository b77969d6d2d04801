"""Who holds the run's GPU, under a real daemon: the run's own exiting processes are never foreign.

NVML lists a process until its CUDA context is gone, which lags its exit: an OOM'd trainer is still
listed while it is a zombie, and while the retry starts. The simulated GPU file plays NVML here;
`nvml_trainer.py` lists its own pid (and its children's) in it and leaves them listed after exiting.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from tests.scenarios.conftest import Daemon, store_of
from tests.support import TRAIN_LOG, register, run_toml, wait_for

TRAINER = Path(__file__).with_name("nvml_trainer.py")


def gpu_file(path: Path, processes: list[dict] | None = None) -> Path:
    path.write_text(json.dumps({"gpus": [{"index": 0, "name": "Simulated H200", "util_pct": 95,
                                          "memory_used_bytes": 2**30, "memory_total_bytes": 141 * 2**30,
                                          "processes": processes or [], "faults": []}]}))
    return path


def register_run(root: Path, name: str, gpus: Path, attempts: list[list[str]]) -> None:
    (root / "outputs" / name).mkdir(parents=True, exist_ok=True)
    register(root, run_toml(name, [sys.executable, str(TRAINER), f"outputs/{name}/train_log.jsonl", str(gpus)],
                            log=TRAIN_LOG, gpus=[0], retry={"on": ["oom"]},
                            guards={"exclusive_gpu": True, "min_free_host_ram_gib": 0.1, "stop_grace_seconds": 10},
                            attempts={f"p{i + 1}": a for i, a in enumerate(attempts)}))


def run_to_the_end(root: Path, gpus: Path) -> None:
    daemon = Daemon(root, "--exit-when-idle", env={"BABYSIT_GPU_PROBE": f"file:{gpus}"})
    assert daemon.wait(timeout=120) == 0, daemon.output()


def test_an_oomed_attempt_still_listed_by_nvml_is_retried_not_taken_for_a_holder(workspace: Path) -> None:
    gpus = gpu_file(workspace / "gpus.json")
    register_run(workspace, "oom_listed", gpus, [["--exit", "12", "--steps", "20"], ["--steps", "20"]])
    run_to_the_end(workspace, gpus)
    store = store_of(workspace)
    first, second = store.attempts("oom_listed")
    assert first.outcome == "oom" and "stopped_by" not in first.detail
    assert second.outcome == "completed", second
    assert store.run_state("oom_listed")[0] == "finished"
    assert not [i for i in store.incidents("oom_listed") if i.kind == "gpu-held"]
    still_listed = [p["pid"] for p in json.loads(gpus.read_text())["gpus"][0]["processes"]]
    assert first.detail.get("summary") and len(still_listed) == 2, "both trainers stay listed, as NVML lags"


def test_an_exiting_zombie_and_a_reaped_child_of_the_run_are_not_foreign(workspace: Path) -> None:
    gpus = gpu_file(workspace / "gpus.json")
    register_run(workspace, "children", gpus, [["--zombie", "--gone", "--steps", "60"]])
    run_to_the_end(workspace, gpus)
    store = store_of(workspace)
    (attempt,) = store.attempts("children")
    assert attempt.outcome == "completed", attempt
    assert not [i for i in store.incidents("children") if i.kind == "gpu-held"]


def test_an_oom_while_being_stopped_keeps_its_class_and_its_retry(workspace: Path) -> None:
    """A trainer that dies of its own failure while babysit stops it died of that failure (retry.on)."""
    gpus = gpu_file(workspace / "gpus.json")
    register_run(workspace, "oom_on_stop", gpus,
                 [["--steps", "100000", "--on-term-exit", "12", "--on-term-clear"], ["--steps", "20"]])
    daemon = Daemon(workspace, "--exit-when-idle", env={"BABYSIT_GPU_PROBE": f"file:{gpus}"})
    store = store_of(workspace)
    wait_for("progress", lambda: (store.run_state("oom_on_stop")[1].get("step") or 0) >= 5, 60)
    # an intruder (pid 1 stands in: it is alive and not the run's) takes the GPU mid-run
    data = json.loads(gpus.read_text())
    data["gpus"][0]["processes"].append({"pid": 1, "name": "intruder", "used_memory_bytes": 2**30})
    gpus.write_text(json.dumps(data))
    assert daemon.wait(timeout=120) == 0, daemon.output()
    first, second = store.attempts("oom_on_stop")
    assert any(i.kind == "gpu-held" for i in store.incidents("oom_on_stop"))
    assert first.outcome == "oom" and "stopped_by" not in first.detail, first.detail
    assert second.outcome == "completed"
    assert store.run_state("oom_on_stop")[0] == "finished"
