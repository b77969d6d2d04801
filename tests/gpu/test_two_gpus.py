"""Issue 30 on real GPUs: DDP across two H200s babysat end to end, a retry on the healthy GPU, a hung rank.

On the two-GPU machine (nvidia-h200-x2): `python3 -m pytest -m gpu tests/gpu/test_two_gpus.py -s`.
On one GPU only the one-GPU variants run (the others skip, saying they need two devices):
`python3 -m pytest -m gpu tests/gpu/test_two_gpus.py -s -k one_gpu`.
NVLink multicast stays off (NCCL_NVLS_ENABLE=0, in the runs' env and this process's). Each test prints
`H200:` lines for bench/README.md (section 13). The same scenarios on CPU (gloo, simulated GPUs):
tests/scenarios/test_two_gpus_on_cpu.py.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from babysit.executors.local import LocalExecutor
from babysit.run.stackdump import STOPPED_MARK
from tests.gpu.cuda import foreign, require_gpus
from tests.scenarios.conftest import Daemon, babysit, pid_alive, store_of
from tests.support import TRAIN_LOG, register, run_toml, wait_for

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(900)]  # a first run builds the gpu recipe's data cache
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
LOOP = Path(__file__).with_name("collective_loop.py")
RUN_ENV = {"NCCL_NVLS_ENABLE": "0", "OMP_NUM_THREADS": "4"}


@pytest.fixture(autouse=True)
def nvls_off(monkeypatch: pytest.MonkeyPatch) -> None:
    """The device's rule: NVLink multicast off, for the daemon and every run it starts (and run.toml says so)."""
    monkeypatch.setenv("NCCL_NVLS_ENABLE", "0")


def cli(root: Path, *args: str) -> tuple[int, str]:
    res = babysit(*args, "--registry", str(root / "babysit.toml"), cwd=root, timeout=120)
    return res.returncode, res.stdout + res.stderr


def gpu_run(name: str, command: list[str], *, env: dict[str, str] = RUN_ENV, **spec: Any) -> str:
    """A run.toml on these GPUs: the reference trainer's log, NVLink multicast off in its environment."""
    return run_toml(name, command, log=TRAIN_LOG, env=env, **spec)


def trainer_cmd(name: str, ranks: int, steps: int, *extra: str) -> list[str]:
    return [*TORCHRUN, "--nproc-per-node", str(ranks), "-m", "trainer", "--recipe", "gpu", "--steps", str(steps),
            "--eval-every", "0", "--save-every", "0", "--num-workers", "6", "--log-path", f"outputs/{name}/train_log.jsonl",
            "--checkpoints", f"outputs/{name}/checkpoints", *extra]


def records(log: Path) -> list[dict]:
    return [json.loads(line) for line in log.read_text().splitlines() if line.strip()]


def tree(pid: int) -> set[int]:
    try:
        return {pid, *(p.pid for p in psutil.Process(pid).children(recursive=True))}
    except psutil.NoSuchProcess:
        return set()


def environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().decode(errors="replace")
    return dict(item.split("=", 1) for item in raw.split("\0") if "=" in item)


def step_of(root: Path, name: str) -> int:
    return int(store_of(root).run_state(name)[1].get("step") or 0)


def kill_all(root: Path, name: str) -> None:
    for attempt in store_of(root).attempts(name):
        LocalExecutor().kill(attempt)


# -- (a) DDP on both GPUs: utilization in the polls, a foreign process on the last GPU, the resume -------


@pytest.mark.parametrize("ngpus", [pytest.param(2, id="two_gpus"), pytest.param(1, id="one_gpu")])
def test_ddp_polls_every_gpu_busy_stops_on_a_foreign_cuda_process_and_resumes(tmp_path: Path, ngpus: int) -> None:
    require_gpus(ngpus)
    name, last = f"ddp{ngpus}", ngpus - 1

    def ddp(steps: int) -> str:
        return gpu_run(name, trainer_cmd(name, ngpus, steps), gpus=range(ngpus), poll=(10, 10),
                       guards={"min_free_host_ram_gib": 1, "stall_minutes": 600, "stop_grace_seconds": 120})

    spec = register(tmp_path, ddp(100000))
    daemon = Daemon(tmp_path, "--exit-when-idle")
    store = store_of(tmp_path)
    holder = None
    try:
        wait_for("GPU progress", lambda: step_of(tmp_path, name) >= 30, 400)
        wait_for("a poll in training", lambda: [p for p in store.polls(name) if (p.snapshot.step or 0) >= 30], 60)
        polls = [p.snapshot for p in store.polls(name) if (p.snapshot.step or 0) >= 30]
        (running,) = store.attempts(name)
        before = tree(running.pid)
        holder = foreign(2, 300, gpu=last)
        t0 = time.time()
        assert daemon.wait(timeout=400) == 0, daemon.output()
        stop_s = time.time() - t0
    finally:
        if holder is not None:
            holder.kill()
        kill_all(tmp_path, name)
    util = {g.index: g.util_pct for g in polls[0].gpus}
    assert sorted(util) == list(range(ngpus)) and all(u is not None and u >= 90 for u in util.values()), polls
    assert any(i.kind == "gpu-held" and str(holder.pid) in json.dumps(i.body) for i in store.incidents(name))
    (attempt,) = store.attempts(name)
    stderr = (Path(attempt.attempt_dir) / "stderr.log").read_text()
    assert stderr.count("babysit-trainer: stopped on SIGTERM") == ngpus, stderr[-3000:]
    assert attempt.outcome == "stopped" and attempt.detail["clean_stop"]["clean"] is True, attempt.detail
    log = tmp_path / "outputs" / name / "train_log.jsonl"
    (stopped,) = [r for r in records(log) if r.get("event") == "stopped"]
    assert not [p for p in before if pid_alive(p)], "a rank or a worker outlived the run"

    spec.write_text(ddp(stopped["step"] + 3))
    code, out = cli(tmp_path, "relaunch", name, "--accelerated", "--resume", "--wait", "0")
    assert code == 0, out
    daemon = Daemon(tmp_path, "--exit-when-idle")
    try:
        assert daemon.wait(timeout=400) == 0, daemon.output()
    finally:
        kill_all(tmp_path, name)
    second = store.attempts(name)[-1]
    assert second.outcome == "completed", second.detail
    start = [r for r in records(log) if r.get("event") == "start"][-1]
    assert start["config"]["resumed_from_step"] == stopped["step"] and start["config"]["world_size"] == ngpus
    print(f"\nH200: gpu recipe, {ngpus} rank(s) under torchrun (NCCL): poll util {util} at step "
          f"{polls[0].step}; a foreign CUDA process on GPU {last} (pid {holder.pid}) → gpu-held, every rank "
          f"stopped on SIGTERM, {stop_s:.1f} s to the daemon's exit, checkpoint at step {stopped['step']}, "
          f"the relaunch resumed at {stopped['step'] + 1} and completed")


# -- (b) one GPU of two, GPU 0 quarantined: the retry lands on GPU 1 --------------------------------------


def test_two_gpus_a_retry_of_an_any_1_run_avoids_the_quarantined_gpu_0_and_completes_on_gpu_1(tmp_path: Path) -> None:
    """A real machine fault cannot be made on purpose: GPU 0 is quarantined by the command while attempt 1
    runs on it (and dies of a real CUDA OOM, micro-batch 1024 > 139 GiB); the retry must avoid GPU 0."""
    require_gpus(2)
    name = "any1"
    cmd = [sys.executable, "-m", "trainer", "--recipe", "gpu", "--eval-every", "0", "--save-every", "0",
           "--num-workers", "6", "--log-path", f"outputs/{name}/train_log.jsonl", "--checkpoints",
           f"outputs/{name}/checkpoints"]
    register(tmp_path, gpu_run(name, cmd, run={"gpus": "any 1"}, retry={"max_attempts": 2, "on": ["oom"]},
                               guards={"min_free_host_ram_gib": 1, "stall_minutes": 600, "stop_grace_seconds": 120},
                               attempts={"micro-1024": ["--steps", "20", "--backward-chunks", "1"],
                                         "fits": ["--steps", "20"]}))
    daemon = Daemon(tmp_path, "--exit-when-idle")
    store = store_of(tmp_path)
    try:
        wait_for("attempt 1 to launch", lambda: store.attempts(name) and store.attempts(name)[0].pid, 120)
        code, out = cli(tmp_path, "gpu", "quarantine", "0", "--reason", "issue 30: GPU 0 taken out by hand")
        assert code == 0 and "(index 0) quarantined" in out, out
        quarantined_at = time.time()
        assert daemon.wait(timeout=600) == 0, daemon.output()
    finally:
        kill_all(tmp_path, name)
    first, second = store.attempts(name)
    launched = [m.payload["gpus"] for m in store.messages(name) if m.kind == "launch"]
    assert first.outcome == "oom" and (first.ended_at or 0) > quarantined_at, "the quarantine came first"
    assert launched == [[0], [1]] and second.detail["gpus"] == [1], launched
    assert second.outcome == "completed", second.detail
    code, out = cli(tmp_path, "gpu", "list")
    assert "GPU 0 " in out and "issue 30" in out, out
    print(f"\nH200: gpus = \"any 1\", GPU 0 quarantined by `babysit gpu quarantine 0` while attempt 1 ran there: "
          f"attempt 1 {first.outcome} on GPU 0, attempt 2 launched on GPU {second.detail['gpus'][0]} and "
          f"{second.outcome}")


# -- (c) a SIGSTOP'd rank: every rank's stack, the flight records, the rank named --------------------------


@pytest.mark.parametrize(("ngpus", "backend"), [pytest.param(2, "nccl", id="two_gpus_nccl"),
                                                pytest.param(1, "gloo", id="one_gpu_gloo")])
def test_a_sigstopped_rank_is_named_with_every_ranks_stack_and_the_flight_records(
        tmp_path: Path, ngpus: int, backend: str) -> None:
    require_gpus(ngpus)
    name = f"hung_{backend}"
    register(tmp_path, gpu_run(name, [*TORCHRUN, "--nproc-per-node", "2", str(LOOP)], gpus=range(ngpus),
                               env={"NCCL_NVLS_ENABLE": "0", "OMP_NUM_THREADS": "1", "BACKEND": backend},
                               guards={"exclusive_gpu": False, "min_free_host_ram_gib": 1, "stall_minutes": 30,
                                       "stop_grace_seconds": 10}))
    daemon = Daemon(tmp_path, "--exit-when-idle")
    store = store_of(tmp_path)
    try:
        wait_for("the collective loop to run", lambda: step_of(tmp_path, name) >= 5, 300)
        (running,) = store.attempts(name)
        ranks = {int(environ(p)["RANK"]): p for p in tree(running.pid) if "RANK" in environ(p)}
        assert sorted(ranks) == [0, 1], ranks
        os.kill(ranks[1], signal.SIGSTOP)
        t0 = time.time()
        assert daemon.wait(timeout=300) == 0, daemon.output()
        took = time.time() - t0
    finally:
        kill_all(tmp_path, name)
    (stall,) = [i for i in store.incidents(name) if i.kind == "stalled"]
    detail = stall.body.get("detail", stall.body)
    stacks, hang = detail["stacks"], detail["collective"]
    assert {str(ranks[0]), str(ranks[1])} <= set(stacks) and "note" not in stacks, stacks.get("note")
    assert stacks[str(ranks[1])].startswith(STOPPED_MARK)
    assert (hang["stopped_ranks"], hang["missing_ranks"], hang["verdict"]) == ([1], [1], "stopped"), hang
    adir = Path(store.attempts(name)[0].attempt_dir)
    assert hang["records"] == [0] and (adir / "nccl_trace_rank_0").stat().st_size > 0, hang
    assert not [p for p in ranks.values() if pid_alive(p)]
    print(f"\nH200: 2 ranks ({backend}) on {ngpus} GPU(s), rank 1 SIGSTOPped: stall incident {took:.1f} s later "
          f"(stall_minutes 30 accelerated = 30 s) with {len(stacks)} stacks, flight records of ranks "
          f"{hang['records']}, no record from {hang['no_record']}: {hang['summary']}; rank 0 top frame: "
          f"{hang['ranks']['0']['top']}; analyser: {str(hang.get('analyser'))[:200]}")
