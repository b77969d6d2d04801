"""Security: forged, missing, malformed, future-dated and replayed Slack signatures; abort by strangers;
shell metacharacters in args reaching the trainer verbatim; tokens never written anywhere; state files
owner-only. (tests/slack/test_bot_http.py already pins a wrong-secret signature, a 6-minute replay and a
non-allow-listed abort and click; this file adds the other ways a request can be forged.)
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import urlencode

import pytest

from tests.reliability.harness import Daemons
from tests.slack.fake_slack import FakeSlack
from tests.slack.test_bot_http import ALLOWED, CHANNEL, DONE, SECRET, Bot, aborts, bot, sign  # noqa: F401
from tests.support import register, run_toml

FAKE_TRAINER = Path(__file__).with_name("fake_trainer.py")
CANARY_TOKEN = "xoxb-4242-CANARY-babysit-token-do-not-leak"
CANARY_SECRET = "canary-signing-secret-7f3a9c"


def post(bot: Bot, body: str, headers: dict[str, str]) -> int:  # noqa: F811 - the fixture's type
    req = urllib.request.Request(bot.url, data=body.encode(), method="POST",
                                 headers={"Content-Type": "application/x-www-form-urlencoded", **headers})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status
    except urllib.error.HTTPError as exc:
        return exc.code


def abort_body(user: str = ALLOWED) -> str:
    return urlencode({"token": "legacy", "team_id": "T0001", "channel_id": CHANNEL, "user_id": user,
                      "command": "/babysit", "text": f"abort {DONE}", "response_url": "http://127.0.0.1:9/x",
                      "trigger_id": "t1"})


def test_missing_malformed_future_and_tampered_signatures_get_401_and_do_nothing(bot: Bot) -> None:  # noqa: F811
    body = abort_body()
    now = int(time.time())
    good = sign(body, now)
    forged = {
        "no headers": {},
        "no signature": {"X-Slack-Request-Timestamp": str(now)},
        "no timestamp": {"X-Slack-Signature": good},
        "empty signature": {"X-Slack-Request-Timestamp": str(now), "X-Slack-Signature": ""},
        "not hex": {"X-Slack-Request-Timestamp": str(now), "X-Slack-Signature": "v0=" + "zz" * 32},
        "truncated": {"X-Slack-Request-Timestamp": str(now), "X-Slack-Signature": good[:-2]},
        "other version": {"X-Slack-Request-Timestamp": str(now), "X-Slack-Signature": "v1=" + good[3:]},
        "timestamp not a number": {"X-Slack-Request-Timestamp": "soon", "X-Slack-Signature": good},
        "six minutes ahead": {"X-Slack-Request-Timestamp": str(now + 360),
                              "X-Slack-Signature": sign(body, now + 360)},
        "signed for another timestamp": {"X-Slack-Request-Timestamp": str(now - 1), "X-Slack-Signature": good},
    }
    calls_before = len(bot.fake.calls)
    for what, headers in forged.items():
        assert post(bot, body, headers) == 401, what
    # the body changed after signing: a stranger's user id swapped for the allow-listed one
    tampered = abort_body("U0STRANGER").replace("U0STRANGER", ALLOWED)
    assert post(bot, tampered, {"X-Slack-Request-Timestamp": str(now),
                                "X-Slack-Signature": sign(abort_body("U0STRANGER"), now)}) == 401
    time.sleep(0.3)
    assert aborts(bot) == [] and len(bot.fake.calls) == calls_before, "no work, no Slack call"


def test_a_captured_valid_request_replayed_after_five_minutes_gets_401(bot: Bot) -> None:  # noqa: F811
    body = abort_body()
    then = int(time.time()) - 301
    assert post(bot, body, {"X-Slack-Request-Timestamp": str(then), "X-Slack-Signature": sign(body, then)}) == 401
    assert aborts(bot) == []


def test_an_abort_click_by_a_stranger_claiming_an_allowed_name_is_refused(bot: Bot) -> None:  # noqa: F811
    payload = {"type": "block_actions", "team": {"id": "T0001"},
               "user": {"id": "U0STRANGER", "username": ALLOWED, "name": ALLOWED},
               "channel": {"id": CHANNEL}, "response_url": bot.fake.base + "/response/stranger",
               "trigger_id": "t2", "container": {"type": "message"}, "api_app_id": "A1", "token": "legacy",
               "actions": [{"type": "button", "action_id": "babysit_abort_confirmed", "block_id": "babysit_abort",
                            "value": DONE, "action_ts": str(time.time())}]}
    body = urlencode({"payload": json.dumps(payload)})
    now = int(time.time())
    assert post(bot, body, {"X-Slack-Request-Timestamp": str(now), "X-Slack-Signature": sign(body, now)}) == 200
    time.sleep(0.5)
    assert aborts(bot) == []


# -- argv only, never a shell -------------------------------------------------------------------------
NASTY = ["; touch PWNED1", "$(touch PWNED2)", "`touch PWNED3`", "| touch PWNED4", "&& touch PWNED5",
         "> PWNED6", "' \" \\ \n\t*?[]~", "--flag=$HOME", "$(rm -rf PWNED_DIR)"]


def fake_run(root: Path, name: str, *args: str, steps: int = 10, guards: dict[str, float] | None = None,
             retry: dict[str, list[str]] | None = None, attempts: dict[str, list[str]] | None = None) -> Path:
    """A registered run of the fake trainer (`steps` records), its environment holding shell bait."""
    cmd = [sys.executable, str(FAKE_TRAINER), "outputs/train_log.jsonl", "--steps", str(steps), *args]
    return register(root, run_toml(name, cmd, log="outputs/train_log.jsonl", poll=(1, 2), retry=retry,
                                   attempts=attempts, env={"SHELL_BAIT": "$(touch PWNED7); touch PWNED8"},
                                   guards={"min_free_host_ram_gib": 0.01, **(guards or {})}))


def test_args_with_shell_metacharacters_reach_the_trainer_verbatim_and_run_nothing(tmp_path: Path,
                                                                                 daemons: Daemons) -> None:
    args = ["--argv-out", str(tmp_path / "argv.json"), "--", *NASTY]
    fake_run(tmp_path, "meta.run-1_x", *args, attempts={"p": ["--", "; touch PWNED9"]})
    (tmp_path / "PWNED_DIR").mkdir()
    proc = daemons.start("--exit-when-idle")
    assert proc.wait(60) == 0, (tmp_path / "daemon-out.txt").read_text()[-2000:]
    seen = json.loads((tmp_path / "argv.json").read_text())
    assert seen["argv"][-len(NASTY) - 2:] == [*NASTY, "--", "; touch PWNED9"], "verbatim, in order"
    assert [p.name for p in tmp_path.rglob("PWNED*")] == ["PWNED_DIR"] and not Path("/tmp/pwned").exists()
    assert not any(k.startswith("SLACK_") for k in seen["env"]), "the bot's credentials never reach the trainer"


# -- tokens never written --------------------------------------------------------------------------------
def test_the_slack_token_and_signing_secret_are_never_written_anywhere(tmp_path: Path, daemons: Daemons,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeSlack("xoxb-the-real-token-is-another").start()  # every post: invalid_auth, after resets and 503s
    try:
        fake.reset(1)
        fake.fail(1)
        monkeypatch.setenv("SLACK_BOT_TOKEN", CANARY_TOKEN)
        monkeypatch.setenv("SLACK_SIGNING_SECRET", CANARY_SECRET)
        monkeypatch.setenv("BABYSIT_SLACK_API_URL", fake.api_url)
        monkeypatch.setenv("BABYSIT_SLACK_CHANNEL", "C0RUNS")
        fake_run(tmp_path, "leak", "--argv-out", str(tmp_path / "argv.json"), steps=5)
        proc = subprocess.Popen([sys.executable, "-m", "babysit", "up", "--accelerated", "--exit-when-idle",
                                 "--registry", str(tmp_path / "babysit.toml")], cwd=tmp_path,
                                env={**os.environ, "BABYSIT_GPU_PROBE": "none"}, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        daemons.procs.append(proc)
        out, err = proc.communicate(timeout=90)
        assert proc.returncode == 0, err[-2000:]
        assert fake.calls_to("chat.postMessage", outcome=None), "the daemon did try Slack"
        auth = [c for c in fake.calls if c.headers.get("authorization") == f"Bearer {CANARY_TOKEN}"]
        assert auth, "the token went where it belongs: the Authorization header"
    finally:
        fake.stop()
    leaks = [str(p) for p in tmp_path.rglob("*") if p.is_file()
             and (CANARY_TOKEN.encode() in p.read_bytes() or CANARY_SECRET.encode() in p.read_bytes())]
    assert leaks == [], f"secrets written to {leaks}"
    assert CANARY_TOKEN not in out + err and CANARY_SECRET not in out + err
    assert "CANARY" not in out + err
    failed = [line for line in (tmp_path / ".babysit" / "daemon.log").read_text().splitlines() if "invalid_auth" in line]
    assert failed, "the failures were logged (without the token)"


# -- owner-only state ------------------------------------------------------------------------------------
def test_state_files_are_owner_only(tmp_path: Path, daemons: Daemons) -> None:
    old = os.umask(0o022)  # a permissive umask: babysit must not rely on the user's
    try:
        fake_run(tmp_path, "perm", steps=5)
        proc = daemons.start("--exit-when-idle")
        assert proc.wait(60) == 0
    finally:
        os.umask(old)
    state = tmp_path / ".babysit"
    mode = lambda p: stat.S_IMODE(p.stat().st_mode)  # noqa: E731
    assert mode(state) == 0o700
    for name in ("state.db", "channel.jsonl", "daemon.log"):
        assert mode(state / name) == 0o600, (name, oct(mode(state / name)))
    loose = [f"{p.relative_to(state)} {oct(mode(p))}" for p in state.rglob("*")
             if mode(p) & 0o077 and not p.name.startswith("state.db-")]
    assert loose == [], f"group/other can read: {loose}"
