"""Acceptance (docs/campaigns.md): a campaign of real CPU trainer runs under the real daemon. The
single-delta run's FINAL verdict moves the suspect, banks its checkpoints with a verified manifest,
proposes the next run (a file, not launched) and posts an owner call to (a local fake of) Slack; the
proposal is registered only after a really signed click by an allowed user, and forged, replayed,
disallowed and second clicks are refused and recorded. Then the daemon launches it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import pytest

from babysit.campaign import actions
from babysit.db.store import Store
from babysit.runtime import registry
from bot.owner_calls import HOLD_ACTION_ID, LAUNCH_ACTION_ID
from tests.slack.conftest import TOKEN
from tests.slack.fake_slack import FakeSlack
from tests.slack.test_bot_http import SECRET, Bot, send

pytestmark = pytest.mark.slow

OWNER, STRANGER, CHANNEL = "UOWNER0001", "USTRANGER1", "C0SAGA"

CAMPAIGN = f"""
[campaign]
name = "tiny_saga"
question = "Does the tiny recipe stop improving after step 50 because of its learning rate?"
owners = ["{OWNER}"]

[[suspects]]
name = "lr"
status = "live"
factors = ["--lr-scale"]
[[suspects]]
name = "batch"
factors = ["--batch-size"]
"""

RUN = """
[run]
name = "{name}"
workdir = ".."
command = ["{python}", "-m", "trainer", "--recipe", "tiny", "--log", "outputs/{{name}}/log.jsonl",
           "--checkpoints", "outputs/{{name}}/ck"{extra}]
log = "outputs/{{name}}/log.jsonl"
checkpoints = "outputs/{{name}}/ck"

[guards]
min_free_host_ram_gib = 0.1
stall_minutes = 120          # --accelerated: 2 min; a loaded machine's torch import is no stall (the child waits on base)
[poll]
first_after_minutes = 30
every_minutes = 30

[prereg]
question = "Does eval_chunk_mae keep falling between steps 50 and 150?"
metric = "eval_chunk_mae"
baseline_step = 50
read_step = 150
[[prereg.bands]]
label = "FALLING"
max = -0.01
[prereg.otherwise]
label = "FLAT"

{campaign}
"""

CHILD_CAMPAIGN = """[campaign]
file = "../campaign.toml"
parent = "base"
suspect = "lr"
[campaign.grid.FALLING]
suspects = { lr = "convicted" }
say = "A quarter of the learning rate keeps it falling: the learning rate is CONVICTED."
bank = "banked/{name}"
propose = { suspect = "batch", set = { "--batch-size" = "16" } }
[campaign.grid.FLAT]
suspects = { lr = "exonerated", batch = "live" }
"""


def write(root: Path) -> tuple[Path, Path]:
    (root / "runs").mkdir()
    (root / "campaign.toml").write_text(CAMPAIGN)
    base = root / "runs" / "base.toml"
    base.write_text(RUN.format(name="base", python=sys.executable, extra="",
                               campaign='[campaign]\nfile = "../campaign.toml"\n'))
    child = root / "runs" / "lr_quarter.toml"
    child.write_text(RUN.format(name="lr_quarter", python=sys.executable, extra=', "--lr-scale", "0.25"',
                                campaign=CHILD_CAMPAIGN))
    (root / "babysit.toml").write_text(f'[daemon]\nchannel = "{CHANNEL}"\nabort_allow_list = ["{STRANGER}"]\n')
    return base, child


def babysit(root: Path, *args: str, env: dict[str, str] | None = None, timeout: float = 240) -> \
        subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "babysit", *args, "--registry", str(root / "babysit.toml")],
                          cwd=root, env={**os.environ, **(env or {})}, capture_output=True, text=True, timeout=timeout)


def click(bot: Bot, user: str, action_id: str, value: str, path: str, **kw: Any) -> int:
    payload = {"type": "block_actions", "team": {"id": "T0001"}, "user": {"id": user}, "channel": {"id": CHANNEL},
               "response_url": bot.fake.base + path, "trigger_id": "t9", "container": {"type": "message"},
               "api_app_id": "A1", "token": "legacy",
               "actions": [{"type": "button", "action_id": action_id, "block_id": "b", "value": value,
                            "action_ts": str(time.time())}]}
    return send(bot, urlencode({"payload": json.dumps(payload)}), **kw)[0]


def test_a_single_delta_verdict_moves_banks_proposes_and_launches_only_on_an_allowed_signed_click(
        tmp_path: Path) -> None:
    root = tmp_path
    write(root)
    fake = FakeSlack(TOKEN).start()
    slack = {"SLACK_BOT_TOKEN": TOKEN, "BABYSIT_SLACK_API_URL": fake.api_url, "SLACK_SIGNING_SECRET": SECRET}
    try:
        for spec in ("runs/base.toml", "runs/lr_quarter.toml"):
            done = babysit(root, "register", spec, "--accelerated")
            assert done.returncode == 0, done.stderr
        assert "--lr-scale: (absent) → 0.25 (suspect lr)   [the delta tested]" in done.stdout
        up = babysit(root, "up", "--accelerated", "--exit-when-idle", "--no-view", env=slack)
        assert up.returncode == 0, up.stderr[-3000:]

        store = Store.in_dir(root / ".babysit")
        try:
            assert store.final_verdict("lr_quarter").body["label"] == "FALLING"
            moves = [e.body for e in store.campaign_events("tiny_saga", "suspect")]
            assert {"suspect": "lr", "status": "convicted", "run": "lr_quarter", "label": "FALLING"} in moves
            (call,) = store.owner_calls("tiny_saga")
            assert call.options == ("launch", "hold") and call.decision is None
        finally:
            store.close()
        bank = actions.verify(root / "banked" / "lr_quarter")
        assert bank["verified"] and {f["path"] for f in bank["files"]} >= {"step_000150.pt", "latest"}
        proposal = root / "proposals" / "tiny_saga_batch.toml"
        assert '"--batch-size",\n    "16"' in proposal.read_text() or '"--batch-size", "16"' in proposal.read_text()
        assert "tiny_saga_batch" not in registry.load(root / "babysit.toml").names  # proposed, not launched
        show = json.loads(babysit(root, "campaign", "show", "tiny_saga", "--json").stdout)
        assert [(s["name"], s["status"]) for s in show["suspects"]] == [("lr", "convicted"), ("batch", "untested")]
        assert [r["label"] for r in show["runs"]] == ["FLAT", "FALLING"]

        posted = {p["metadata"]["event_payload"]["id"]: p for p in fake.posts()}
        (owner_post,) = [p for p in posted.values() if any(b.get("type") == "actions" for b in p["blocks"] or ())]
        (buttons,) = [b["elements"] for b in owner_post["blocks"] if b["type"] == "actions"]
        launch = next(b for b in buttons if b["action_id"] == LAUNCH_ACTION_ID)
        assert launch["value"] == str(call.id) and launch["confirm"]
        assert any("tiny_saga" in (p["text"] or "") and "convicted" in (p["text"] or "") for p in posted.values())

        proc = subprocess.Popen([sys.executable, "-m", "babysit", "bot", "--http", "0", "--host", "127.0.0.1",
                                 "--registry", str(root / "babysit.toml")], cwd=root, env={**os.environ, **slack},
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            line = proc.stdout.readline() if proc.stdout else ""
            bot = Bot(line.split("serving ", 1)[1].strip(), fake, root, proc)
            value = str(call.id)
            assert click(bot, OWNER, LAUNCH_ACTION_ID, value, "/r/1", secret="forged") == 401
            assert click(bot, OWNER, LAUNCH_ACTION_ID, value, "/r/2", ts=int(time.time()) - 600) == 401
            assert click(bot, STRANGER, LAUNCH_ACTION_ID, value, "/r/3") == 200  # abort-listed, not an owner
            assert "cannot answer owner call" in _response(fake, "/r/3")["text"]
            assert "tiny_saga_batch" not in registry.load(root / "babysit.toml").names
            assert click(bot, OWNER, LAUNCH_ACTION_ID, value, "/r/4") == 200
            decided = _response(fake, "/r/4")
            assert "launch" in decided["text"] and "registered tiny_saga_batch" in decided["text"]
            assert click(bot, OWNER, HOLD_ACTION_ID, value, "/r/5") == 200  # a second answer
            assert "already decided: launch by slack:UOWNER0001" in _response(fake, "/r/5")["text"]
        finally:
            proc.terminate()
            proc.wait(10)
        assert "tiny_saga_batch" in registry.load(root / "babysit.toml").names
        store = Store.in_dir(root / ".babysit")
        try:
            clicks = [(c["user"], c["outcome"], c["reason"]) for c in store.clicks()]
            decided_call = store.owner_call(call.id)
        finally:
            store.close()
        assert clicks == [
            (f"unverified:{OWNER}", "refused", "signature does not verify (forged?)"),
            (f"unverified:{OWNER}", "refused", "request timestamp outside the 5-minute window (a replay?)"),
            (STRANGER, "refused", "not on the allow-list"),
            (OWNER, "accepted", ""),
            (OWNER, "refused", "already decided: launch by slack:UOWNER0001"),
        ]
        assert decided_call.decision == "launch" and decided_call.decided_by == f"slack:{OWNER}"
        up = babysit(root, "up", "--accelerated", "--exit-when-idle", "--no-view")
        assert up.returncode == 0, up.stderr[-3000:]
        store = Store.in_dir(root / ".babysit")
        try:
            assert store.attempts("tiny_saga_batch")[0].outcome == "completed"
            joined = store.campaign_run("tiny_saga_batch")
        finally:
            store.close()
        assert joined["parent"] == "lr_quarter" and joined["suspect"] == "batch"
        assert "--batch-size" in joined["delta"]["summary"]
    finally:
        fake.stop()


def _response(fake: FakeSlack, path: str, timeout: float = 20.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = [c.body for c in fake.calls_to("response") if c.path == path]
        if got:
            return got[-1]
        time.sleep(0.05)
    raise AssertionError(f"no response on {path}")
