"""A real daemon through a 30-s PostgreSQL outage (`pg_ctl stop`, then start) on the local Slack server: a
run ends while the database is down and its FINAL verdict lands meanwhile (posted at once: Slack is
reachable), another run trains on untouched; when PostgreSQL returns the journal is replayed: every post
is in the outbox as sent, each delivered to Slack exactly once (counted by its outbox id in the message
metadata), the attempt's end and the verdict are in the database (docs/fleet.md, "The database down")."""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from tests.fleet.helpers import (
    FAKE,
    GATED,
    PREREG,
    PY,
    babysit,
    box_env,
    kill_trainers,
    outage_spec,
    pg_store,
    posted_ids,
    stop,
)
from tests.reliability.harness import gpu_file
from tests.slack.conftest import TOKEN
from tests.slack.fake_slack import FakeSlack
from tests.support import wait_for

OUTAGE_S = 30.0



@pytest.mark.slow  # ~60 s: a 30-s outage and a daemon's start (CI runs it with the slow tests)
def test_a_run_ending_and_its_verdict_during_a_30s_outage_are_posted_once_and_replayed(
        tmp_path: Path, pg_url: str, postgres: Any) -> None:
    box = tmp_path / "box-a"
    box.mkdir()
    gpu_file(box / "gpus.json")
    (box / "babysit.toml").write_text(f'[daemon]\nchannel = "C0RUNS"\nguard_interval_seconds = 60\n'
                                      f'[store]\nurl = "{pg_url}"\n[host]\nname = "box-a"\nlease_seconds = 3\n')
    gate = box / "gate"
    ends = outage_spec(box, "ends", [PY, str(GATED), "outputs/ends/train_log.jsonl", str(gate)], prereg=PREREG)
    trains = outage_spec(box, "trains", [PY, str(FAKE), "outputs/trains/train_log.jsonl", "--steps", "100000",
                                   "--sleep", "0.5"])
    for spec in (ends, trains):
        out = babysit(box, "register", str(spec), "--accelerated")
        assert out.returncode == 0, out.stderr
    fake = FakeSlack(TOKEN).start()
    env = {**box_env(box), "SLACK_BOT_TOKEN": TOKEN, "BABYSIT_SLACK_API_URL": fake.api_url}
    env.pop("BABYSIT_SLACK_CHANNEL", None)
    with open(box / "daemon-out.txt", "wb") as out:
        proc = subprocess.Popen([PY, "-m", "babysit", "up", "--accelerated", "--registry", str(box / "babysit.toml")],
                                cwd=box, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    store = pg_store(pg_url)
    trainer_pid = None
    try:
        running = wait_for("both runs running and announced", lambda: len(
            [a for a in store.live_attempts() if a.status == "running"]) == 2 and store.pending_count() == 0
            and len(posted_ids(fake)) >= 2, timeout=90)
        assert running
        trainer_pid = next(a.pid for a in store.live_attempts() if a.run == "trains")
        store.close()

        postgres.stop("fast")
        down_at = time.monotonic()
        try:
            gate.touch()  # the gated run ends now, with the database down
            verdict_post = wait_for("the FINAL verdict posted while PostgreSQL is down", lambda: [
                m for m in fake.messages if "FINAL" in json.dumps(m.get("blocks") or m.get("text"))],
                timeout=90)  # the outage lasts at least OUTAGE_S, longer if a loaded machine is slow to read it
            assert verdict_post
            assert proc.poll() is None, "the daemon died with its database"
            time.sleep(max(0.0, OUTAGE_S - (time.monotonic() - down_at)))
            os.kill(trainer_pid, 0)  # the other run trains on (raises if it is gone)
        finally:
            postgres.start()

        store = pg_store(pg_url)
        final = wait_for("the verdict replayed into PostgreSQL", lambda: store.final_verdict("ends"), timeout=30)
        assert final.kind == "FINAL"
        (attempt,) = store.attempts("ends")
        assert attempt.status == "ended" and attempt.outcome == "completed", attempt
        assert store.run_state("trains")[0] == "running"
        wait_for("every post delivered", lambda: store.pending_count() == 0, timeout=30)
        sent = {m.id for m in store.messages() if m.status == "sent" and m.kind != "header"}
        posted = posted_ids(fake)
        assert [i for i, n in posted.items() if n > 1] == [], "a post was delivered twice"
        assert set(posted) == sent, (sorted(posted), sorted(sent))  # none lost, none unrecorded
        assert all(m.status == "sent" for m in store.messages()), [(m.id, m.kind, m.status) for m in store.messages()]
        daemon_log = box / ".babysit" / "daemon.log"
        assert "PostgreSQL unreachable: babysitting on, journaling locally" in daemon_log.read_text()
        # the replay commits as it goes: rows are visible before the store is connected again and says so
        replays = wait_for("the replay's end logged", lambda: [
            float(x) for x in re.findall(r'"replay_s": ([0-9.]+)', daemon_log.read_text())], timeout=30)
        assert max(replays) <= 10, replays
    finally:
        stop(proc)
        if not postgres.running():
            postgres.start()
        kill_trainers(pg_url)
        fake.stop()
