"""`babysit slack check` as a first-time admin runs it (a real `babysit` subprocess), against the local
Slack server speaking auth.test, conversations.info/join and chat.postMessage with the granted scopes in
the `x-oauth-scopes` header: what passes, and each problem said with what to do."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.slack.conftest import TOKEN
from tests.slack.fake_slack import FakeSlack


def check(fake: FakeSlack, root: Path, *args: str, token: str | None = TOKEN,
          daemon_channel: str | None = "C0RUNS") -> subprocess.CompletedProcess:
    (root / "babysit.toml").write_text(f'[daemon]\nchannel = "{daemon_channel}"\n' if daemon_channel else "")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLACK_", "BABYSIT_SLACK"))}
    env["BABYSIT_SLACK_API_URL"] = fake.api_url
    if token is not None:
        env["SLACK_BOT_TOKEN"] = token
    return subprocess.run([sys.executable, "-m", "babysit", "slack", "check", "--registry", str(root / "babysit.toml"),
                           *args], cwd=root, env=env, capture_output=True, text=True, timeout=60)


def test_a_working_setup_passes_every_step_and_posts_a_test_message(fake: FakeSlack, tmp_path: Path) -> None:
    fake.channels["C0RUNS"] = {"name": "ml-runs", "is_private": False, "is_member": True}
    res = check(fake, tmp_path)
    assert res.returncode == 0, res.stdout + res.stderr
    lines = res.stdout.splitlines()
    assert lines[0] == "ok   token:   SLACK_BOT_TOKEN is a bot token (xoxb-…)"
    assert lines[1] == "ok   auth:    bot @babysit (UBOT0001) in workspace fake (T0001)"
    assert lines[2].startswith("ok   scopes:  granted channels:history, channels:join, channels:read, chat:write")
    assert "ok   channel: C0RUNS (#ml-runs): the bot is a member" in lines
    assert any(x.startswith("ok   post:    a test message was posted to C0RUNS") for x in lines)
    assert lines[-1] == "slack check: ok: babysit can post here (docs/slack.md)"
    (post,) = fake.posts()
    assert post["channel"] == "C0RUNS" and "babysit slack check" in post["text"]
    assert fake.calls_to("auth.test")[0].headers["authorization"] == f"Bearer {TOKEN}"


def test_missing_scopes_and_a_channel_the_bot_is_not_in_are_said_with_the_fix(fake: FakeSlack, tmp_path: Path) -> None:
    fake.scopes = ["chat:write", "commands", "channels:read", "channels:join"]
    fake.channels["C0RUNS"] = {"name": "ml-runs", "is_private": False, "is_member": False}
    res = check(fake, tmp_path)
    assert res.returncode == 1
    out = res.stdout
    assert "FAIL scopes:  missing files:write (to upload the verdict chart)" in out
    assert "→ OAuth & Permissions → Bot Token Scopes: add them, then reinstall the app" in out
    assert "warn scopes:  files:read not granted" in out and "warn scopes:  channels:history not granted" in out
    assert "FAIL channel: C0RUNS (#ml-runs): the bot is not a member, so it cannot post there" in out
    assert "→ rerun with --join (public channels; needs channels:join), or /invite @babysit in #ml-runs" in out
    assert fake.posts() == [], "no test post into a channel the bot is not in"
    assert out.splitlines()[-1] == "slack check: 2 problem(s): fix them, then run it again"

    fake.scopes.append("files:write")
    res = check(fake, tmp_path, "--join")
    assert res.returncode == 0, res.stdout
    assert "ok   channel: C0RUNS (#ml-runs): the bot was not a member; it joined" in res.stdout
    assert fake.channels["C0RUNS"]["is_member"] is True and len(fake.posts()) == 1


def test_no_token_a_wrong_token_and_no_channel(fake: FakeSlack, tmp_path: Path) -> None:
    res = check(fake, tmp_path, token=None)
    assert res.returncode == 2
    assert res.stdout.splitlines()[0] == "FAIL token:   SLACK_BOT_TOKEN is not set"
    assert "OAuth & Permissions → Install to Workspace; copy the Bot User OAuth Token (xoxb-…)" in res.stdout
    assert fake.calls == [], "nothing asked of Slack without a token"

    res = check(fake, tmp_path, token="xapp-1-A1-2-abc")
    assert res.returncode == 2 and "SLACK_BOT_TOKEN is an app-level token (that is SLACK_APP_TOKEN" in res.stdout

    res = check(fake, tmp_path, token="xoxb-revoked")
    assert res.returncode == 1 and "FAIL auth:    auth.test refused the token: invalid_auth" in res.stdout

    res = check(fake, tmp_path, daemon_channel=None)
    assert res.returncode == 1
    assert "FAIL channel: no channel configured: every run's messages would be marked failed" in res.stdout
    assert "set [daemon].channel in babysit.toml" in res.stdout and fake.posts() == []


def test_a_channel_slack_does_not_know_fails_the_test_post(fake: FakeSlack, tmp_path: Path) -> None:
    fake.scopes = [s for s in fake.scopes if s != "channels:read"]
    res = check(fake, tmp_path, "--channel", "C-MISSING")
    assert res.returncode == 1
    assert "warn channel: C-MISSING: cannot look it up without channels:read; the test post decides" in res.stdout
    assert "FAIL post:    C-MISSING: chat.postMessage: channel_not_found" in res.stdout
