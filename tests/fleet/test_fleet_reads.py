"""The gateway's bot answers `/verdict RUN` and `/babysit chart RUN` for another box's run from the fleet's
database (that run's run.toml, log and chart are on its own box): the verdict rows that box stored, with
how old the read is and that box's staleness. A real `babysit bot --http` of box-a, really signed
requests, a real PostgreSQL in which box-b (a real lease, its store) owns two runs."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.slack.conftest import TOKEN
from tests.slack.fake_slack import FakeSlack
from tests.slack.test_bot_http import CHANNEL, SECRET, Bot, everything, responses, slash
from tests.support import run_toml


def _body(run: str, status: str, at_step: int) -> dict[str, Any]:
    return {"run": run, "status": status, "metric": "val_loss", "baseline_step": 250, "read_step": 1000,
            "at_step": at_step, "baseline": 2.5, "read": 2.25, "delta": -0.25, "rules": [],
            "label": "IMPROVED" if status == "FINAL" else "IMPROVING", "interpretation": "the loss fell",
            "corroboration": {"train_delta": None, "monotone_rise": False}, "prereg_sha256": "ab" * 32,
            "amendments": []}


@pytest.fixture
def gateway(tmp_path: Path, pg_url: str) -> Iterator[tuple[Bot, Any]]:
    from babysit.core.gpu import report as gpureport
    from babysit.db.fleet import FleetMember
    from babysit.db.postgres import PostgresStore
    from babysit.probes.gpu import FileGpuProbe

    gpus_b = tmp_path / "gpus-b.json"  # box-b's GPUs: its trainer's process and a stranger's
    gpus_b.write_text(json.dumps({"gpus": [
        {"index": i, "name": "Simulated B200", "uuid": f"GPU-b-{i}", "util_pct": 97 - i,
         "memory_used_bytes": 40 * 2**30, "memory_total_bytes": 180 * 2**30, "faults": [],
         "processes": [{"pid": 4242 + i, "name": "python", "used_memory_bytes": 30 * 2**30}]} for i in (0, 1)]}))
    probe = FileGpuProbe(gpus_b)
    # what box-b's daemon publishes with each renewal (service/fleet_report.py: FleetReport.read): it labels its own processes
    member = FleetMember(pg_url, "box-b", on_wake=lambda: None, on_alert=lambda: None, lease_s=30,
                         report=lambda: {"gpus": gpureport.to_json(probe.read([]), {4242: "early-b"}, time.time())})
    member.start()  # box-b's lease, as its daemon holds it
    box_b = PostgresStore(pg_url, host="box-b")  # what box-b's daemon stores
    now = box_b.now()
    box_b.quarantine_gpu("GPU-b-1", 1, "xid 79: fell off the bus", {}, now)
    box_b.claim_run("done-b", now)
    box_b.save_verdict("done-b", _body("done-b", "FINAL", 1000), now - 120, final=True,
                       chart_path="/srv/box-b/.babysit/verdicts/done-b.png")
    box_b.claim_run("early-b", now)
    box_b.save_verdict("early-b", _body("early-b", "PROVISIONAL", 500), now - 30, final=False)
    box_b.claim_run("fresh-b", now)

    root = tmp_path / "box-a"
    root.mkdir()
    (root / "babysit.toml").write_text(f'[daemon]\nchannel = "{CHANNEL}"\n[store]\nurl = "{pg_url}"\n'
                                       '[host]\nname = "box-a"\n')
    fake = FakeSlack(TOKEN).start()
    env = {**os.environ, "SLACK_BOT_TOKEN": TOKEN, "SLACK_SIGNING_SECRET": SECRET,
           "BABYSIT_SLACK_API_URL": fake.api_url, "BABYSIT_GPU_PROBE": "none"}
    for key in ("BABYSIT_STORE_URL", "BABYSIT_HOST"):
        env.pop(key, None)
    proc = subprocess.Popen([sys.executable, "-m", "babysit", "bot", "--http", "0", "--host", "127.0.0.1",
                             "--registry", str(root / "babysit.toml")], cwd=root, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline() if proc.stdout else ""
        assert "serving" in line, (line, proc.stderr.read() if proc.stderr else "")
        yield Bot(line.split("serving ", 1)[1].strip(), fake, root, proc), box_b
    finally:
        proc.terminate()
        proc.wait(10)
        fake.stop()
        box_b.close()
        member.close()


def test_verdict_of_another_box_s_run_is_its_stored_verdict_with_that_box_s_staleness(
        gateway: tuple[Bot, Any]) -> None:
    bot, _ = gateway
    _, ack, path = slash(bot, "/verdict", "done-b")
    assert "Reading the verdict" in ack["text"], ack  # before: "unknown run" (not in box-a's registry)
    (card,) = responses(bot, path)
    text = everything(card)
    assert "FINAL VERDICT" in text and "IMPROVED" in text, text
    assert "the FINAL verdict box box-b stored 12" in card["text"], card["text"]  # 120 s ago
    assert "box box-b: up, lease renewed" in card["blocks"][0]["elements"][0]["text"]

    _, _, path = slash(bot, "/verdict", "early-b post")
    (card,) = responses(bot, path)
    assert card["response_type"] == "in_channel"
    assert "PROVISIONAL — NOT A VERDICT" in everything(card) and "the last read box box-b stored 3" in card["text"]

    _, _, path = slash(bot, "/verdict", "fresh-b")
    (none,) = responses(bot, path)
    assert "No verdict for `fresh-b`" in none["text"] and "box box-b has stored no verdict" in none["text"], none


def test_chart_of_another_box_s_run_says_where_it_is_and_shows_the_stored_verdict(gateway: tuple[Bot, Any]) -> None:
    bot, _ = gateway
    _, ack, path = slash(bot, "/babysit", "chart done-b")
    assert "Drawing" in ack["text"], ack
    (reply,) = responses(bot, path)
    assert "box box-b drew it at /srv/box-b/.babysit/verdicts/done-b.png" in reply["text"], reply["text"]
    assert "FINAL VERDICT" in everything(reply) and "box box-b: up" in reply["text"]
    assert not bot.fake.calls_to("files.completeUploadExternal")  # nothing uploaded: the file is on box-b


def test_gpus_shows_every_box_with_its_reading_s_age_and_its_own_labels(gateway: tuple[Bot, Any]) -> None:
    """box-a's bot (no GPU probe here) answers for box-b's GPUs as box-b published them with its lease:
    box-b's own process labels (pid 4242 is box-b's run; 4243 FOREIGN there), its quarantine, the age."""
    bot, _ = gateway
    _, ack, path = slash(bot, "/babysit", "gpus")
    assert "Reading the GPUs" in ack["text"], ack
    (reply,) = responses(bot, path)
    text = reply["text"]
    assert "GPUs of the fleet, 2 box(es)" in text, text  # before: box-a's GPUs alone ("not measured")
    assert "box box-a (this box) — read now" in text and "GPUs not measured" in text, text
    assert re.search(r"box box-b: up, lease renewed \d+ s ago — read \d+ s ago", text), text
    assert "GPU 0 Simulated B200: util 97%" in text and "pid 4242 python 30.0 GiB → early-b" in text, text
    assert "pid 4243 python 30.0 GiB → FOREIGN" in text, text
    assert "GPU 1 Simulated B200: util 96%" in text and "QUARANTINED: xid 79: fell off the bus" in text, text


def _own_run(root: Path, store: Any, run: str, *, step: int, logged: int) -> None:
    """A run of box-a (the gateway's box) as its daemon leaves it: registered, running, its step stored."""
    from datetime import datetime, timezone

    from babysit.runtime import registry

    spec = root / f"{run}.toml"
    spec.write_text(run_toml(run, ["python", "train.py"], log=f"{run}.jsonl", gpus=[]))
    now = time.time()
    (root / f"{run}.jsonl").write_text("".join(json.dumps({"step": s, "ts": now - 100 + s * 0.2, "loss": 1 / s}) + "\n"
                                               for s in range(1, logged + 1)))
    entry = registry.RunEntry(run, spec.name, registry.utc_timestamp(datetime.now(timezone.utc)))
    registry.update(root / "babysit.toml", lambda reg: (registry.with_run(reg, entry)[0], None))
    store.claim_run(run, now)
    attempt = store.begin_attempt(run, 1, "default", ["python", "train.py"], "local", 0, str(root), now - 100)
    store.mark_running(attempt.id, started_at=now - 100, pid=None)
    store.set_run_state(run, "running", now, step=step, last_record_at=now - 5)


def test_status_answers_every_box_from_the_database_and_sees_new_registrations(
        gateway: tuple[Bot, Any], pg_url: str) -> None:
    """The gateway's status reads no log, its own box's included: each run's step is what its daemon stored
    (box-a's own-a: 20, though its log is at 400: the same source as every other box's runs), in five
    queries whatever the number of runs; its reader is kept across commands and still sees a run registered
    after the first answer, and a box's staleness line for every box."""
    from babysit.db.postgres import PostgresStore

    bot, _ = gateway
    box_a = PostgresStore(pg_url, host="box-a")
    try:
        _own_run(bot.root, box_a, "own-a", step=20, logged=400)
        _, ack, _ = slash(bot, "/babysit", "status")
        text = ack["text"]
        (line,) = [ln for ln in text.splitlines() if ln.startswith("own-a ")]
        assert " 20 " in line and "400" not in line, line  # before: the log's 400 (its tail read per command)
        assert "done-b" in text and "box box-b: up" in text, text
        _own_run(bot.root, box_a, "own-a2", step=7, logged=9)  # registered after the reader was made
        _, ack, _ = slash(bot, "/babysit", "runs")
        assert "`own-a2` — running" in ack["text"] and "`own-a` — running" in ack["text"], ack["text"]
    finally:
        box_a.close()


def test_campaign_of_another_box_is_shown_from_the_database_with_that_box_s_staleness(
        gateway: tuple[Bot, Any], tmp_path: Path, pg_url: str) -> None:
    """`babysit campaign register` ran on box-b (its file is there, not on box-a): box-a's bot shows the
    campaign as registered (question, suspects, banked runs), its runs' verdicts and where the file is."""
    bot, box_b = gateway
    home = tmp_path / "box-b"
    home.mkdir()
    (home / "babysit.toml").write_text(f'[store]\nurl = "{pg_url}"\n[host]\nname = "box-b"\n')
    spec = home / "campaign.toml"
    spec.write_text('[campaign]\nname = "saga"\nquestion = "why does the eval drift?"\n'
                    '[[suspects]]\nname = "lr"\n[[suspects]]\nname = "augment"\nstatus = "exonerated"\n'
                    '[[banked]]\nname = "old_run"\ndelta = 0.02\n')
    env = {**os.environ}
    for key in ("BABYSIT_STORE_URL", "BABYSIT_HOST"):
        env.pop(key, None)
    out = subprocess.run([sys.executable, "-m", "babysit", "campaign", "register", str(spec), "--registry",
                          str(home / "babysit.toml")], cwd=home, env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    box_b.add_campaign_run("done-b", "saga", str(home / "done-b.toml"), None, "lr", {"summary": "the baseline"},
                           "{}", "0" * 64, box_b.now())
    spec.rename(home / "moved.toml")  # on box-b's disk, not box-a's: box-a cannot read it
    _, ack, _ = slash(bot, "/babysit", "campaign saga")
    text = ack["text"]
    assert "why does the eval drift?" in text and "augment" in text and "done-b" in text, text
    assert "IMPROVED" in text, text  # done-b's FINAL verdict, as box-b stored it
    assert f"From the fleet's database: saga's file {spec} is on box box-b; its question, suspects and banked " \
           "runs as registered" in text, text  # before: "babysit could not answer /babysit campaign"
    assert re.search(r"box box-b: up, lease renewed \d+ s ago", text), text


def test_a_request_for_a_lost_box_s_run_says_so_at_once_and_stays_queued(gateway: tuple[Bot, Any]) -> None:
    """box-c is lost (no lease renewal for two minutes; box-b noticed): `/babysit poll` and the abort of its
    run are queued for it (carried out when it comes back), and the asker is told at once that box-c is
    lost, with its staleness, instead of after the wait a daemon that is up gets, in words naming no box."""
    bot, box_b = gateway
    now = box_b.now()
    with box_b.tx() as db:
        db.execute("INSERT INTO hosts (name, started_at, renewed_at, lease_until, pid, info, lost_at)"
                   " VALUES ('box-c', ?, ?, ?, 1, '{}', ?)", (now - 3600, now - 120, now - 90, now - 60))
        db.execute("INSERT INTO runs (run, host, registered_at) VALUES ('rc', 'box-c', ?)", (now - 3600,))
    _, ack, path = slash(bot, "/babysit", "poll rc")
    assert "Poll of `rc` requested" in ack["text"], ack
    (told,) = responses(bot, path, timeout=8)  # before: only after the 10-s wait
    assert "box box-c: LOST, lease renewed 1" in told["text"], told["text"]
    assert "queued" in told["text"] and "when box box-c is back" in told["text"], told["text"]
    rows = box_b._query("SELECT run, action, host, handled_at FROM control ORDER BY id")
    assert [(r[0], r[1], r[2], r[3]) for r in rows] == [("rc", "poll-now", "box-c", None)]  # box-c's, still owed
