"""Helpers the fleet tests and bench/fleet.py share: a box's run.toml, its environment, `babysit` on it, a
daemon started and stopped, the posts Slack got (the fixtures are in tests/fleet/conftest.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tests import support
from tests.support import TRAIN_LOG

ROOT = Path(__file__).resolve().parents[2]
PY = sys.executable
FAKE = ROOT / "tests" / "reliability" / "fake_trainer.py"  # a record every --sleep s, --steps of them
GATED = ROOT / "bench" / "_gated_trainer.py"  # evals to its read step, then ends when its gate file appears
PREREG = {"question": "Does val_loss fall between steps 50 and 100?", "metric": "val_loss", "baseline_step": 50,
          "read_step": 100, "bands": [{"label": "IMPROVED", "max": 0.0}],
          "otherwise": {"label": "NOT-IMPROVED"}}  # what a gated run's FINAL verdict is read with


def fake_trainer(run: str) -> list[str]:
    """The command of a run that trains on until stopped (a record every 0.5 s)."""
    return [PY, str(FAKE), f"outputs/{run}/train_log.jsonl", "--steps", "100000", "--sleep", "0.5"]


def run_toml(box: Path, run: str, cmd: list[str] | None = None, *, gpus: Sequence[int] | None = (0,),
             host: str | None = None, log: str = TRAIN_LOG, file: str | None = None, min_free_gib: float = 0.1,
             grace_s: int = 20, stall_min: int | None = 120, poll_min: tuple[int, int] = (30, 60),
             **tables: Any) -> Path:
    """`box/RUN.toml` (or `file`): a run with the guards and polls a fleet test needs out of its way, and any
    other tables of tests.support.run_toml (prereg=, retry=, attempts=). The command runs in its spec's
    directory: outputs/ is under the box."""
    guards: dict[str, float] = {"min_free_host_ram_gib": min_free_gib, "stop_grace_seconds": grace_s}
    if stall_min is not None:
        guards["stall_minutes"] = stall_min
    path = box / (file or f"{run}.toml")
    path.write_text(support.run_toml(run, cmd or fake_trainer(run), log=log, gpus=gpus, guards=guards, poll=poll_min,
                                     run={"host": host} if host is not None else None, **tables))
    return path


def outage_spec(box: Path, run: str, cmd: list[str], **tables: Any) -> Path:
    """What the outage tests register: no poll due for ten hours (nothing posted but what the test causes)."""
    return run_toml(box, run, cmd, poll_min=(600, 600), **tables)


def box_env(box: Path | None = None, gpu_probe: str | None = None) -> dict[str, str]:
    """The environment of a box's `babysit`: this tree's code, the box's GPU file (or `gpu_probe`), nothing of
    the caller's store, host or Slack."""
    probe = gpu_probe or f"file:{box / 'gpus.json'}"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "BABYSIT_GPU_PROBE": probe}
    for key in ("SLACK_BOT_TOKEN", "BABYSIT_STORE_URL", "BABYSIT_HOST", "BABYSIT_CRASH_AT"):
        env.pop(key, None)
    return env


def babysit(box: Path, *args: str, timeout: float = 60, env: Mapping[str, str] | None = None
            ) -> subprocess.CompletedProcess[str]:
    """`babysit ARGS --registry box/babysit.toml`, run in the box."""
    return subprocess.run([PY, "-m", "babysit", *args, "--registry", str(box / "babysit.toml")], cwd=box,
                          env=dict(env) if env is not None else box_env(box), capture_output=True, text=True,
                          timeout=timeout)


def up(box: Path, env: Mapping[str, str] | None = None, out: str = "daemon-out.txt") -> subprocess.Popen[bytes]:
    """`babysit up --accelerated` on the box, its output appended to box/OUT, in a session of its own."""
    with open(box / out, "ab") as log:
        return subprocess.Popen([PY, "-m", "babysit", "up", "--accelerated", "--registry", str(box / "babysit.toml")],
                                cwd=box, env=dict(env) if env is not None else box_env(box), stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)


def stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM (Ctrl-C's way out), then SIGKILL to its session after 30 s."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


def pg_store(url: str, host: str = "test") -> Any:
    """A PostgreSQL store of the test's own (a CLI's: no journal)."""
    from babysit.db.postgres import PostgresStore

    return PostgresStore(url, host=host)


def kill_trainers(url: str, host: str = "test") -> None:
    """Every trainer the boxes' daemons left running (a daemon stopped leaves its runs: it always does)."""
    store = pg_store(url, host)
    try:
        for a in store.live_attempts():
            if a.pid:
                try:
                    os.killpg(a.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
    finally:
        store.close()


def posted_ids(fake: Any) -> Counter[int]:
    """How many times each outbox row reached the local Slack server (by the id in its message metadata)."""
    return Counter(m["metadata"]["event_payload"]["id"] for m in fake.messages
                   if (m.get("metadata") or {}).get("event_type") == "babysit_outbox")


def fleet_box(parent: Path, pg_url: str, name: str = "box-a") -> Path:
    """A box of the fleet on `pg_url` with one run, r1 (`python train.py`), registered: its folder."""
    root = parent / name
    root.mkdir()
    outage_spec(root, "r1", ["python", "train.py"])
    (root / "babysit.toml").write_text(
        f'[store]\nurl = "{pg_url}"\n[host]\nname = "{name}"\n\n[[runs]]\nname = "r1"\nspec = "r1.toml"\n'
        'registered_at = "2026-01-01T00:00:00Z"\n')
    return root
