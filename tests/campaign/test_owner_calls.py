"""Owner-call clicks through the real Bolt app (signed for real, dispatched in-process, answered on a
local fake Slack): forged, replayed, disallowed and second clicks are refused and recorded; `hold`
decides without launching; the post's buttons carry the call id."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlencode

import pytest

from babysit.core.campaign.render import render_call
from babysit.db.store import Store
from babysit.runtime import registry
from bot.owner_calls import ACTION_IDS, HOLD_ACTION_ID, LAUNCH_ACTION_ID
from tests.slack.conftest import TOKEN
from tests.slack.fake_slack import FakeSlack
from tests.slack.test_bot_http import SECRET, sign

OWNER, OTHER = "UOWNER0001", "UOTHER0001"


@pytest.fixture
def world(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[object, FakeSlack, Path, int]]:
    from bot.app import build_app
    from bot.handlers import BotConfig

    (tmp_path / "campaign.toml").write_text(f'[campaign]\nname = "saga"\nquestion = "why?"\nowners = ["{OWNER}"]\n'
                                            '[[suspects]]\nname = "lr"\n')
    (tmp_path / "babysit.toml").write_text(f'[daemon]\nabort_allow_list = ["{OTHER}"]\n')
    store = Store.in_dir(registry.load(tmp_path / "babysit.toml").state_dir)
    store.save_campaign("saga", str(tmp_path / "campaign.toml"), "0" * 64, time.time())
    call = store.open_owner_call("saga", "run_a", "launch the next run, or hold?", ("launch", "hold"),
                                 {"label": "HEALTHY", "proposals": {"launch": str(tmp_path / "next.toml")}},
                                 time.time(), dedupe_key="k")
    store.close()
    fake = FakeSlack(TOKEN).start()
    monkeypatch.setenv("SLACK_BOT_TOKEN", TOKEN)
    monkeypatch.setenv("SLACK_SIGNING_SECRET", SECRET)
    monkeypatch.setenv("BABYSIT_SLACK_API_URL", fake.api_url)
    app = build_app(BotConfig(tmp_path / "babysit.toml"))
    yield app, fake, tmp_path, call.id
    fake.stop()


def dispatch(app: object, fake: FakeSlack, user: str, action_id: str, value: str, *, secret: str = SECRET,
             age: int = 0) -> tuple[int, str]:
    from slack_bolt.request import BoltRequest

    path = f"/response/{time.monotonic_ns()}"
    payload = {"type": "block_actions", "team": {"id": "T0001"}, "user": {"id": user}, "channel": {"id": "C1"},
               "response_url": fake.base + path, "trigger_id": "t", "container": {"type": "message"},
               "api_app_id": "A1", "token": "legacy",
               "actions": [{"type": "button", "action_id": action_id, "block_id": "b", "value": value,
                            "action_ts": str(time.time())}]}
    body = urlencode({"payload": json.dumps(payload)})
    ts = int(time.time()) - age
    resp = app.dispatch(BoltRequest(body=body, headers={  # type: ignore[attr-defined]
        "content-type": ["application/x-www-form-urlencoded"], "x-slack-request-timestamp": [str(ts)],
        "x-slack-signature": [sign(body, ts, secret)]}))
    return resp.status, path


def answered(fake: FakeSlack, path: str) -> str:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        got = [c.body for c in fake.calls_to("response") if c.path == path]
        if got:
            return str(got[-1]["text"])
        time.sleep(0.02)
    raise AssertionError(f"no answer on {path}")


def test_every_refused_click_is_recorded_and_the_first_allowed_decision_wins(world: tuple) -> None:
    app, fake, root, call_id = world
    assert dispatch(app, fake, OWNER, LAUNCH_ACTION_ID, str(call_id), secret="forged")[0] == 401
    assert dispatch(app, fake, OWNER, LAUNCH_ACTION_ID, str(call_id), age=400)[0] == 401
    status, path = dispatch(app, fake, OTHER, LAUNCH_ACTION_ID, str(call_id))
    assert status == 200 and "cannot answer owner call" in answered(fake, path)
    status, path = dispatch(app, fake, OWNER, HOLD_ACTION_ID, str(call_id))
    assert status == 200 and "*hold* chosen by <@UOWNER0001>" in answered(fake, path)
    status, path = dispatch(app, fake, OWNER, LAUNCH_ACTION_ID, str(call_id))
    assert "already decided: hold by slack:UOWNER0001" in answered(fake, path)
    status, path = dispatch(app, fake, OWNER, HOLD_ACTION_ID, "999")
    assert "No owner call #999" in answered(fake, path)
    store = Store.in_dir(root / ".babysit")
    try:
        clicks = [(c["user"], c["action"], c["outcome"], c["reason"]) for c in store.clicks()]
        call = store.owner_call(call_id)
        history = [e.kind for e in store.campaign_events("saga")]
    finally:
        store.close()
    assert clicks == [
        (f"unverified:{OWNER}", "launch", "refused", "signature does not verify (forged?)"),
        (f"unverified:{OWNER}", "launch", "refused", "request timestamp outside the 5-minute window (a replay?)"),
        (OTHER, "launch", "refused", "not on the allow-list"),
        (OWNER, "hold", "accepted", ""),
        (OWNER, "launch", "refused", "already decided: hold by slack:UOWNER0001"),
        (OWNER, "hold", "refused", "no owner call '999'"),
    ]
    assert (call.decision, call.decided_by, call.result) == ("hold", f"slack:{OWNER}", "held: nothing launched")
    assert history == ["click-refused", "decision", "click-refused"]
    assert registry.load(root / "babysit.toml").names == ()  # nothing launched


def test_the_owner_call_post_has_one_button_an_option_carrying_the_call_id() -> None:
    text, blocks = render_call({"call_id": 7, "campaign": "saga", "run": "run_a", "label": "AMBIGUOUS",
                                "question": "extend to 1500 vs the next run?", "options": ["launch", "extend", "hold"],
                                "proposals": {"launch": "p/next.toml", "extend": "p/run_a_to1500.toml"},
                                "owners": [OWNER]})
    (buttons,) = [b["elements"] for b in blocks if b["type"] == "actions"]
    assert [b["action_id"] for b in buttons] == list(ACTION_IDS.values())
    assert {b["value"] for b in buttons} == {"7"}
    assert [("confirm" in b) for b in buttons] == [True, True, False]  # launching costs GPU-hours: confirmed
    assert "extend to 1500 vs the next run?" in text and "p/run_a_to1500.toml" in text
