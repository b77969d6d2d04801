"""A campaign across boxes (docs/fleet.md, docs/campaigns.md): box-b's runs (real CPU trainers under box-b's
real daemon on a real PostgreSQL) settle a campaign step; its actions are carried out on box-b, where the
verdict was read and the run's files are (its checkpoints banked with a verified manifest, the next run
proposed as a file, an owner call posted by box-b), nothing on box-a; and box-a's gateway bot (a real
`babysit bot --http`, signed requests) shows the step from the database once the campaign's file is out of
its reach: the suspect convicted, both runs' labels, the open owner call."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from babysit.campaign import actions
from babysit.runtime import registry
from tests.campaign.test_campaign_e2e import write
from tests.slack.conftest import TOKEN
from tests.slack.fake_slack import FakeSlack
from tests.slack.test_bot_http import CHANNEL, SECRET, Bot, slash

pytestmark = pytest.mark.slow


def _babysit(root: Path, *args: str, env: dict[str, str], timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "babysit", *args, "--registry", str(root / "babysit.toml")],
                          cwd=root, env=env, capture_output=True, text=True, timeout=timeout)


def test_a_campaign_step_of_box_b_s_run_is_carried_out_on_box_b_and_shown_by_box_a_s_gateway(
        tmp_path: Path, pg_url: str) -> None:
    from babysit.db.postgres import PostgresStore

    box_a, box_b = tmp_path / "box-a", tmp_path / "box-b"
    box_a.mkdir()
    box_b.mkdir()
    write(box_b)  # the e2e campaign: base, then lr_quarter (a quarter of the learning rate) on box-b
    fleet = f'[store]\nurl = "{pg_url}"\n'
    (box_b / "babysit.toml").write_text((box_b / "babysit.toml").read_text() + fleet + '[host]\nname = "box-b"\n')
    (box_a / "babysit.toml").write_text(f'[daemon]\nchannel = "{CHANNEL}"\n{fleet}[host]\nname = "box-a"\n')
    fake = FakeSlack(TOKEN).start()
    env = {**os.environ, "SLACK_BOT_TOKEN": TOKEN, "SLACK_SIGNING_SECRET": SECRET,
           "BABYSIT_SLACK_API_URL": fake.api_url, "BABYSIT_GPU_PROBE": "none"}
    for key in ("BABYSIT_STORE_URL", "BABYSIT_HOST"):
        env.pop(key, None)
    store = PostgresStore(pg_url, host="test")
    bot = None
    try:
        registered = _babysit(box_b, "campaign", "register", str(box_b / "campaign.toml"), env=env)
        assert registered.returncode == 0, registered.stderr
        for spec in ("runs/base.toml", "runs/lr_quarter.toml"):
            done = _babysit(box_b, "register", spec, "--accelerated", env=env)
            assert done.returncode == 0, done.stderr
        up = _babysit(box_b, "up", "--accelerated", "--exit-when-idle", "--no-view", env=env)
        assert up.returncode == 0, up.stderr[-3000:]

        # the step, on box-b: read there, carried out there
        assert store.final_verdict("lr_quarter").body["label"] == "FALLING"
        assert store.run_hosts() == {"base": "box-b", "lr_quarter": "box-b"}
        moves = [e.body for e in store.campaign_events("tiny_saga", "suspect")]
        assert {"suspect": "lr", "status": "convicted", "run": "lr_quarter", "label": "FALLING"} in moves
        (call,) = store.owner_calls("tiny_saga")
        assert call.run == "lr_quarter" and call.decision is None
        bank = actions.verify(box_b / "banked" / "lr_quarter")  # the checkpoints, on the box that has them
        assert bank["verified"] and {f["path"] for f in bank["files"]} >= {"step_000150.pt", "latest"}
        assert (box_b / "proposals" / "tiny_saga_batch.toml").is_file()
        assert not (box_a / "banked").exists() and not (box_a / "proposals").exists()
        assert registry.load(box_b / "babysit.toml").names == ("base", "lr_quarter")  # proposed, not registered
        calls = [r for r in store._query("SELECT kind, host, status FROM outbox") if r["kind"] == "owner-call"]
        assert [(r["host"], r["status"]) for r in calls] == [("box-b", "sent")], calls  # posted by box-b, once

        # box-a's gateway, the campaign's file out of its reach (it is on box-b's disk)
        (box_b / "campaign.toml").rename(box_b / "campaign.moved")
        proc = subprocess.Popen([sys.executable, "-m", "babysit", "bot", "--http", "0", "--host", "127.0.0.1",
                                 "--registry", str(box_a / "babysit.toml")], cwd=box_a, env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        line = proc.stdout.readline() if proc.stdout else ""
        bot = Bot(line.split("serving ", 1)[1].strip() if "serving" in line else "", fake, box_a, proc)
        assert "serving" in line, (line, proc.stderr.read() if proc.stderr else "")
        _, ack, _ = slash(bot, "/babysit", "campaign tiny_saga")
        text = ack["text"]
        assert "From the fleet's database: tiny_saga's file" in text and "is on box box-b" in text, text
        assert "convicted" in text and "FALLING" in text and "FLAT" in text, text  # the step and both reads
        assert "lr_quarter" in text and "base" in text, text
        assert f"call #{call.id} (lr_quarter): OPEN" in text, text  # box-b's owner call, answerable from here
    finally:
        if bot is not None:
            bot.proc.terminate()
            bot.proc.wait(10)
        store.close()
        fake.stop()
