"""`[run] host`: a run registered on one box for another belongs to that box; only that box's daemon takes
it up, and `status` on any box shows it as that box's. A malformed host is refused at register naming the
file, the field and what is expected; on a box outside a fleet the daemon refuses the run, saying why."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest

from babysit.core.errors import SpecError
from babysit.core.spec.run_toml import load_spec
from tests.fleet.helpers import babysit, run_toml, stop, up
from tests.fleet.test_fleet import LEASE_S, _registry
from tests.reliability.harness import gpu_file
from tests.support import wait_for


def test_run_host_is_read_and_a_malformed_one_names_file_field_and_expected(tmp_path: Path) -> None:
    assert load_spec(run_toml(tmp_path, "r", host="box-b.lab")).host == "box-b.lab"
    assert load_spec(run_toml(tmp_path, "r", host=None)).host is None
    bad = run_toml(tmp_path, "r", host="box b!")
    with pytest.raises(SpecError) as err:
        load_spec(bad)
    assert "run.host: expected a box's host name" in err.value.message and "r.toml" in err.value.message
    (tmp_path / "babysit.toml").write_text("")
    out = babysit(tmp_path, "register", str(bad))
    assert out.returncode == 2 and "run.host: expected a box's host name" in out.stderr, out.stderr


def test_a_run_registered_on_box_a_for_box_b_is_taken_up_by_box_b_alone(tmp_path: Path, pg_url: str) -> None:
    from babysit.db.postgres import PostgresStore

    boxes = {}
    for name in ("box-a", "box-b"):
        box = boxes[name] = tmp_path / name
        box.mkdir()
        gpu_file(box / "gpus.json")
        _registry(box, name, pg_url)
        out = babysit(box, "register", str(run_toml(box, "for-b", host="box-b")), "--accelerated")
        assert out.returncode == 0, out.stderr
    store = PostgresStore(pg_url, host="test")
    procs: list[subprocess.Popen[bytes]] = []
    try:
        procs.append(up(boxes["box-a"]))
        wait_for("box-a recording the run as box-b's", lambda: store.run_hosts().get("for-b") == "box-b")
        wait_for("box-a's lease", lambda: any(h.name == "box-a" for h in store.hosts()))
        assert store.attempts("for-b") == []  # box-a never launches it
        shown = babysit(boxes["box-a"], "status")
        assert "for-b: on box box-b" in shown.stdout, shown.stdout  # before: box-a's own, registered
        assert "run registered for another box; its daemon babysits it" in (boxes["box-a"] / ".babysit" / "daemon.log").read_text()

        procs.append(up(boxes["box-b"]))
        running = wait_for("box-b running it", lambda: [a for a in store.live_attempts()
                                                        if a.run == "for-b" and a.status == "running"])
        assert running[0].attempt_dir.startswith(str(boxes["box-b"]))  # launched on box-b, from its files
        assert store.run_hosts()["for-b"] == "box-b"
        assert len(store.attempts("for-b")) == 1
    finally:
        for proc in procs:
            stop(proc)
        for a in store.live_attempts():
            if a.pid:
                try:
                    os.killpg(a.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
        store.close()


def test_a_run_host_on_a_box_outside_a_fleet_is_refused_saying_why(tmp_path: Path) -> None:
    gpu_file(tmp_path / "gpus.json")
    (tmp_path / "babysit.toml").write_text("[daemon]\nguard_interval_seconds = 3600\n")
    out = babysit(tmp_path, "register", str(run_toml(tmp_path, "lonely", host="box-b")), "--accelerated")
    assert out.returncode == 0, out.stderr
    proc = up(tmp_path)
    try:
        channel = tmp_path / ".babysit" / "channel.jsonl"
        texts: Any = wait_for("the refusal posted", lambda: channel.exists() and [
            json.loads(x)["text"] for x in channel.read_text().splitlines() if "spec refused" in x], timeout=30)
        assert "run.host: expected no host on a box outside a fleet" in texts[0], texts
        assert not list((tmp_path / ".babysit").glob("runs/lonely/attempt-*"))
    finally:
        stop(proc)
    assert LEASE_S > 0
