"""A daemon (re)started while PostgreSQL is down (docs/fleet.md, "The database down"): with the box's local
mirror it starts from it, numbering its rows from the ids its predecessor reserved, and catches the
database up once it is back; without one it refuses, saying what to do. Against a real PostgreSQL
stopped and started (`pg_ctl`)."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from babysit.core.errors import StateError
from babysit.db.postgres import PostgresStore
from tests.fleet.helpers import GATED, PREREG, PY, babysit, box_env, kill_trainers, outage_spec, posted_ids, stop, up
from tests.reliability.harness import gpu_file
from tests.slack.conftest import TOKEN
from tests.slack.fake_slack import FakeSlack
from tests.support import wait_for


def test_a_store_restarted_while_down_numbers_rows_from_its_saved_reserve_and_catches_up(
        pg_url: str, tmp_path: Path, outage: Callable[[], None], postgres: Any) -> None:
    first = PostgresStore(pg_url, host="box-a", state_dir=tmp_path, may_start_down=True)
    first.claim_run("r1", 1.0)
    first.start_journal()
    one = first.begin_attempt("r1", 1, "base", ["true"], "local", 0, "a1", 1.0)
    box_b = PostgresStore(pg_url, host="box-b", state_dir=tmp_path / "b", may_start_down=True)
    (tmp_path / "b").mkdir()
    box_b.claim_run("rb", 1.0)
    box_b.start_journal()  # another box's daemon: its own blocks of the same sequences
    first.close()
    outage()
    again = PostgresStore(pg_url, host="box-a", state_dir=tmp_path, may_start_down=True)
    other = None
    try:
        assert again.started_down is not None
        again.start_journal()
        assert again.down
        assert [a.id for a in again.attempts("r1")] == [one.id]  # the mirror its predecessor kept
        again.mark_ended(one.id, ended_at=2.0, outcome="crashed", exit_code=1)
        two = again.begin_attempt("r1", 2, "base", ["true"], "local", 0, "a2", 3.0)
        assert two.id > one.id
        assert again.claim_run("r1", 3.0) == "box-a"
        with pytest.raises(StateError, match="not this box's yet"):
            again.claim_run("new-run", 3.0)
        postgres.start()
        box_b_attempt = box_b.begin_attempt("rb", 1, "base", ["true"], "local", 0, "b1", 4.0)  # its connection back
        wait_for("the journal replayed", lambda: not again.down and again.journal_pending() == 0)
        other = PostgresStore(pg_url, host="cli")  # a CLI process: the sequence's own next id
        cli_incident = other.add_incident("r1", None, 5.0, "by-hand", {})
        assert [(a.id, a.n, a.status) for a in other.attempts("r1")] == [(one.id, 1, "ended"), (two.id, 2, "launching")]
        assert len({two.id, box_b_attempt.id, one.id}) == 3
        mine = again.add_incident("r1", None, 6.0, "mine", {})
        assert mine != cli_incident
        assert sorted((r.id, r.kind) for r in other.incidents("r1")) == sorted([(mine, "mine"), (cli_incident, "by-hand")])
    finally:
        again.close()
        box_b.close()
        if other is not None:
            other.close()


def test_a_store_started_while_down_without_a_mirror_refuses_saying_what_to_do(
        pg_url: str, tmp_path: Path, outage: Callable[[], None]) -> None:
    outage()
    with pytest.raises(StateError, match="no local mirror of its runs") as refused:
        PostgresStore(pg_url, host="box-a", state_dir=tmp_path, may_start_down=True)
    assert "start PostgreSQL" in (refused.value.hint or "")
    with pytest.raises(StateError, match="cannot open the state database"):
        PostgresStore(pg_url, host="box-a", state_dir=tmp_path)  # the CLI's store: never from a mirror


CRASHER = """import os, sys, time
log, gate = sys.argv[1], sys.argv[2]
os.makedirs(os.path.dirname(os.path.abspath(log)), exist_ok=True)
with open(log, "a") as f:
    step = 0
    while True:
        step += 1
        f.write('{"step": %d, "train_loss": 1.0}\\n' % step)
        f.flush()
        if "--crash" in sys.argv and os.path.exists(gate):
            sys.exit(1)
        time.sleep(0.5)
"""



@pytest.mark.slow  # ~50 s: two daemons' starts, runs launched, a retry and a verdict while down
def test_a_daemon_restarted_while_postgres_is_down_babysits_its_runs_from_the_mirror(
        tmp_path: Path, pg_url: str, postgres: Any) -> None:
    box = tmp_path / "box-a"
    box.mkdir()
    gpu_file(box / "gpus.json")
    (box / "babysit.toml").write_text(f'[daemon]\nchannel = "C0RUNS"\nguard_interval_seconds = 60\n'
                                      f'[store]\nurl = "{pg_url}"\n[host]\nname = "box-a"\nlease_seconds = 3\n')
    (box / "crasher.py").write_text(CRASHER)
    gate, crash = box / "gate", box / "crash"
    ends = outage_spec(box, "ends", [PY, str(GATED), "outputs/ends/train_log.jsonl", str(gate)], prereg=PREREG)
    retries = outage_spec(box, "retries", [PY, str(box / "crasher.py"), "outputs/retries/train_log.jsonl", str(crash)],
                          retry={"on": ["crashed"]}, attempts={"first": ["--crash"], "second": []})
    for spec in (ends, retries):
        out = babysit(box, "register", str(spec), "--accelerated")
        assert out.returncode == 0, out.stderr
    fake = FakeSlack(TOKEN).start()
    env = {**box_env(box), "SLACK_BOT_TOKEN": TOKEN, "BABYSIT_SLACK_API_URL": fake.api_url}
    env.pop("BABYSIT_SLACK_CHANNEL", None)
    first = up(box, env, "daemon-1.txt")
    second = None
    store = PostgresStore(pg_url, host="test")
    try:
        wait_for("both runs running and announced", lambda: len(
            [a for a in store.live_attempts() if a.status == "running"]) == 2 and store.pending_count() == 0
            and len(posted_ids(fake)) >= 2, timeout=90)
        trainers = {a.run: a.pid for a in store.live_attempts()}
        store.close()
        first.kill()  # SIGKILL: the daemon alone, its trainers run on
        first.wait(10)
        postgres.stop("fast")
        try:
            second = up(box, env, "daemon-2.txt")
            daemon_log = box / ".babysit" / "daemon.log"
            wait_for("the start from the mirror said", lambda: "babysits its runs from its local mirror"
                     in daemon_log.read_text(), timeout=60)
            for pid in trainers.values():
                os.kill(pid, 0)  # adopted, not relaunched: still running
            gate.touch()  # `ends` finishes: its FINAL verdict lands while the database is down
            crash.touch()  # `retries` crashes: its next declared profile is launched while down
            wait_for("the FINAL verdict posted while down", lambda: [
                m for m in fake.messages if "FINAL" in json.dumps(m.get("blocks") or m.get("text"))], timeout=90)
            wait_for("the retry's launch posted while down", lambda: [
                m for m in fake.messages if "attempt 2" in json.dumps(m.get("blocks") or m.get("text"))], timeout=60)
            assert second.poll() is None, "the daemon started while down died"
        finally:
            postgres.start()
        store = PostgresStore(pg_url, host="test")
        final = wait_for("the verdict replayed into PostgreSQL", lambda: store.final_verdict("ends"), timeout=30)
        assert final.kind == "FINAL"
        attempts = store.attempts("retries")
        assert [(a.n, a.status, a.outcome) for a in attempts] == [(1, "ended", "crashed"), (2, "running", None)]
        assert attempts[0].pid == trainers["retries"]
        assert store.attempts("ends")[0].pid == trainers["ends"]  # the same trainer, seen to its end
        wait_for("every post delivered", lambda: store.pending_count() == 0, timeout=30)
        posted = posted_ids(fake)
        assert [i for i, n in posted.items() if n > 1] == [], "a post was delivered twice"
        sent = {m.id for m in store.messages() if m.status == "sent" and m.kind != "header"}
        assert set(posted) == sent, (sorted(posted), sorted(sent))
        host = wait_for("the lease taken once the database is back", lambda: [
            h for h in store.hosts() if h.name == "box-a" and h.pid == second.pid])
        assert host
    finally:
        for proc in (first, second):
            if proc is not None:
                stop(proc)
        if not postgres.running():
            postgres.start()
        kill_trainers(pg_url)
        store.close()
        fake.stop()


def test_status_on_a_box_whose_postgres_is_down_shows_its_runs_from_the_mirror_saying_so(
        tmp_path: Path, pg_url: str, outage: Callable[[], None], postgres: Any) -> None:
    box = tmp_path / "box-a"
    box.mkdir()
    gpu_file(box / "gpus.json")
    (box / "babysit.toml").write_text(f'[store]\nurl = "{pg_url}"\n[host]\nname = "box-a"\n')
    spec = outage_spec(box, "r1", [PY, "-c", "pass"])
    assert babysit(box, "register", str(spec)).returncode == 0
    outage()
    refused = babysit(box, "status")  # no daemon ever ran here: no mirror, the database's error as before
    assert refused.returncode != 0 and "cannot open the state database" in refused.stderr
    postgres.start()
    daemon = PostgresStore(pg_url, host="box-a", state_dir=box / ".babysit", may_start_down=True)
    daemon.claim_run("r1", 1.0)
    daemon.start_journal()  # what `babysit up` does: the mirror
    attempt = daemon.begin_attempt("r1", 1, "base", ["python"], "local", 1, "a1", time.time())
    daemon.mark_running(attempt.id, started_at=time.time(), pid=os.getpid())
    daemon.set_run_state("r1", "running", time.time(), step=7)
    outage()
    daemon.add_incident("r1", 1, time.time(), "while-down", {})  # the daemon babysits on, journaling
    try:
        shown = babysit(box, "status")
        assert shown.returncode == 0, shown.stderr
        banner, *rest = shown.stdout.splitlines()
        assert "the database cannot be reached" in banner and "local mirror" in banner and " ago" in banner
        assert any(line.split()[:2] == ["r1", "running"] for line in rest), shown.stdout
        as_json = json.loads(babysit(box, "status", "--json").stdout)
        assert [(r["run"], r["status"]) for r in as_json] == [("r1", "running")]
        from babysit.view.runview import Reader
        from babysit.view.watch import _look

        reader = Reader(box / "babysit.toml")  # the live view of `babysit up` (and `status --watch`)
        try:
            rows, _, footer = _look(reader, None, time.time(), "babysit up")
            assert [r.run for r in rows or []] == ["r1"] and "local mirror" in footer
        finally:
            reader.close()
    finally:
        daemon.close()
    postgres.start()
    back = babysit(box, "status")
    assert back.returncode == 0 and "cannot be reached" not in back.stdout


def test_a_mirror_without_reserved_ids_is_not_started_from(
        pg_url: str, tmp_path: Path, outage: Callable[[], None]) -> None:
    """A mirror an older babysit made holds runs but no reserve: a daemon started from it could number
    nothing it writes, so it is refused like no mirror at all."""
    store = PostgresStore(pg_url, host="box-a", state_dir=tmp_path, may_start_down=True)
    store.claim_run("r1", 1.0)
    store.start_journal()
    store._db.local.execute("DELETE FROM id_reserve")
    store.close()
    outage()
    with pytest.raises(StateError, match=r"no local\s+mirror of its runs"):
        PostgresStore(pg_url, host="box-a", state_dir=tmp_path, may_start_down=True)
