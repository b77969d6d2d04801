"""Three daemons with different host names on one machine against one real PostgreSQL (docs/fleet.md):
each babysits its own run; an abort asked on one box reaches the owning box through NOTIFY (the guard
round, the polling fallback, is an hour away, so nothing else could carry it); a daemon SIGKILLed for
good is noticed by the others and alerted exactly once, its run shown `host-lost`; a `pg_ctl restart -m
fast` mid-run cuts every connection and the boxes carry on (LISTEN again included); the lost box comes
back and re-adopts its run as after a restart. And fleet mode on SQLite is refused."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.fleet.helpers import PY, babysit, box_env, kill_trainers, pg_store, run_toml, up
from tests.reliability.harness import gpu_file
from tests.support import wait_for

BOXES = ("box-a", "box-b", "box-c")
LEASE_S = 3.0


def _registry(box: Path, name: str, url: str | None) -> None:
    store = f'[store]\nurl = "{url}"\n' if url else ""
    (box / "babysit.toml").write_text(f"[daemon]\nguard_interval_seconds = 3600\n{store}"
                                      f'[host]\nname = "{name}"\nlease_seconds = {LEASE_S}\n')


class Fleet:
    def __init__(self, root: Path, url: str) -> None:
        self.root, self.url = root, url
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        for name in BOXES:
            box = self.box(name)
            box.mkdir(parents=True)
            gpu_file(box / "gpus.json")
            _registry(box, name, url)
            out = babysit(box, "register", str(run_toml(box, f"run-{name[-1]}")), "--accelerated")
            assert out.returncode == 0, out.stderr

    def box(self, name: str) -> Path:
        return self.root / name

    def up(self, name: str) -> None:
        self.procs[name] = up(self.box(name))

    def kill(self, name: str) -> None:
        proc = self.procs.pop(name)
        os.killpg(proc.pid, signal.SIGKILL)  # the daemon only: its runs live in sessions of their own
        proc.wait(10)

    def store(self) -> Any:
        return pg_store(self.url)

    def close(self) -> None:
        for name in list(self.procs):
            proc = self.procs.pop(name)
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(20)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
        kill_trainers(self.url)


@pytest.fixture
def fleet(tmp_path: Path, pg_url: str) -> Iterator[Fleet]:
    f = Fleet(tmp_path, pg_url)
    try:
        yield f
    finally:
        f.close()


def _running(store: Any, run: str) -> Any:
    live = [a for a in store.live_attempts() if a.run == run and a.status == "running"]
    return live[0] if live else None


def _channel_texts(box: Path) -> list[str]:
    path = box / ".babysit" / "channel.jsonl"
    return [json.loads(line)["text"] for line in path.read_text().splitlines()] if path.exists() else []


@pytest.mark.slow  # ~60 s of three daemons (CI runs it with the slow tests)
def test_three_boxes_share_one_postgres_abort_by_notify_host_lost_once_and_a_database_restart(
        fleet: Fleet, postgres: Any) -> None:
    for name in BOXES:
        fleet.up(name)
    store = fleet.store()
    try:
        first = {f"run-{n[-1]}": wait_for(f"run-{n[-1]} running", lambda n=n: _running(store, f"run-{n[-1]}"))
                 for n in BOXES}
        assert store.run_hosts() == {"run-a": "box-a", "run-b": "box-b", "run-c": "box-c"}
        # each box launched its own run: the attempt's directory is under its own state directory
        for run, attempt in first.items():
            assert attempt.attempt_dir.startswith(str(fleet.box(f"box-{run[-1]}"))), attempt.attempt_dir

        shown = babysit(fleet.box("box-a"), "status")
        assert shown.returncode == 0, shown.stderr
        for name in BOXES:
            assert f"box {name}: up" in shown.stdout and f"run-{name[-1]}" in shown.stdout, shown.stdout

        # an abort asked on box-a for box-b's run: carried out on box-b, woken by NOTIFY
        asked = time.monotonic()
        out = babysit(fleet.box("box-a"), "abort", "run-b", timeout=30)
        took = time.monotonic() - asked
        assert out.returncode == 0 and "abort run-b: stopping" in out.stdout, (out.stdout, out.stderr)
        assert took < 10, f"the abort took {took:.1f}s: NOTIFY did not wake box-b"
        ended = wait_for("run-b's attempt ended", lambda: store.attempt("run-b", 1).status == "ended"
                         and store.attempt("run-b", 1))
        assert ended.outcome == "stopped"

        # box-c's daemon is SIGKILLed for good: the others notice its lapsed lease and alert once
        fleet.kill("box-c")
        killed = time.monotonic()
        alert = wait_for("the host-lost alert sent", lambda: [m for m in store.messages("")
                                                          if "box box-c lost" in m.payload.get("text", "")
                                                          and m.status == "sent"], timeout=LEASE_S * 10)
        noticed = time.monotonic() - killed
        assert len(alert) == 1 and noticed < LEASE_S * 3 + 5
        time.sleep(LEASE_S * 2)  # further rounds of both lookouts: still one alert
        lost_rows = [m for m in store.messages("") if "box box-c lost" in m.payload.get("text", "")]
        assert len(lost_rows) == 1 and "run-c" in lost_rows[0].payload["text"]
        posted = [t for name in ("box-a", "box-b") for t in _channel_texts(fleet.box(name)) if "box-c lost" in t]
        assert len(posted) == 1, posted
        shown = babysit(fleet.box("box-a"), "status")
        assert "box box-c: LOST" in shown.stdout and "host-lost" in shown.stdout, shown.stdout
        assert _running(store, "run-c") is not None  # its run goes on; only its babysitter is gone

        # the database restarts mid-run: every connection is cut; the boxes reconnect and LISTEN again
        postgres.restart("fast")
        time.sleep(1.0)
        asked = time.monotonic()
        out = babysit(fleet.box("box-b"), "abort", "run-a", timeout=60)
        assert out.returncode == 0 and "abort run-a: stopping" in out.stdout, (out.stdout, out.stderr)
        assert time.monotonic() - asked < 15, "after the restart the abort waited for a fallback"
        wait_for("run-a stopped", lambda: store.attempt("run-a", 1).outcome == "stopped")

        # box-c comes back: it re-adopts its run (the same attempt, the same process) and says so
        fleet.up("box-c")
        wait_for("box-c back", lambda: [m for m in store.messages("") if "box box-c is back" in
                                        m.payload.get("text", "") and m.status == "sent"], timeout=60)
        assert store.attempt("run-c", 1).status == "running" and store.attempt("run-c", 1).pid == first["run-c"].pid
        assert next(h for h in store.hosts() if h.name == "box-c").lost_at is None
        shown = babysit(fleet.box("box-a"), "status")
        assert "box box-c: up" in shown.stdout and "host-lost" not in shown.stdout, shown.stdout
    finally:
        store.close()


def test_a_host_name_without_a_postgres_url_is_refused_saying_why(tmp_path: Path) -> None:
    _registry(tmp_path, "box-a", None)
    out = subprocess.run([PY, "-m", "babysit", "up", "--accelerated", "--exit-when-idle", "--registry",
                          str(tmp_path / "babysit.toml")], cwd=tmp_path, env=box_env(tmp_path), capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 2, out.stderr
    assert "a fleet of boxes needs a PostgreSQL" in out.stderr and "[store] url" in out.stderr


@pytest.mark.slow  # ~40 s: two daemons through a 9-s outage
def test_a_database_outage_longer_than_a_lease_stops_no_run_and_declares_no_box_lost(
        fleet: Fleet, postgres: Any) -> None:
    """PostgreSQL stopped for three leases: the daemons live on, their runs train on; when it returns they
    reconnect (LISTEN included: an abort is carried by NOTIFY again) and none marks another lost: a box
    cut off judges no one before a whole lease connected."""
    for name in ("box-a", "box-b"):
        fleet.up(name)
    store = fleet.store()
    try:
        running = {run: wait_for(f"{run} running", lambda run=run: _running(store, run)) for run in ("run-a", "run-b")}
    finally:
        store.close()
    postgres.stop("fast")
    try:
        time.sleep(LEASE_S * 3)
        assert all(proc.poll() is None for proc in fleet.procs.values()), "a daemon died with its database"
        for attempt in running.values():
            os.kill(attempt.pid, 0)  # the runs go on (raises if one is gone)
    finally:
        postgres.start()
    store = fleet.store()
    try:
        time.sleep(LEASE_S * 2)  # the lease connections back (backoff at most 5 s), renewing again
        asked = time.monotonic()
        out = babysit(fleet.box("box-a"), "abort", "run-b", timeout=60)
        assert out.returncode == 0 and "abort run-b: stopping" in out.stdout, (out.stdout, out.stderr)
        assert time.monotonic() - asked < 15
        time.sleep(LEASE_S * 2)  # more look-outs, now that both may judge again
        assert [m for m in store.messages("") if " lost" in m.payload.get("text", "")] == []
        assert all(h.lost_at is None for h in store.hosts())
    finally:
        store.close()


@pytest.mark.slow  # ~20 s of three daemons, one killed and started again
def test_a_poll_the_owning_box_died_in_is_answered_interrupted_by_it_alone_and_taken_once(fleet: Fleet) -> None:
    """A `/babysit poll` of box-b's run, asked from outside the boxes: box-b takes it, polls, and is SIGKILLed
    before writing the answer (crash point after-request). Neither box-a nor box-c takes the request up
    meanwhile (it is box-b's, and box-b's claim on it); box-b, started again, answers it `interrupted …` and
    takes no second on-demand poll."""
    for name in ("box-a", "box-c"):
        fleet.up(name)
    fleet.procs["box-b"] = up(fleet.box("box-b"), env={**box_env(fleet.box("box-b")),
                                                       "BABYSIT_CRASH_AT": "after-request"})
    store = fleet.store()
    try:
        for run in ("run-a", "run-b", "run-c"):
            wait_for(f"{run} running", lambda run=run: _running(store, run))
        request = store.request("run-b", "poll-now", "test", time.time())  # addressed to box-b, woken by NOTIFY
        assert fleet.procs["box-b"].wait(30) == -signal.SIGKILL, "box-b did not die at the crash point"
        fleet.procs.pop("box-b")

        def on_demand() -> list[int]:
            return [p.id for p in store.polls("run-b") if p.kind == "on-demand"]

        taken = on_demand()
        assert len(taken) == 1 and store.request_result(request) is None
        time.sleep(3)  # box-a and box-c go on: the request is not theirs to carry out
        assert store.request_result(request) is None and on_demand() == taken
        fleet.up("box-b")
        answer = wait_for("box-b's answer", lambda: store.request_result(request))
        assert answer.startswith("interrupted") and "babysit status run-b" in answer, answer
        time.sleep(1)
        assert on_demand() == taken  # taken once, by the box that owns the run
        assert all(p.kind != "on-demand" for run in ("run-a", "run-c") for p in store.polls(run))
    finally:
        store.close()


def test_an_abort_asked_on_a_box_whose_daemon_is_not_up_yet_waits_for_it_while_other_daemons_look(
        fleet: Fleet) -> None:
    """`babysit abort run-b` on box-b, its run registered but box-b's daemon not up (no box holds run-b in
    the database yet), while box-a's and box-c's daemons run and look at every request: neither takes it
    (before: the first to look answered `no run named run-b is babysat`, and box-b then launched run-b all
    the same); box-b's daemon, once up, takes it and stops run-b."""
    for name in ("box-a", "box-c"):
        fleet.up(name)
    store = fleet.store()
    try:
        for run in ("run-a", "run-c"):
            wait_for(f"{run} running", lambda run=run: _running(store, run))
        asked = babysit(fleet.box("box-b"), "abort", "run-b", "--wait", "3")
        assert asked.returncode == 0 and "queued" in asked.stdout, asked.stdout + asked.stderr
        (row,) = store._query("SELECT id, host, claimed_by, result FROM control WHERE run = 'run-b'")
        assert (row[1], row[2], row[3]) == ("box-b", None, None), row  # box-b's, and nobody took it meanwhile
        fleet.up("box-b")
        answer = wait_for("box-b's answer", lambda: store.request_result(row[0]))
        assert answer in ("stopping", "not running"), answer
        assert store._query("SELECT claimed_by FROM control WHERE id = ?", (row[0],))[0][0] == "box-b"
        wait_for("run-b stopped", lambda: store.run_state("run-b")[0] in ("stopped", "finished", "failed"))
        assert all(a.outcome == "stopped" for a in store.attempts("run-b")), store.attempts("run-b")
    finally:
        store.close()
