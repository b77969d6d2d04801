"""`/babysit relaunch RUN` for another box's run (docs/fleet.md): box-a's gateway bot (a real Bolt app,
signed requests) queues the relaunch as a request addressed to box-b, whose real daemon checks and
re-registers the run.toml there (its file), relaunches it and answers through the response_url; a second
relaunch of the now running run is refused by box-b with its reason."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from babysit.runtime import registry
from tests.fleet.helpers import FAKE, PY, babysit, box_env
from tests.reliability.harness import gpu_file
from tests.slack.conftest import TOKEN
from tests.slack.fake_slack import FakeSlack
from tests.slack.test_bot_http import SECRET, sign
from tests.support import TRAIN_LOG, run_toml, wait_for

ADMIN = "U0ADMIN01"


def _slash(app: Any, fake: FakeSlack, text: str, path: str) -> dict[str, Any]:
    from slack_bolt.request import BoltRequest

    body = urlencode({"token": "legacy", "team_id": "T0001", "channel_id": "C0RUNS", "user_id": ADMIN,
                      "command": "/babysit", "text": text, "response_url": fake.base + path, "trigger_id": path})
    ts = int(time.time())
    resp = app.dispatch(BoltRequest(body=body, headers={
        "content-type": ["application/x-www-form-urlencoded"], "x-slack-request-timestamp": [str(ts)],
        "x-slack-signature": [sign(body, ts, SECRET)]}))
    assert resp.status == 200, resp.body
    return json.loads(resp.body)


def _answers(fake: FakeSlack, path: str) -> list[str]:
    return [str(c.body["text"]) for c in fake.calls_to("response") if c.path == path]


def test_relaunch_of_another_box_s_run_is_checked_and_carried_out_by_that_box(
        tmp_path: Path, pg_url: str, monkeypatch: Any) -> None:
    from babysit.db.postgres import PostgresStore
    from bot.app import build_app
    from bot.context import BotConfig

    boxes = {}
    for name in ("box-a", "box-b"):
        box = boxes[name] = tmp_path / name
        box.mkdir()
        gpu_file(box / "gpus.json")
        (box / "babysit.toml").write_text(f'[daemon]\nabort_allow_list = ["{ADMIN}"]\n[store]\nurl = "{pg_url}"\n'
                                          f'[host]\nname = "{name}"\nlease_seconds = 3\n')
    box_b = boxes["box-b"]

    def run_b(steps: int, sleep: float) -> str:
        cmd = [PY, str(FAKE), "outputs/run-b/train_log.jsonl", "--steps", str(steps), "--sleep", str(sleep)]
        return run_toml("run-b", cmd, log=TRAIN_LOG, gpus=[], guards={"min_free_host_ram_gib": 0.01},
                        retry={"max_attempts": 1})

    spec = box_b / "run-b.toml"
    spec.write_text(run_b(3, 0.05))
    out = babysit(box_b, "register", str(spec), "--accelerated")
    assert out.returncode == 0, out.stderr
    with open(box_b / "daemon-out.txt", "wb") as log:
        daemon = subprocess.Popen([PY, "-m", "babysit", "up", "--accelerated", "--registry",
                                   str(box_b / "babysit.toml")], cwd=box_b, env=box_env(box_b), stdout=log,
                                  stderr=subprocess.STDOUT, start_new_session=True)
    fake = FakeSlack(TOKEN).start()
    for key, value in (("SLACK_BOT_TOKEN", TOKEN), ("SLACK_SIGNING_SECRET", SECRET),
                       ("BABYSIT_SLACK_API_URL", fake.api_url)):
        monkeypatch.setenv(key, value)
    for key in ("BABYSIT_STORE_URL", "BABYSIT_HOST"):
        monkeypatch.delenv(key, raising=False)
    store = PostgresStore(pg_url, host="test")
    try:
        wait_for("run-b finished on box-b", lambda: store.run_state("run-b")[0] == "finished", timeout=60)
        # run.toml fixed on box-b (a longer run): the relaunch re-reads it there
        spec.write_text(run_b(100000, 0.5))
        app = build_app(BotConfig(boxes["box-a"] / "babysit.toml"))  # box-a's gateway bot
        ack = _slash(app, fake, "relaunch run-b", "/response/relaunch-1")
        assert "Relaunch of `run-b` requested" in ack["text"], ack  # before: "unknown run" (not box-a's)
        (answer,) = wait_for("the relaunch's answer", lambda: _answers(fake, "/response/relaunch-1"), timeout=30)
        assert "`run-b`: the daemon launched attempt 2" in answer, answer
        attempts = store.attempts("run-b")
        assert [a.n for a in attempts] == [1, 2] and "100000" in attempts[1].argv, attempts  # box-b's fixed file
        assert registry.load(boxes["box-a"] / "babysit.toml").names == ()  # nothing registered on the gateway's box
        (row,) = store._query("SELECT action, host, claimed_by FROM control")
        assert tuple(row) == ("relaunch-asked", "box-b", "box-b")

        _slash(app, fake, "relaunch run-b", "/response/relaunch-2")  # running again: box-b refuses, says why
        (again,) = wait_for("the refusal", lambda: _answers(fake, "/response/relaunch-2"), timeout=30)
        assert "not relaunched" in again and "run-b" in again, again
    finally:
        daemon.terminate()
        try:
            daemon.wait(20)
        except subprocess.TimeoutExpired:
            daemon.kill()
        for a in store.live_attempts():
            if a.pid and a.pid > 1:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(a.pid, signal.SIGKILL)
        store.close()
        fake.stop()
