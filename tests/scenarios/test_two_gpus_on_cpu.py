"""Issue 30's three two-GPU scenarios on CPU: a real daemon, real torchrun with gloo, the reference
trainer; only the two GPUs are simulated (the GPU file, BABYSIT_GPU_PROBE=file:…, plays NVML).

- DDP on both GPUs: polls show both; a foreign process on GPU 1 stops the run gracefully (both ranks
  checkpoint-and-stop, no process of the run left), and the relaunch resumes from the checkpoint.
- A run declared `gpus = "any 1"` with GPU 0 quarantined by `babysit gpu quarantine 0` launches on GPU 1;
  an Xid 79 on GPU 1 mid-run quarantines it and the gpu-fault retry lands on GPU 0 (released by then).
- A SIGSTOP of rank 1 of a two-rank gloo job: the stall incident carries every rank's stack and names
  rank 1; rank 0's flight record is asked for through the dump pipe and read.

The same scenarios on real GPUs (NCCL): tests/gpu/test_two_gpus.py.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from babysit.executors.local import LocalExecutor
from babysit.run.stackdump import STOPPED_MARK
from tests.scenarios.conftest import Daemon, babysit, pid_alive, store_of, tiny_run
from tests.scenarios.test_graceful_stop import (  # noqa: F401 (needs_torchrun: a fixture)
    TORCHRUN,
    needs_torchrun,
    patient,
    progressed,
    records,
    stopped_by,
    tree_of,
)
from tests.support import TRAIN_LOG, register, run_toml, wait_for

HANG = Path(__file__).parents[1] / "fixtures" / "nccl" / "gloo_hang.py"

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("needs_torchrun")]


def two_gpus(path: Path) -> Path:
    path.write_text(json.dumps({"gpus": [{"index": i, "name": "Simulated H200", "uuid": f"GPU-sim-{i}",
                                          "util_pct": 95 - i, "memory_used_bytes": 2**30,
                                          "memory_total_bytes": 141 * 2**30, "processes": [], "faults": []}
                                         for i in (0, 1)]}))
    return path


def edit_gpu(path: Path, index: int, **fields: object) -> None:
    data = json.loads(path.read_text())
    data["gpus"][index].update(fields)
    path.write_text(json.dumps(data))


def probe_env(gpus: Path) -> dict[str, str]:
    return {"BABYSIT_GPU_PROBE": f"file:{gpus}"}


def cli(root: Path, gpus: Path, *args: str) -> subprocess.CompletedProcess:
    return babysit(*args, "--registry", str(root / "babysit.toml"), cwd=root, env=probe_env(gpus))


def launch_env(pid: int) -> dict[str, str]:
    """The environment the attempt's shim was started with (what its trainer inherits)."""
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    return dict(item.split("=", 1) for item in raw.decode(errors="replace").split("\0") if "=" in item)


def launched_gpus(root: Path, run: str) -> list[list[int]]:
    return [m.payload["gpus"] for m in store_of(root).messages(run) if m.kind == "launch"]


def torchrun_spec(root: Path, name: str, steps: int) -> Path:
    """The reference trainer's tiny recipe under torchrun, 2 gloo ranks, declared on GPUs 0 and 1."""
    spec = patient(tiny_run(root, name, steps=steps, gpus="[0, 1]", args=("--save-every", "0", "--eval-every", "0")))
    text = spec.read_text()
    # torchrun's own parser would take `--log` for an abbreviation of its `--log-dir`
    spec.write_text(text.replace(json.dumps([sys.executable, "-m", "trainer"])[:-1],
                                 json.dumps([*TORCHRUN, "-m", "trainer"])[:-1]).replace('"--log", ', '"--log-path", '))
    assert "torch.distributed.run" in spec.read_text()
    return spec


def test_ddp_on_two_gpus_polls_both_stops_on_a_foreign_process_on_gpu_1_and_resumes(workspace: Path) -> None:
    name = "ddp2"
    gpus = two_gpus(workspace / "gpus.json")
    spec = torchrun_spec(workspace, name, 100_000)
    register(workspace, spec)
    daemon = Daemon(workspace, "--exit-when-idle", env=probe_env(gpus))
    store = store_of(workspace)
    intruder = subprocess.Popen(["sleep", "300"])  # a live process that is not the run's
    try:
        progressed(workspace, name, 5)
        wait_for("a poll", lambda: store.polls(name), 60)
        (running,) = store.attempts(name)
        tree = tree_of(running.pid)
        assert len(tree) >= 4, "the shim, torchrun's agent and two ranks"
        assert launch_env(running.pid)["CUDA_VISIBLE_DEVICES"] == "0,1"
        edit_gpu(gpus, 1, processes=[{"pid": intruder.pid, "name": "intruder", "used_memory_bytes": 2**31}])
        assert daemon.wait(timeout=120) == 0, daemon.output()
    finally:
        intruder.kill()
        intruder.wait()
        for attempt in store.attempts(name):
            LocalExecutor().kill(attempt)
    polled = [[(g.index, g.util_pct) for g in p.snapshot.gpus] for p in store.polls(name)]
    assert polled and all(seen == [(0, 95.0), (1, 94.0)] for seen in polled), polled
    (held,) = [i for i in store.incidents(name) if i.kind == "gpu-held"]
    assert str(intruder.pid) in json.dumps(held.body), held.body
    (attempt,) = store.attempts(name)
    stderr = (Path(attempt.attempt_dir) / "stderr.log").read_text()
    assert stderr.count("babysit-trainer: stopped on SIGTERM") == 2, "both ranks stopped at the same step"
    assert attempt.outcome == "stopped" and stopped_by(workspace, name) == "gpu-held"
    assert attempt.exit_code == 1 and attempt.detail["clean_stop"]["clean"] is True, attempt.detail
    log = workspace / "outputs" / name / "train_log.jsonl"
    (stopped,) = [r for r in records(log) if r.get("event") == "stopped"]
    assert (workspace / "outputs" / name / "checkpoints" / f"step_{stopped['step']:06d}.pt").exists()
    left = [p for p in tree if pid_alive(p)]
    assert not left, f"left behind: {[psutil.Process(p).cmdline() for p in left]}"

    # the intruder is gone; the run is relaunched from its checkpoint and runs 3 more steps to its end
    edit_gpu(gpus, 1, processes=[])
    spec.write_text(spec.read_text().replace('"--steps", "100000"', f'"--steps", "{stopped["step"] + 3}"'))
    res = cli(workspace, gpus, "relaunch", name, "--accelerated", "--resume", "--wait", "0")
    assert res.returncode == 0, res.stdout + res.stderr
    daemon = Daemon(workspace, "--exit-when-idle", env=probe_env(gpus))
    try:
        assert daemon.wait(timeout=150) == 0, daemon.output()
    finally:
        for attempt in store.attempts(name):
            LocalExecutor().kill(attempt)
    _, second = store.attempts(name)
    assert second.outcome == "completed" and "--resume" in second.argv, second.detail
    assert store.run_state(name)[0] == "finished"
    start = [r for r in records(log) if r.get("event") == "start"][-1]
    assert start["config"]["resumed_from_step"] == stopped["step"] and start["config"]["world_size"] == 2
    after = records(log)[records(log).index(start) + 1:]
    assert next(r["step"] for r in after if "train_loss" in r) == stopped["step"] + 1
    assert launched_gpus(workspace, name) == [[0, 1], [0, 1]]


def test_any_1_of_two_gpus_avoids_the_quarantined_one_and_its_gpu_fault_retry_lands_on_the_other(
        workspace: Path) -> None:
    name = "any1"
    gpus = two_gpus(workspace / "gpus.json")
    # attempt 1 runs until the fault stops it; the retry (profile 2) ends at step 200, or at once from a later step
    retry = ('[retry]\non = ["gpu-fault"]\nresume = "latest-checkpoint"\n'
             '[[attempts]]\nprofile = "long"\nargs = []\n[[attempts]]\nprofile = "to-200"\nargs = ["--steps", "200"]\n')
    spec = patient(tiny_run(workspace, name, steps=100_000, gpus='"any 1"', attempts=retry,
                            args=("--save-every", "0", "--eval-every", "0")))
    register(workspace, spec)
    got = cli(workspace, gpus, "gpu", "quarantine", "0", "--reason", "by the test")
    assert got.returncode == 0 and got.stdout.startswith("GPU GPU-sim-0 (index 0) quarantined"), got.stdout + got.stderr
    daemon = Daemon(workspace, "--exit-when-idle", env=probe_env(gpus))
    store = store_of(workspace)
    try:
        progressed(workspace, name, 3)
        (first,) = store.attempts(name)
        assert launch_env(first.pid)["CUDA_VISIBLE_DEVICES"] == "1", "launched on the healthy GPU"
        assert first.detail["gpus"] == [1]
        released = cli(workspace, gpus, "gpu", "release", "0")
        assert released.returncode == 0, released.stdout + released.stderr
        edit_gpu(gpus, 1, faults=["xid 79"])  # GPU 1 falls off the bus mid-run
        wait_for("the retry to launch", lambda: len(store.attempts(name)) == 2 and store.attempts(name)[1].pid, 90)
        second = store.attempts(name)[1]
        try:
            assert launch_env(second.pid)["CUDA_VISIBLE_DEVICES"] == "0", "the retry runs on the other GPU"
        except FileNotFoundError:
            pass  # it already ended: its launch message below says where it ran
        assert daemon.wait(timeout=150) == 0, daemon.output()
    finally:
        for attempt in store.attempts(name):
            LocalExecutor().kill(attempt)
    first, second = store.attempts(name)
    assert first.outcome == "gpu-fault", first.detail
    (ev,) = first.detail["gpu_evidence"]
    assert (ev["gpu"], ev["uuid"], ev["xid"], ev["side"]) == (1, "GPU-sim-1", 79, "machine")
    assert list(store.quarantined_gpus()) == ["GPU-sim-1"], "GPU 1 quarantined; GPU 0 was released"
    assert second.outcome == "completed" and "--resume" in second.argv, second.detail
    assert launched_gpus(workspace, name) == [[1], [0]]
    log = workspace / "outputs" / name / "train_log.jsonl"
    (stopped,) = [r for r in records(log) if r.get("event") == "stopped"]
    start = [r for r in records(log) if r.get("event") == "start"][-1]
    assert start["config"]["resumed_from_step"] == stopped["step"], "the retry resumed from the fault's stop"
    assert store.run_state(name)[0] == "finished"


def test_a_sigstopped_rank_of_two_is_named_with_every_ranks_stack_in_the_stall_incident(workspace: Path) -> None:
    name = "stopped_rank"
    gpus = two_gpus(workspace / "gpus.json")
    register(workspace, run_toml(name, [*TORCHRUN, str(HANG)], log=TRAIN_LOG, gpus=[0, 1], poll=(1, 3),
                                 env={"SKIP_STEP": "1000000000", "OMP_NUM_THREADS": "1"},
                                 guards={"min_free_host_ram_gib": 0.1, "stop_grace_seconds": 5, "stall_minutes": 30}))
    daemon = Daemon(workspace, "--exit-when-idle", env=probe_env(gpus))
    store = store_of(workspace)
    try:
        progressed(workspace, name, 3)
        (running,) = store.attempts(name)
        tree = tree_of(running.pid)
        ranks = {int(launch_env(p).get("RANK", -1)): p for p in tree if "RANK" in launch_env(p)}
        assert sorted(ranks) == [0, 1], ranks
        os.kill(ranks[1], signal.SIGSTOP)
        assert daemon.wait(timeout=150) == 0, daemon.output()
    finally:
        for attempt in store.attempts(name):
            LocalExecutor().kill(attempt)
    (stall,) = [i for i in store.incidents(name) if i.kind == "stalled"]
    detail = stall.body.get("detail", stall.body)
    stacks, hang = detail["stacks"], detail["collective"]
    assert "note" not in stacks, stacks["note"]
    assert {str(ranks[0]), str(ranks[1])} <= set(stacks), "every rank's stack"
    assert stacks[str(ranks[1])].startswith(STOPPED_MARK), stacks[str(ranks[1])]
    assert "all_reduce (" in stacks[str(ranks[0])], "rank 0 waits in the all-reduce"
    assert (hang["stopped_ranks"], hang["missing_ranks"], hang["verdict"]) == ([1], [1], "stopped"), hang
    assert hang["summary"].startswith("rank 1 is stopped (process state T: SIGSTOP or a debugger)")
    assert hang["records"] == [0] and hang["no_record"] == [1], "rank 0 answered the dump pipe; rank 1 cannot"
    adir = Path(store.attempts(name)[0].attempt_dir)
    assert (adir / "nccl_trace_rank_0").stat().st_size > 0 and not (adir / "nccl_trace_rank_1").exists()
    assert "rank 1 is stopped" in json.dumps([m.payload for m in store.messages(name) if m.kind == "incident"])
    (attempt,) = store.attempts(name)
    assert attempt.outcome == "stalled", attempt.detail
    assert not [p for p in tree if pid_alive(p)], "the stopped rank died with its run"
