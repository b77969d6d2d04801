"""Owner-call clicks across boxes (docs/fleet.md): box-b's run raised the call (its campaign's file, owners
and proposals are on box-b); the click reaches box-a's gateway bot (a real Bolt app, signed requests).
The click becomes a control request addressed to box-b, carried out by box-b's real daemon (woken by
NOTIFY) and answered through the response_url: a stranger refused by box-b's campaign owners, the owner's
`launch` registered in box-b's registry (never box-a's), a second click refused as already decided."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from babysit.runtime import registry
from tests.campaign.test_owner_calls import answered, dispatch
from tests.fleet.helpers import PY, box_env, run_toml
from tests.reliability.harness import gpu_file
from tests.slack.conftest import TOKEN
from tests.slack.fake_slack import FakeSlack
from tests.slack.test_bot_http import SECRET
from tests.support import wait_for

OWNER, STRANGER = "UOWNER0001", "USTRANGE01"


@pytest.fixture
def two_boxes(tmp_path: Path, pg_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Any]]:
    from babysit.db.postgres import PostgresStore
    from bot.app import build_app
    from bot.context import BotConfig

    boxes = {}
    for name in ("box-a", "box-b"):
        box = boxes[name] = tmp_path / name
        box.mkdir()
        gpu_file(box / "gpus.json")
        allow = f'abort_allow_list = ["{STRANGER}"]\n' if name == "box-a" else ""  # box-a's list is not the campaign's
        (box / "babysit.toml").write_text(f'[daemon]\nguard_interval_seconds = 3600\n{allow}[store]\nurl = "{pg_url}"\n'
                                          f'[host]\nname = "{name}"\nlease_seconds = 3\n')
    box_b = boxes["box-b"]
    (box_b / "campaign.toml").write_text(f'[campaign]\nname = "saga"\nquestion = "why?"\nowners = ["{OWNER}"]\n'
                                         '[[suspects]]\nname = "lr"\n')
    proposal = run_toml(box_b, "saga-next")  # what box-b's campaign proposed (written there, not launched)
    store_b = PostgresStore(pg_url, host="box-b")
    now = store_b.now()
    store_b.claim_run("run-b", now)  # the call's run is box-b's
    store_b.save_campaign("saga", str(box_b / "campaign.toml"), "0" * 64, now)
    call = store_b.open_owner_call("saga", "run-b", "launch the next run, or hold?", ("launch", "hold"),
                                   {"label": "HEALTHY", "proposals": {"launch": str(proposal)}}, now, dedupe_key="k")
    store_b.close()
    with open(box_b / "daemon-out.txt", "wb") as out:
        daemon = subprocess.Popen([PY, "-m", "babysit", "up", "--accelerated", "--registry",
                                   str(box_b / "babysit.toml")], cwd=box_b, env=box_env(box_b), stdout=out,
                                  stderr=subprocess.STDOUT, start_new_session=True)
    fake = FakeSlack(TOKEN).start()
    monkeypatch.setenv("SLACK_BOT_TOKEN", TOKEN)
    monkeypatch.setenv("SLACK_SIGNING_SECRET", SECRET)
    monkeypatch.setenv("BABYSIT_SLACK_API_URL", fake.api_url)
    for key in ("BABYSIT_STORE_URL", "BABYSIT_HOST"):
        monkeypatch.delenv(key, raising=False)
    store = PostgresStore(pg_url, host="test")
    try:
        wait_for("box-b's lease", lambda: any(h.name == "box-b" for h in store.hosts()), timeout=60)
        app = build_app(BotConfig(boxes["box-a"] / "babysit.toml"))  # box-a's gateway bot
        yield {"app": app, "fake": fake, "boxes": boxes, "call": call.id, "store": store}
    finally:
        daemon.terminate()
        try:
            daemon.wait(20)
        except subprocess.TimeoutExpired:
            daemon.kill()
        for a in store.live_attempts():  # the launched proposal's trainer, if box-b got to start it
            if a.pid and a.pid > 1:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(a.pid, signal.SIGKILL)
        store.close()
        fake.stop()


def _requests(store: Any) -> list[tuple[str, str, str | None, str | None]]:
    return [(r[0], r[1], r[2], r[3]) for r in store._query(
        "SELECT action, requested_by, host, claimed_by FROM control ORDER BY id")]


def test_a_click_on_another_box_s_owner_call_is_carried_out_by_that_box(two_boxes: dict[str, Any]) -> None:
    app, fake, boxes, call_id, store = (two_boxes[k] for k in ("app", "fake", "boxes", "call", "store"))
    from bot.owner_calls import HOLD_ACTION_ID, LAUNCH_ACTION_ID

    status, path = dispatch(app, fake, STRANGER, LAUNCH_ACTION_ID, str(call_id))
    assert status == 200
    text = answered(fake, path)
    assert "cannot answer owner call" in text, text  # box-b's campaign owners decide, not box-a's allow list

    status, path = dispatch(app, fake, OWNER, LAUNCH_ACTION_ID, str(call_id))
    text = answered(fake, path)
    assert f"owner call #{call_id}: *launch* chosen by <@{OWNER}> — registered saga-next" in text, text
    (decided,) = [c.body for c in fake.calls_to("response") if c.path == path]
    assert decided["response_type"] == "in_channel" and decided["replace_original"] is True
    assert registry.load(boxes["box-b"] / "babysit.toml").names == ("saga-next",)  # box-b's files, box-b's registry
    assert registry.load(boxes["box-a"] / "babysit.toml").names == ()  # before: registered on the gateway's box

    status, path = dispatch(app, fake, OWNER, HOLD_ACTION_ID, str(call_id))
    assert f"already decided: launch by slack:{OWNER}" in answered(fake, path)

    assert _requests(store) == [(f"owner-call {call_id} launch", f"slack:{STRANGER}", "box-b", "box-b"),
                                (f"owner-call {call_id} launch", f"slack:{OWNER}", "box-b", "box-b"),
                                (f"owner-call {call_id} hold", f"slack:{OWNER}", "box-b", "box-b")]
    clicks = [(c["user"], c["action"], c["outcome"]) for c in store.clicks()]
    assert clicks == [(STRANGER, "launch", "refused"), (OWNER, "launch", "accepted"), (OWNER, "hold", "refused")]
    call = store.owner_call(call_id)
    assert (call.decision, call.decided_by) == ("launch", f"slack:{OWNER}")
    # box-b's daemon publishes its GPUs with its lease (for the gateway's /babysit gpus), read by a probe of its own
    info = wait_for("box-b's GPU report", lambda: next(
        (h.info for h in store.hosts() if h.name == "box-b" and h.info.get("gpus")), None), timeout=20)
    assert [g["uuid"] for g in info["gpus"]["gpus"]] == ["GPU-sim-0", "GPU-sim-1"], info
        # box-b's daemon picks the registered proposal up and launches it (its own run, on its own box)
    wait_for("saga-next running on box-b", lambda: store.run_hosts().get("saga-next") == "box-b", timeout=30)
