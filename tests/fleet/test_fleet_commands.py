"""Every command of a box configured for PostgreSQL reads and writes that PostgreSQL, never a stray
`.babysit/state.db`: `babysit relaunch` (its checks, its request, the daemon's answer) and `babysit run`
(babysat in its own process, and followed while a `babysit up` babysits it), each with real daemons and a
real trainer against the real PostgreSQL the tests start."""

from __future__ import annotations

import subprocess
from pathlib import Path

from babysit.runtime.wake import daemon_pid
from tests.fleet.helpers import FAKE, PY, babysit, box_env, fleet_box, pg_store, run_toml
from tests.reliability.harness import gpu_file
from tests.support import wait_for


def _box(root: Path, url: str, name: str = "box-a") -> Path:
    root.mkdir(parents=True, exist_ok=True)
    gpu_file(root / "gpus.json")
    (root / "babysit.toml").write_text(f'[store]\nurl = "{url}"\n[host]\nname = "{name}"\nlease_seconds = 3\n')
    return root


def _again(box: Path, command: list[str]) -> Path:
    return run_toml(box, "again", command, gpus=None, log="outputs/{name}/log.jsonl", grace_s=5, stall_min=None,
                    poll_min=(60, 60))


def _up_until_idle(box: Path) -> subprocess.CompletedProcess[str]:
    return babysit(box, "up", "--accelerated", "--exit-when-idle", "--no-view", timeout=120)


def test_relaunch_on_a_postgres_box_checks_and_asks_through_postgres_not_a_state_db(
        tmp_path: Path, pg_url: str) -> None:
    box = _box(tmp_path / "box-a", pg_url)
    fixed = [PY, str(FAKE), "outputs/again/log.jsonl", "--steps", "4", "--sleep", "0.05"]
    spec = _again(box, [*fixed[:3], "--stpes", *fixed[4:]])  # a typo'd flag: the trainer's argparse exits 2
    assert babysit(box, "register", str(spec), "--accelerated").returncode == 0
    first = _up_until_idle(box)
    assert first.returncode == 0, first.stdout + first.stderr
    store = pg_store(pg_url)
    try:
        assert store.run_state("again")[0] == "failed" and len(store.attempts("again")) == 1
        _again(box, fixed)
        asked = babysit(box, "relaunch", "again", "--accelerated", "--wait", "0")
        # before: "again has not been launched yet" (it looked for .babysit/state.db, which a fleet has not)
        assert asked.returncode == 0, asked.stdout + asked.stderr
        assert "relaunching again after attempt 1" in asked.stdout and "queued" in asked.stdout, asked.stdout
        queued = store._query("SELECT action, host, handled_at FROM control WHERE run=?", ("again",))
        assert [tuple(r) for r in queued] == [("relaunch", "box-a", None)]  # a row of the PostgreSQL, for box-a
        again = _up_until_idle(box)
        assert again.returncode == 0, again.stdout + again.stderr
        attempts = store.attempts("again")
        assert [a.n for a in attempts] == [1, 2] and attempts[1].outcome == "completed", attempts
        assert store._query("SELECT handled_at IS NOT NULL FROM control WHERE run=?", ("again",))[0][0]
    finally:
        store.close()
    assert not (box / ".babysit" / "state.db").exists(), "a command opened SQLite on a PostgreSQL box"


def test_babysit_run_on_a_postgres_box_babysits_and_follows_through_postgres(tmp_path: Path, pg_url: str) -> None:
    box = _box(tmp_path / "box-a", pg_url)
    cmd = [PY, str(FAKE), "outputs/solo/log.jsonl", "--steps", "4", "--sleep", "0.05"]
    # no `babysit up`: babysat in this process; how it ended is read back from the PostgreSQL
    here = subprocess.run([PY, "-m", "babysit", "run", "--name", "solo", "--accelerated", "--no-view",
                           "--registry", str(box / "babysit.toml"), "--", *cmd], cwd=box, env=box_env(box),
                          capture_output=True, text=True, timeout=120)
    # before: "solo is pending (the daemon stopped before it ended)", exit 6, read from a fresh state.db
    assert here.returncode == 0, here.stdout + here.stderr
    assert "solo finished: completed after 1 attempt(s)" in here.stdout, here.stdout

    # with a `babysit up` holding the box: `babysit run` follows it (its messages from the PostgreSQL)
    up = subprocess.Popen([PY, "-m", "babysit", "up", "--accelerated", "--no-view", "--registry",
                           str(box / "babysit.toml")], cwd=box, env=box_env(box),
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        wait_for("the daemon up", lambda: daemon_pid(box / ".babysit") == up.pid, timeout=60)
        cmd = [PY, str(FAKE), "outputs/followed/log.jsonl", "--steps", "6", "--sleep", "0.2"]
        followed = subprocess.run([PY, "-m", "babysit", "run", "--name", "followed", "--accelerated", "--no-view",
                                   "--registry", str(box / "babysit.toml"), "--", *cmd], cwd=box, env=box_env(box),
                                  capture_output=True, text=True, timeout=120)
        assert followed.returncode == 0, followed.stdout + followed.stderr
        assert "babysits followed; following it here" in followed.stdout, followed.stdout
        assert "followed finished: completed after 1 attempt(s)" in followed.stdout, followed.stdout
        assert "launched" in followed.stdout.lower(), followed.stdout  # the launch message, read from PostgreSQL
    finally:
        up.terminate()
        up.wait(30)
    store = pg_store(pg_url)
    try:
        assert store.run_hosts() == {"solo": "box-a", "followed": "box-a"}
        assert store.attempts("followed")[0].outcome == "completed"
    finally:
        store.close()
    assert not (box / ".babysit" / "state.db").exists(), "a command opened SQLite on a PostgreSQL box"


def test_an_abort_of_a_run_no_box_has_taken_up_yet_is_this_box_s_not_the_first_box_s_to_look(
        tmp_path: Path, pg_url: str) -> None:
    """box-a's `babysit abort r1` before box-a's daemon has taken r1 up (no box holds it in the database yet):
    the request is box-a's, as r1 is in box-a's registry; box-c's daemon, looking first, leaves it (before:
    box-c took it and answered `no run named r1 is babysat`, and box-a's daemon then launched r1 all the
    same)."""
    box = fleet_box(tmp_path, pg_url)
    got = babysit(box, "abort", "r1", "--wait", "0")
    assert got.returncode == 0 and "queued" in got.stdout, got.stdout + got.stderr
    box_c, box_a = pg_store(pg_url, "box-c"), pg_store(pg_url, "box-a")
    try:
        assert box_c.pending_requests() == []  # another box's daemon's look
        assert [(q.run, q.kind) for q in box_a.pending_requests()] == [("r1", "abort")]  # r1's box's
    finally:
        box_c.close()
        box_a.close()
