"""End-to-end scenarios: a real `babysit` CLI and daemon as subprocesses, real trainer processes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from babysit.db.store import Store

PY = sys.executable


def babysit(*args: str, cwd: Path, env: dict[str, str] | None = None,
            timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([PY, "-m", "babysit", *args], cwd=cwd, env={**os.environ, **(env or {})},
                          capture_output=True, text=True, timeout=timeout)


def tiny_run(root: Path, name: str, *, extra: str = "", args: tuple[str, ...] = (), gpus: str = "[]",
             attempts: str = "", steps: int | None = None, recipe: str = "tiny", filename: str | None = None) -> Path:
    """A run.toml for the reference trainer (default: the seconds-long `tiny` recipe) with test cadences."""
    cmd = [PY, "-m", "trainer", "--recipe", recipe, "--log", f"outputs/{name}/train_log.jsonl",
           "--checkpoints", f"outputs/{name}/checkpoints", *args]
    if steps is not None:
        cmd += ["--steps", str(steps)]
    path = root / (filename or f"{name}.toml")
    path.write_text(f"""[run]
name = "{name}"
command = {json.dumps(cmd)}
log = "outputs/{{name}}/train_log.jsonl"
gpus = {gpus}

[guards]
min_free_host_ram_gib = 0.1
stop_grace_seconds = 20

[poll]
first_after_minutes = 1
every_minutes = 3
{extra}
{attempts}
""")
    return path


STARTED_DAEMONS: list[Daemon] = []  # every daemon a scenario started: the workspace fixture kills what is left


class Daemon:
    """`babysit up --accelerated` as a real subprocess (killed by the workspace fixture if a test that
    fails leaves it running)."""

    def __init__(self, root: Path, *args: str, env: dict[str, str] | None = None) -> None:
        self.root = root
        STARTED_DAEMONS.append(self)
        self.proc = subprocess.Popen([PY, "-m", "babysit", "up", "--accelerated", "--registry",
                                      str(root / "babysit.toml"), *args], cwd=root,
                                     env={**os.environ, **(env or {})}, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True)

    def wait(self, timeout: float = 120) -> int:
        return self.proc.wait(timeout=timeout)

    def kill9(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)

    def output(self) -> tuple[str, str]:
        out, err = self.proc.communicate(timeout=10)
        return out, err


def store_of(root: Path) -> Store:
    return Store.in_dir(root / ".babysit")


def pid_alive(pid: int) -> bool:
    """Alive and not a zombie (an orphaned shim whose reaper is a container init that never reaps)."""
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def kill_runs(root: Path) -> None:
    """SIGKILL every attempt's process group recorded under `root/.babysit` (runs outlive daemons)."""
    db = root / ".babysit" / "state.db"
    if not db.exists():
        return
    store = Store(db)
    for attempt in store.all_attempts():
        if attempt.pid:
            try:
                os.killpg(attempt.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
    store.close()


@pytest.fixture
def workspace(tmp_path: Path) -> Iterator[Path]:
    yield tmp_path
    # no orphans, ever: whatever a test left running is killed (and the test that left it fails elsewhere):
    # its daemons first, so none launches a run again, then the runs they leave behind by design
    for daemon in [d for d in STARTED_DAEMONS if d.root == tmp_path]:
        STARTED_DAEMONS.remove(daemon)
        if daemon.proc.poll() is None:
            daemon.proc.kill()
            daemon.proc.wait(timeout=10)
    kill_runs(tmp_path)
