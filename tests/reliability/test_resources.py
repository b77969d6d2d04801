"""Disk and resource faults: the state directory's disk full (a 2 MiB tmpfs, root only), the train log
deleted or rotated under a live run, and a trainer that ignores SIGTERM."""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from babysit.channels.notify import ConsoleChannel, deliver_due
from babysit.core.errors import StateError
from babysit.db.store import Store
from babysit.runtime import registry
from tests.reliability.harness import Daemons
from tests.reliability.test_security import fake_run
from tests.support import wait_for


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    mnt = tmp_path / "small"
    mnt.mkdir()
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mnt)], capture_output=True, text=True)
    if res.returncode != 0:
        pytest.skip(f"cannot mount a 2 MiB tmpfs here (needs root / CAP_SYS_ADMIN): {res.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def fill(disk: Path) -> Path:
    """Fill the disk to the last byte (unbuffered, so nothing is left to fail at close)."""
    filler = disk / "filler"
    with open(filler, "ab", buffering=0) as f:
        for chunk in (65536, 4096, 512, 1):
            with contextlib.suppress(OSError):
                while True:
                    f.write(b"\0" * chunk)
    return filler


def test_a_full_state_disk_fails_writes_loudly_corrupts_nothing_and_recovers(small_disk: Path) -> None:
    state = small_disk / ".babysit"
    store = Store.in_dir(state)
    channel = ConsoleChannel(state, stream=open(os.devnull, "w"))  # noqa: SIM115
    first = store.enqueue("r", "text", {"run": "r", "text": "before"}, time.time())
    assert deliver_due(store, channel, time.time) == 1
    store.set_run_state("r", "running", time.time(), step=1)
    filler = fill(small_disk)
    big = {"run": "r", "text": "x" * 200_000}
    with pytest.raises(StateError, match=r"write failed|disk|full"):
        for _ in range(50):  # the WAL has some slack: write until the disk says no
            store.enqueue("r", "text", big, time.time())
    with pytest.raises(StateError):
        store.set_run_state("r", "running", time.time(), step=2, pad="y" * 200_000)
    # the registry writer: refuses, leaves the old file whole
    reg = small_disk / "babysit.toml"
    with pytest.raises(OSError):
        registry.update(reg, lambda r: (registry.Registry(r.path, registry.DaemonSettings(channel="#" + "c" * 300_000)),
                                        None))
    assert not reg.exists() or registry.load(reg)
    # nothing corrupted: what was committed is there and the database checks out
    db = sqlite3.connect(state / "state.db")
    assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    db.close()
    assert store.message(first).status == "sent" and store.run_state("r")[1]["step"] == 1
    filler.unlink()  # space comes back
    later = store.enqueue("r", "text", {"run": "r", "text": "after"}, time.time())
    assert deliver_due(store, channel, time.time) >= 1
    ids = [json.loads(line)["id"] for line in (state / "channel.jsonl").read_text().splitlines()]
    assert first in ids and later in ids and len(ids) == len(set(ids))
    assert store.pending_count() == 0 or store.message(later).status == "sent"
    store.close()


def test_the_daemon_survives_a_full_state_disk_mid_run_and_finishes_when_space_returns(small_disk: Path,
                                                                                      tmp_path: Path) -> None:
    root = tmp_path / "ws"
    root.mkdir()
    (root / "babysit.toml").write_text(f'[daemon]\nstate_dir = "{small_disk / ".babysit"}"\n')
    fake_run(root, "diskfull", "--sleep", "0.3", steps=30)
    daemons = Daemons(root)
    try:
        proc = daemons.start("--exit-when-idle")
        store = Store.in_dir(small_disk / ".babysit")
        wait_for("progress", lambda: (store.run_state("diskfull")[1].get("step") or 0) >= 3, 60)
        filler = fill(small_disk)
        time.sleep(3)
        assert proc.poll() is None, "the daemon rides out a full disk"
        filler.unlink()
        assert proc.wait(90) == 0, (root / "daemon-out.txt").read_text()[-3000:]
        (attempt,) = store.attempts("diskfull")
        assert attempt.outcome == "completed" and store.run_state("diskfull")[0] == "finished"
        assert store.pending_count() == 0
        ids = [json.loads(line)["id"] for line in (small_disk / ".babysit" / "channel.jsonl").read_text().splitlines()
               if line.strip()]
        assert len(ids) == len(set(ids)) and ids == sorted(ids)
        assert set(ids) == {m.id for m in store.messages()}
        store.close()
    finally:
        daemons.cleanup()


@pytest.mark.parametrize("how", ["--rotate-at", "--delete-at"])
def test_the_log_rotated_or_deleted_under_a_live_run_is_read_on(how: str, tmp_path: Path, daemons: Daemons) -> None:
    fake_run(tmp_path, "rotating", "--sleep", "0.1", how, "15", steps=40)
    proc = daemons.start("--exit-when-idle")
    assert proc.wait(90) == 0
    store = Store.in_dir(tmp_path / ".babysit")
    _, facts = store.run_state("rotating")
    assert facts["step"] == 40, "the reader followed the new file to the end"
    assert facts["tail"]["resets"] >= 1
    assert store.attempts("rotating")[0].outcome == "completed"
    store.close()


def test_a_trainer_ignoring_sigterm_is_killed_after_the_grace_period(tmp_path: Path, daemons: Daemons) -> None:
    fake_run(tmp_path, "stubborn", "--ignore-term", "--sleep", "0.2", steps=5000, guards={"stop_grace_seconds": 2},
             retry={"on": ["crashed"]})
    proc = daemons.start("--exit-when-idle")
    store = Store.in_dir(tmp_path / ".babysit")
    wait_for("progress", lambda: (store.run_state("stubborn")[1].get("step") or 0) >= 3, 60)
    t0 = time.monotonic()
    res = subprocess.run([sys.executable, "-m", "babysit", "abort", "stubborn", "--registry",
                          str(tmp_path / "babysit.toml")], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert proc.wait(60) == 0
    elapsed = time.monotonic() - t0
    (attempt,) = store.attempts("stubborn")
    assert attempt.exit_signal == 9 and attempt.outcome == "stopped", attempt
    assert elapsed >= 2, "SIGKILL only after the grace period"
    assert store.run_state("stubborn")[0] == "stopped"
    with contextlib.suppress(ProcessLookupError):
        os.killpg(attempt.pid, 0)
        import psutil

        alive = [p for p in psutil.process_iter(["pid", "status"]) if p.info["status"] != psutil.STATUS_ZOMBIE
                 and os.getpgid(p.info["pid"]) == attempt.pid]
        assert not alive, "nothing of the run is left"
    store.close()
