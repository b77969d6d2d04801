"""Graceful stops under a real daemon: the stop reaches the run's leader alone, the grace ends in SIGKILL.

Issue 14: a stop signalled to the whole process group reached the trainer's DataLoader workers, which
died first (`DataLoader worker (pid N) is killed by signal: Terminated`), so the trainer crashed with
exit 1 and no checkpoint instead of exiting 10 with one.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import psutil
import pytest

from babysit.executors.local import LocalExecutor
from tests.scenarios.conftest import PY, Daemon, babysit, pid_alive, store_of, tiny_run
from tests.support import TRAIN_LOG, register, run_toml, wait_for


def abort(root: Path, run: str) -> None:
    res = babysit("abort", run, "--registry", str(root / "babysit.toml"), cwd=root)
    assert res.returncode == 0 and "stopping" in res.stdout, res.stdout + res.stderr


def progressed(root: Path, run: str, step: int) -> None:
    store = store_of(root)
    wait_for(f"{run} to reach step {step}", lambda: (store.run_state(run)[1].get("step") or 0) >= step, 120)


def patient(spec: Path) -> Path:
    """No stall stop while a loaded machine starts torch (accelerated, 20 declared minutes are 20 s)."""
    spec.write_text(spec.read_text().replace("stop_grace_seconds = 20\n", "stop_grace_seconds = 20\nstall_minutes = 30\n"))
    assert "stall_minutes = 30" in spec.read_text()
    return spec


def stopped_by(root: Path, run: str) -> str | None:
    return (store_of(root).run_state(run)[1].get("stop") or {}).get("reason")


def records(log: Path) -> list[dict]:
    return [json.loads(line) for line in log.read_text().splitlines() if line.strip()]


def tree_of(pid: int) -> set[int]:
    """The shim and everything under it now (ranks in sessions of their own included)."""
    try:
        root = psutil.Process(pid)
        return {pid, *(p.pid for p in root.children(recursive=True))}
    except psutil.NoSuchProcess:
        return set()


def test_abort_with_dataloader_workers_checkpoints_and_the_run_resumes_from_it(workspace: Path) -> None:
    name = "workers_stop"
    # save only on stop: a checkpoint can then come from nothing but the graceful stop
    register(workspace, patient(tiny_run(workspace, name, steps=100_000,
                                         args=("--num-workers", "2", "--save-every", "0"))))
    daemon = Daemon(workspace, "--exit-when-idle")
    progressed(workspace, name, 5)
    store = store_of(workspace)
    (running,) = store.attempts(name)
    workers = [p for p in tree_of(running.pid) if p != running.pid]
    assert len(workers) >= 3, "the trainer and its two DataLoader workers run under the shim"
    abort(workspace, name)
    assert daemon.wait(timeout=120) == 0, daemon.output()
    (attempt,) = store.attempts(name)
    stderr = (Path(attempt.attempt_dir) / "stderr.log").read_text()
    assert "is killed by signal" not in stderr, stderr[-2000:]
    assert attempt.exit_code == 10, f"exit {attempt.exit_code}, not the checkpoint-and-exit code:\n{stderr[-2000:]}"
    assert attempt.outcome == "stopped" and "did not exit cleanly" not in attempt.detail.get("summary", "")
    assert stopped_by(workspace, name) == "abort"
    log = workspace / "outputs" / name / "train_log.jsonl"
    (stopped,) = [r for r in records(log) if r.get("event") == "stopped"]
    ckpt = workspace / "outputs" / name / "checkpoints" / f"step_{stopped['step']:06d}.pt"
    assert ckpt.exists(), "the stop saved a checkpoint at the step it stopped"
    assert not any(pid_alive(p) for p in workers), "nothing of the run outlives it"

    # the resumed run continues from that checkpoint
    resume = subprocess.run([PY, "-m", "trainer", "--recipe", "tiny",
                             "--log", str(log), "--checkpoints", str(ckpt.parent), "--resume", "latest",
                             "--steps", str(stopped["step"] + 3)], cwd=workspace, capture_output=True, text=True,
                            timeout=120)
    assert resume.returncode == 0, resume.stderr[-2000:]
    start = [r for r in records(log) if r.get("event") == "start"][-1]
    assert start["config"]["resumed_from_step"] == stopped["step"]
    steps = [r["step"] for r in records(log)[records(log).index(start) + 1:] if "train_loss" in r]
    assert steps[0] == stopped["step"] + 1


SIGNAL_TRAINER = """
import json, os, signal, subprocess, sys, time
# A trainer that checkpoints on one signal only, with a worker in its group and one in a session of its
# own (as torchrun starts ranks). Every process writes its pid, and what reached it, to PIDS.
mode, pids = sys.argv[1], sys.argv[2]
def note(text):
    with open(pids, "a") as f:
        f.write(text + "\\n")
worker = "import os, signal, sys, time\\n" \\
    "signal.signal(signal.SIGTERM, signal.SIG_IGN)\\n" \\
    "signal.signal(signal.SIGUSR1, lambda n, f: (open(sys.argv[1], 'a').write(f'got {n} worker\\\\n'), sys.exit(1)))\\n" \\
    "open(sys.argv[1], 'a').write(f'pid {os.getpid()}\\\\n')\\n" \\
    "time.sleep(600)"
subprocess.Popen([sys.executable, "-c", worker, pids])
subprocess.Popen([sys.executable, "-c", worker, pids], start_new_session=True)
note(f"pid {os.getpid()}")
def on(n, _):
    note(f"got {n} leader")
    with open(os.environ["BABYSIT_CHECKPOINTS"] + ".ckpt", "w") as f:
        f.write(signal.Signals(n).name)
    sys.exit(10)
if mode == "usr1":
    signal.signal(signal.SIGUSR1, on)
    signal.signal(signal.SIGTERM, lambda n, _: (note(f"got {n} leader"), sys.exit(3)))
else:  # "stubborn": ignores the stop
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
step = 0
while True:
    with open(os.environ["BABYSIT_LOG"], "a") as f:
        f.write(json.dumps({"step": step, "ts": time.time(), "train_loss": 1.0 / (step + 1)}) + "\\n")
    step += 1
    time.sleep(0.1)
"""


def script_run(root: Path, name: str, mode: str, *, stop_signal: str | None, grace: float) -> str:
    (root / "outputs" / name).mkdir(parents=True, exist_ok=True)
    return run_toml(name, [PY, "-c", SIGNAL_TRAINER, mode, str(root / f"{name}.pids")], log=TRAIN_LOG,
                    run={"stop_signal": stop_signal} if stop_signal else None,
                    guards={"min_free_host_ram_gib": 0.1, "stop_grace_seconds": grace}, poll=(1, 3))


def noted(root: Path, name: str) -> tuple[list[int], list[str]]:
    lines = (root / f"{name}.pids").read_text().splitlines()
    return [int(ln.split()[1]) for ln in lines if ln.startswith("pid ")], [ln for ln in lines if ln.startswith("got")]


def test_stop_signal_sigusr1_reaches_the_trainer_that_checkpoints_on_it(workspace: Path) -> None:
    name = "usr1_stop"
    register(workspace, script_run(workspace, name, "usr1", stop_signal="SIGUSR1", grace=20))
    daemon = Daemon(workspace, "--exit-when-idle")
    progressed(workspace, name, 5)
    abort(workspace, name)
    assert daemon.wait(timeout=60) == 0, daemon.output()
    (attempt,) = store_of(workspace).attempts(name)
    assert attempt.exit_code == 10 and attempt.outcome == "stopped"
    assert (workspace / "outputs" / name / "checkpoints.ckpt").read_text() == "SIGUSR1"
    pids, got = noted(workspace, name)
    assert got == [f"got {int(signal.SIGUSR1)} leader"], "SIGUSR1 to the leader only, and nothing else"
    assert len(pids) == 3 and not any(pid_alive(p) for p in pids)


def test_a_trainer_that_ignores_the_stop_is_killed_with_all_its_processes_after_the_grace(workspace: Path) -> None:
    name = "stubborn_stop"
    register(workspace, script_run(workspace, name, "stubborn", stop_signal=None, grace=1))
    daemon = Daemon(workspace, "--exit-when-idle")
    progressed(workspace, name, 5)
    pids, _ = noted(workspace, name)
    (running,) = store_of(workspace).attempts(name)
    group = [p for p in pids if os.getpgid(p) == running.pid]
    assert len(pids) == 3 and len(group) == 2, "the leader and one worker in the shim's group, one outside it"
    abort(workspace, name)
    assert daemon.wait(timeout=60) == 0, daemon.output()
    (attempt,) = store_of(workspace).attempts(name)
    assert attempt.outcome == "stopped" and attempt.exit_signal == signal.SIGKILL
    left = [p for p in [running.pid, *pids] if pid_alive(p)]
    assert not left, f"orphans left after the grace: {left}"


TORCHRUN = [PY, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--standalone"]


@pytest.fixture
def needs_torchrun() -> None:
    """torch with gloo, for torchrun on CPU; looked for when the test runs (importing torch at collection
    costs every xdist worker seconds)."""
    try:
        import torch.distributed as dist
    except ImportError:
        pytest.skip("torch is needed for torchrun")
    if not (dist.is_available() and dist.is_gloo_available()):
        pytest.skip("torch with gloo is needed for torchrun on CPU")


@pytest.mark.slow
@pytest.mark.usefixtures("needs_torchrun")
def test_torchrun_abort_reaches_every_rank_through_the_agent_and_leaves_nothing(workspace: Path) -> None:
    """torchrun is the leader: it passes the stop to its ranks, which checkpoint together and exit 10.

    No DataLoader workers here: torchrun signals each rank's whole process group (its own killpg), so a
    rank's workers die on a stop whatever babysit does; a trainer shields them (SIG_IGN in its
    worker_init_fn) if it wants both.
    """
    name = "torchrun_stop"
    spec = tiny_run(workspace, name, steps=100_000, args=("--save-every", "0"))
    text = spec.read_text()
    spec.write_text(text.replace(json.dumps([PY, "-m", "trainer"])[:-1], json.dumps([*TORCHRUN, "-m", "trainer"])[:-1])
                    .replace('"--log", ', '"--log-path", '))
    assert "torch.distributed.run" in spec.read_text()
    register(workspace, patient(spec))
    daemon = Daemon(workspace, "--exit-when-idle")
    store = store_of(workspace)
    try:
        progressed(workspace, name, 20)
        (running,) = store.attempts(name)
        tree = tree_of(running.pid)
        assert len(tree) >= 4, "the shim, the agent and two ranks"
        abort(workspace, name)
        assert daemon.wait(timeout=120) == 0, daemon.output()
    finally:
        for attempt in store.attempts(name):
            LocalExecutor().kill(attempt)
    (attempt,) = store.attempts(name)
    stderr = (Path(attempt.attempt_dir) / "stderr.log").read_text()
    assert stderr.count("babysit-trainer: stopped on SIGTERM") == 2, stderr[-3000:]
    assert attempt.outcome == "stopped" and stopped_by(workspace, name) == "abort"
    assert attempt.exit_code == 1, "torchrun exits 1 after a signal (SignalException), whatever its ranks did"
    assert "a clean stop, shown by the trainer's stop record at step" in attempt.detail["summary"]
    (stopped,) = [r for r in records(workspace / "outputs" / name / "train_log.jsonl") if r.get("event") == "stopped"]
    assert (workspace / "outputs" / name / "checkpoints" / f"step_{stopped['step']:06d}.pt").exists()
    assert not [p for p in tree if pid_alive(p)], "a rank outlived its run"


STUBBORN_RANK = """
import os, signal, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
open(sys.argv[1], "a").write(f"pid {os.getpid()}\\n")
time.sleep(600)
"""


@pytest.mark.usefixtures("needs_torchrun")
def test_torchrun_ranks_that_ignore_the_stop_die_with_the_run_after_the_grace(tmp_path: Path) -> None:
    """torchrun starts each rank in a session of its own: a SIGKILL to the shim's group killed the agent
    and orphaned its ranks. The kill reaches them through the tree."""
    from babysit.db.store import Store

    store = Store.in_dir(tmp_path / "state")
    executor = LocalExecutor()
    script, pids = tmp_path / "rank.py", tmp_path / "ranks.pids"
    script.write_text(STUBBORN_RANK)
    argv = [*TORCHRUN, str(script), str(pids)]
    attempt = store.begin_attempt("r", 1, "p", argv, "local", 0, str(tmp_path / "attempt-1"), time.time())
    started = executor.launch(attempt, argv, dict(os.environ), str(tmp_path))
    store.mark_running(attempt.id, started_at=started.started_at, pid=started.pid,
                       pid_create_time=started.pid_create_time)
    attempt = store.attempt("r", 1)
    try:
        wait_for("two ranks", lambda: pids.exists() and pids.read_text().count("pid ") == 2, 60)
        ranks = [int(ln.split()[1]) for ln in pids.read_text().splitlines()]
        assert all(os.getsid(r) == r for r in ranks), "torchrun ranks lead sessions of their own"
        executor.stop(attempt, signal.SIGTERM)
        assert not executor.wait(attempt, 2.0), "the ranks ignore SIGTERM; torchrun waits 30 s for them"
        executor.kill(attempt)
        assert executor.wait(attempt, 20)
        wait_for("the ranks to die with their run", lambda: not any(pid_alive(r) for r in ranks), 10)
    finally:
        executor.kill(attempt)
        for line in (pids.read_text().splitlines() if pids.exists() else []):
            try:
                os.kill(int(line.split()[1]), signal.SIGKILL)
            except ProcessLookupError:
                pass


# A torchrun rank that needs no torch: rank 0 logs a step every 50 ms; on SIGTERM every rank either saves a
# checkpoint and exits 10 (MODE=save), or dies at once without one (MODE=die). torchrun exits 1 either way.
LAUNCHED_RANK = """
import json, os, signal, sys, time
rank, mode = int(os.environ["RANK"]), os.environ["MODE"]
step = 0
def stop(*_):
    if mode == "save":
        folder = os.environ["BABYSIT_CHECKPOINTS"]
        os.makedirs(folder, exist_ok=True)
        if rank == 0:
            with open(os.path.join(folder, f"step_{step:06d}.pt"), "wb") as f:
                f.write(b"x" * 4096)
        sys.exit(10)
    os._exit(1)
signal.signal(signal.SIGTERM, stop)
while True:
    step += 1
    if rank == 0:
        with open(os.environ["BABYSIT_LOG"], "a") as f:
            f.write(json.dumps({"step": step, "ts": time.time(), "train_loss": 1.0 / step}) + "\\n")
    time.sleep(0.05)
"""


@pytest.mark.usefixtures("needs_torchrun")
@pytest.mark.parametrize(("mode", "said", "clean"), [
    ("save", "exit 1: a clean stop, shown by checkpoint step_", True),
    ("die", "exit 1 (it did not exit cleanly: no stop record in the log and no checkpoint written after the stop "
            "signal; check the checkpoint)", False),
])
def test_a_torchrun_stop_is_told_clean_by_the_checkpoint_written_after_it_not_by_torchruns_exit_1(
        workspace: Path, mode: str, said: str, clean: bool) -> None:
    """torchrun exits 1 (SignalException) after a stop whatever its ranks did: babysit tells a run that
    saved from one that died by a checkpoint written after the signal, and says so."""
    (workspace / "rank.py").write_text(LAUNCHED_RANK)
    name = f"launched_{mode}"
    register(workspace, run_toml(name, [*TORCHRUN, "rank.py"], log=TRAIN_LOG, env={"MODE": mode}, poll=(1, 3),
                                 guards={"min_free_host_ram_gib": 0.1, "stop_grace_seconds": 20, "stall_minutes": 30}))
    daemon = Daemon(workspace, "--exit-when-idle")
    store = store_of(workspace)
    try:
        progressed(workspace, name, 10)
        abort(workspace, name)
        assert daemon.wait(timeout=120) == 0, daemon.output()
    finally:
        for attempt in store.attempts(name):
            LocalExecutor().kill(attempt)
    (attempt,) = store.attempts(name)
    assert attempt.exit_code == 1, "torchrun's own exit after a signal"
    assert attempt.outcome == "stopped"
    assert said in attempt.detail["summary"], attempt.detail["summary"]
    assert attempt.detail["clean_stop"]["clean"] is clean
    assert attempt.detail["clean_stop"]["by"] == ("checkpoint" if clean else None)
