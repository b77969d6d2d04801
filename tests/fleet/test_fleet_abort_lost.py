"""`babysit abort RUN` in a terminal, for a run whose box is lost (docs/fleet.md): the asker is told at once
that the request waits for that box, named with its staleness, as the bot's `/babysit abort` does (before:
10 s of waiting, then `no daemon took it within 10s — it runs when babysit up does`, though this box's
daemon was up). Two daemons on one real PostgreSQL; box-b's daemon SIGKILLed; once back, it carries the
abort out."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

from tests.fleet.helpers import babysit, kill_trainers, pg_store, run_toml, stop, up
from tests.reliability.harness import gpu_file
from tests.support import wait_for

LEASE_S = 3.0


def _box(root: Path, name: str, url: str) -> Path:
    box = root / name
    box.mkdir()
    gpu_file(box / "gpus.json")
    (box / "babysit.toml").write_text(f'[daemon]\nguard_interval_seconds = 3600\n[store]\nurl = "{url}"\n'
                                      f'[host]\nname = "{name}"\nlease_seconds = {LEASE_S}\n')
    out = babysit(box, "register", str(run_toml(box, f"run-{name[-1]}")), "--accelerated")
    assert out.returncode == 0, out.stderr
    return box


def _running(store: Any, run: str) -> bool:
    return any(a.run == run and a.status == "running" for a in store.live_attempts())


def test_an_abort_in_the_terminal_of_a_lost_box_s_run_names_the_box_and_its_staleness(
        tmp_path: Path, pg_url: str) -> None:
    boxes = {name: _box(tmp_path, name, pg_url) for name in ("box-a", "box-b")}
    daemons = {name: up(box) for name, box in boxes.items()}
    store = pg_store(pg_url)
    try:
        for run in ("run-a", "run-b"):
            wait_for(f"{run} running", lambda run=run: _running(store, run))
        os.killpg(daemons["box-b"].pid, signal.SIGKILL)  # box-b's daemon only: its run trains on
        daemons["box-b"].wait(10)
        wait_for("box-b marked lost", lambda: any(h.name == "box-b" and h.lost_at is not None
                                                  for h in store.hosts()), timeout=LEASE_S * 10)

        out = babysit(boxes["box-a"], "abort", "run-b", "--wait", "600", timeout=120)
        assert out.returncode == 0, out.stdout + out.stderr
        # before: "queued (request 1); no daemon took it within 600s — it runs when `babysit up` does"
        assert "no daemon took it" not in out.stdout, out.stdout
        assert "queued (request " in out.stdout and "for box box-b, out of sight now (box box-b: LOST, lease " \
            "renewed " in out.stdout and "carried out when box box-b is back" in out.stdout, out.stdout
        (request,) = store._query("SELECT id, host, claimed_by, result FROM control WHERE run = 'run-b'")
        assert (request[1], request[2], request[3]) == ("box-b", None, None), request  # box-b's, untouched
        assert _running(store, "run-b")

        daemons["box-b"] = up(boxes["box-b"])  # box-b back: its daemon takes the request up and stops run-b
        answer = wait_for("box-b's answer", lambda: store.request_result(request[0]))
        assert answer in ("stopping", "not running"), answer
        wait_for("run-b stopped", lambda: store.run_state("run-b")[0] == "stopped")
    finally:
        for proc in daemons.values():
            stop(proc)
        kill_trainers(pg_url)
        store.close()
