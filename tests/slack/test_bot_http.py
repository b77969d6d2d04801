"""`babysit bot --http` as a real subprocess, driven by really signed HTTP requests, answering through a
local fake Slack: every command's happy path, and the refusals that must queue nothing."""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import pytest

from babysit.core.snapshot import Snapshot
from babysit.core.spec.run_toml import load_spec
from babysit.db.store import Store
from babysit.runtime import registry
from tests.slack.conftest import TOKEN
from tests.slack.fake_slack import FakeSlack

SECRET = "test-signing-secret"
FIXTURES = Path(__file__).parent.parent / "fixtures" / "verdict"
DONE = "grasp_sft_v2_demosonly_1gpu_disc"  # its log reaches the read step: FINAL
EARLY = "grasp_early"  # its log stops at step 750: PROVISIONAL
ALLOWED = "UALLOWED01"
CHANNEL = "C0RUNS"


@dataclass
class Bot:
    url: str
    fake: FakeSlack
    root: Path
    proc: subprocess.Popen

    @property
    def state(self) -> Path:
        return self.root / ".babysit"

    def store(self) -> Store:
        return Store.in_dir(self.state)

    def control_rows(self) -> list[Any]:
        store = self.store()
        try:
            return store._query("SELECT * FROM control")
        finally:
            store.close()


def sign(body: str, ts: int, secret: str = SECRET) -> str:
    return "v0=" + hmac.new(secret.encode(), f"v0:{ts}:{body}".encode(), hashlib.sha256).hexdigest()


def send(bot: Bot, body: str, *, ts: int | None = None, secret: str = SECRET) -> tuple[int, str]:
    ts = int(time.time()) if ts is None else ts
    req = urllib.request.Request(bot.url, data=body.encode(), method="POST", headers={
        "Content-Type": "application/x-www-form-urlencoded", "X-Slack-Request-Timestamp": str(ts),
        "X-Slack-Signature": sign(body, ts, secret)})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


_responses = iter(range(1, 10_000))


def slash(bot: Bot, command: str, text: str, user: str = "U0CASUAL1", **kw: Any) -> tuple[int, dict[str, Any], str]:
    """Send a slash command; returns (status, the ack's JSON, the response_url path it can answer on)."""
    path = f"/response/{next(_responses)}"
    body = urlencode({"token": "legacy", "team_id": "T0001", "channel_id": CHANNEL, "user_id": user,
                      "command": command, "text": text, "response_url": bot.fake.base + path, "trigger_id": "t1"})
    status, raw = send(bot, body, **kw)
    return status, (json.loads(raw) if raw.strip() else {}), path


def responses(bot: Bot, path: str, n: int = 1, timeout: float = 20.0) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = [c.body for c in bot.fake.calls_to("response") if c.path == path]
        if len(got) >= n:
            return got
        time.sleep(0.05)
    raise AssertionError(f"no response on {path} within {timeout}s")


def everything(message: dict[str, Any]) -> str:
    return json.dumps(message, ensure_ascii=False)


def register(root: Path, name: str, log_lines: int | None) -> None:
    text = (FIXTURES / "run.toml").read_text().replace(f'name = "{DONE}"', f'name = "{name}"')
    log = root / f"{name}.jsonl"
    lines = (FIXTURES / "demosonly_train_log.jsonl").read_text().splitlines(keepends=True)
    log.write_text("".join(lines[:log_lines] if log_lines else lines))
    text = text.replace('log = "demosonly_train_log.jsonl"', f'log = "{log.name}"')
    spec_path = root / f"{name}.toml"
    spec_path.write_text(text)
    sha = load_spec(spec_path).prereg.sha256
    entry = registry.RunEntry(name, spec_path.name, "2026-08-17T18:41:02Z", sha)
    registry.update(root / "babysit.toml", lambda r: registry.with_run(r, entry))


@pytest.fixture(scope="module")
def bot(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Bot]:
    root = tmp_path_factory.mktemp("bot")
    shutil.copy(FIXTURES / "rigonly_train_log.jsonl", root)
    (root / "babysit.toml").write_text(f'[daemon]\nchannel = "{CHANNEL}"\nabort_allow_list = ["{ALLOWED}"]\n')
    register(root, DONE, None)
    register(root, EARLY, 5)  # through the eval at 750 (4 lines stopped at the baseline: no read)
    gpu_file = root / "gpus.json"
    fake = FakeSlack(TOKEN).start()
    env = {**os.environ, "SLACK_BOT_TOKEN": TOKEN, "SLACK_SIGNING_SECRET": SECRET,
           "BABYSIT_SLACK_API_URL": fake.api_url, "BABYSIT_GPU_PROBE": f"file:{gpu_file}"}
    proc = subprocess.Popen([sys.executable, "-m", "babysit", "bot", "--http", "0", "--host", "127.0.0.1",
                             "--request-wait", "3", "--registry", str(root / "babysit.toml")],
                            cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = proc.stdout.readline() if proc.stdout else ""
    if "serving" not in line:
        proc.kill()
        raise AssertionError(f"bot did not start: {line!r} {proc.stderr.read() if proc.stderr else ''}")
    url = line.split("serving ", 1)[1].strip()
    yield Bot(url, fake, root, proc)
    proc.terminate()
    proc.wait(10)
    fake.stop()


# -- verification -------------------------------------------------------------------------------------
def test_bad_signature_gets_401_and_queues_nothing(bot: Bot) -> None:
    before = len(bot.fake.calls)
    status, _, _ = slash(bot, "/babysit", f"poll {DONE}", secret="not-the-secret")
    assert status == 401
    time.sleep(0.3)
    assert bot.control_rows() == [] and len(bot.fake.calls) == before


def test_six_minute_old_request_is_a_replay_and_gets_401(bot: Bot) -> None:
    status, _, _ = slash(bot, "/babysit", f"abort {DONE}", user=ALLOWED, ts=int(time.time()) - 360)
    assert status == 401
    assert bot.control_rows() == []


# -- read-only commands -------------------------------------------------------------------------------
def test_help_lists_every_command(bot: Bot) -> None:
    status, ack, _ = slash(bot, "/babysit", "help")
    assert status == 200
    for word in ("/verdict RUN", "status", "runs", "poll", "chart", "gpus", "abort", "relaunch RUN"):
        assert word in ack["text"]


def test_unknown_subcommand_and_unknown_run_say_what_to_do(bot: Bot) -> None:
    _, ack, _ = slash(bot, "/babysit", "stauts")
    assert "/babysit help" in ack["text"]
    _, ack, _ = slash(bot, "/babysit", "status grasp_sft_v2_demosonly_1gpu_dsc")
    assert "No run named" in ack["text"] and f"`{DONE}`" in ack["text"]  # the close name


def test_status_and_runs_show_the_registered_runs(bot: Bot) -> None:
    store = bot.store()
    attempt = store.begin_attempt(DONE, 1, "default", ["python", "x"], "local", 1, str(bot.root), time.time())
    store.mark_running(attempt.id, started_at=time.time() - 3600)
    store.set_run_state(DONE, "running", time.time(), step=640)
    store.close()
    _, ack, _ = slash(bot, "/babysit", "status")
    assert DONE in ack["text"] and EARLY in ack["text"] and "640" in ack["text"]
    assert ack["blocks"][0]["text"]["text"].startswith("```")
    _, ack, _ = slash(bot, "/babysit", f"status {EARLY}")
    assert EARLY in ack["text"] and DONE not in ack["text"]
    _, ack, _ = slash(bot, "/babysit", "runs")
    assert "2 registered runs" in ack["text"] and f"`{DONE}` — running · attempt 1" in ack["text"]


def test_verdict_card_final_and_shared_with_post(bot: Bot) -> None:
    status, ack, path = slash(bot, "/verdict", DONE)
    assert status == 200 and "Reading the verdict" in ack["text"]
    (card,) = responses(bot, path)
    assert card["response_type"] == "ephemeral"
    assert "SAME-DRIFT" in card["text"] and "FINAL" in card["text"] and "rule" in card["text"]
    assert "PROVISIONAL" not in everything(card)
    _, _, path = slash(bot, "/verdict", f"{DONE} post")
    (shared,) = responses(bot, path)
    assert shared["response_type"] == "in_channel"


def test_verdict_before_the_read_step_is_unmistakably_provisional(bot: Bot) -> None:
    _, _, path = slash(bot, "/verdict", EARLY)
    (card,) = responses(bot, path)
    blocks = card["blocks"]
    assert blocks[0]["type"] == "header" and "PROVISIONAL — NOT A VERDICT" in blocks[0]["text"]["text"]
    assert "PROVISIONAL" in blocks[-1]["elements"][0]["text"]  # fenced top and bottom
    assert "NOT a verdict" in card["text"]


def test_chart_is_uploaded_to_the_channel(bot: Bot) -> None:
    _, ack, path = slash(bot, "/babysit", f"chart {DONE}")
    assert "Drawing" in ack["text"]
    (done,) = responses(bot, path, timeout=40)
    assert "uploaded" in done["text"], done
    (complete,) = bot.fake.calls_to("files.completeUploadExternal")
    assert complete.body["channel_id"] == CHANNEL
    assert any(data.startswith(b"\x89PNG") for data in bot.fake.uploads.values())


def test_gpus_labels_each_process_with_its_run_or_foreign(bot: Bot) -> None:
    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        store = bot.store()
        attempt = store.begin_attempt(EARLY, 1, "default", ["sleep"], "local", 1, str(bot.root), time.time())
        store.mark_running(attempt.id, started_at=time.time(), pid=sleeper.pid)
        store.close()
        (bot.root / "gpus.json").write_text(json.dumps({"gpus": [{"index": 0, "name": "Sim H200", "util_pct": 97,
            "memory_used_bytes": 2**33, "memory_total_bytes": 2**37,
            "processes": [{"pid": sleeper.pid, "name": "python", "used_memory_bytes": 2**33},
                          {"pid": 4242, "name": "policy_server", "used_memory_bytes": 2**30}]}]}))
        _, _, path = slash(bot, "/babysit", "gpus")
        (reply,) = responses(bot, path)
    finally:
        sleeper.kill()
        sleeper.wait()
    text = reply["text"]
    assert f"pid {sleeper.pid} python 8.0 GiB → {EARLY}" in text
    assert "pid 4242 policy_server 1.0 GiB → FOREIGN" in text


# -- poll ---------------------------------------------------------------------------------------------
def test_poll_queues_poll_now_and_answers_with_the_daemons_result(bot: Bot) -> None:
    _, ack, path = slash(bot, "/babysit", f"poll {DONE}")
    assert "requested" in ack["text"]
    store = bot.store()
    try:
        (request,) = [r for r in store.pending_requests() if r.kind == "poll-now"]  # acting as the daemon
        assert request.run == DONE and request.body["requested_by"] == "slack:U0CASUAL1"
        store.add_poll(DONE, 1, time.time(), "on-demand",
                       Snapshot.from_dict({"run": DONE, "step": 777, "seconds_per_step": 1.5}))
        store.finish_request(request.id, "polled", time.time())
    finally:
        store.close()
    (reply,) = responses(bot, path)
    assert "step 777" in reply["text"]


def test_poll_without_a_daemon_says_it_is_queued(bot: Bot) -> None:
    _, _, path = slash(bot, "/babysit", f"poll {EARLY}")
    (reply,) = responses(bot, path)
    assert "no daemon took it within 3s" in reply["text"]


# -- abort --------------------------------------------------------------------------------------------
def aborts(bot: Bot) -> list[Any]:
    return [r for r in bot.control_rows() if r["action"] == "abort"]


def click(bot: Bot, user: str, run: str) -> tuple[int, str]:
    path = f"/response/{next(_responses)}"
    payload = {"type": "block_actions", "team": {"id": "T0001"}, "user": {"id": user},
               "channel": {"id": CHANNEL}, "response_url": bot.fake.base + path, "trigger_id": "t2",
               "container": {"type": "message"}, "api_app_id": "A1", "token": "legacy",
               "actions": [{"type": "button", "action_id": "babysit_abort_confirmed", "block_id": "babysit_abort",
                            "value": run, "action_ts": str(time.time())}]}
    status, _ = send(bot, urlencode({"payload": json.dumps(payload)}))
    return status, path


def test_abort_by_a_user_not_on_the_allow_list_is_refused_and_queues_nothing(bot: Bot) -> None:
    _, ack, _ = slash(bot, "/babysit", f"abort {DONE}", user="U0NOBODY1")
    assert "not allowed" in ack["text"] and "Nothing was queued" in ack["text"]
    assert not any(b["type"] == "actions" for b in ack["blocks"])
    status, path = click(bot, "U0NOBODY1", DONE)  # a forged click from someone not listed
    assert status == 200
    (reply,) = responses(bot, path)
    assert "not allowed" in reply["text"]
    assert aborts(bot) == []


def test_abort_by_an_allow_listed_user_confirms_then_queues_exactly_one_abort(bot: Bot) -> None:
    _, ack, _ = slash(bot, "/babysit", f"abort {DONE}", user=ALLOWED)
    (actions,) = [b for b in ack["blocks"] if b["type"] == "actions"]
    (button,) = actions["elements"]
    assert button["action_id"] == "babysit_abort_confirmed" and button["value"] == DONE
    assert button["confirm"]["confirm"]["text"] == "Abort it"
    assert aborts(bot) == []  # the prompt alone queues nothing
    status, path = click(bot, ALLOWED, DONE)
    assert status == 200
    first = responses(bot, path)[0]
    assert "requested by" in first["text"] and first["replace_original"] is True
    (row,) = aborts(bot)
    assert row["run"] == DONE and row["requested_by"] == f"slack:{ALLOWED}"


def test_the_daemon_can_host_the_bot_in_process(bot: Bot, monkeypatch: pytest.MonkeyPatch) -> None:
    from bot.app import start_in_background

    monkeypatch.setenv("SLACK_BOT_TOKEN", TOKEN)
    monkeypatch.setenv("SLACK_SIGNING_SECRET", SECRET)
    monkeypatch.setenv("BABYSIT_SLACK_API_URL", bot.fake.api_url)
    hosted = start_in_background(bot.root / "babysit.toml", http_port=0)
    assert hosted is not None and hosted.mode == "http"
    try:
        inproc = Bot(f"http://127.0.0.1:{hosted.port}/slack/events", bot.fake, bot.root, bot.proc)
        status, ack, _ = slash(inproc, "/babysit", "runs")
        assert status == 200 and DONE in ack["text"]
        assert slash(inproc, "/babysit", "runs", secret="wrong")[0] == 401
    finally:
        hosted.stop()


def test_socket_mode_without_an_app_token_is_refused_not_crashed(monkeypatch: pytest.MonkeyPatch,
                                                                 tmp_path: Path) -> None:
    from bot.app import start_in_background

    monkeypatch.setenv("SLACK_BOT_TOKEN", TOKEN)
    monkeypatch.delenv("SLACK_APP_TOKEN", raising=False)
    assert start_in_background(tmp_path / "babysit.toml") is None  # logged; the daemon babysits on


# -- relaunch -----------------------------------------------------------------------------------------
def relaunches(bot: Bot) -> list[Any]:
    return [r for r in bot.control_rows() if r["action"].startswith("relaunch")]


def test_relaunch_is_for_allow_listed_users_and_queues_the_relaunch_of_a_failed_run(bot: Bot) -> None:
    failed = "grasp_failed"
    register(bot.root, failed, 4)
    store = bot.store()
    try:
        now = time.time()
        attempt = store.begin_attempt(failed, 1, "default", ["python", "-m", "trainr"], "local", 0, "", now - 60)
        store.mark_running(attempt.id, started_at=now - 60, pid=None)
        store.mark_ended(attempt.id, ended_at=now - 50, outcome="crashed", exit_code=1)
        store.set_run_state(failed, "failed", now - 50, ended="crashed")
    finally:
        store.close()
    _, ack, _ = slash(bot, "/babysit", f"relaunch {failed}", user="U0NOBODY1")
    assert "not allowed to relaunch" in ack["text"] and "Nothing was queued" in ack["text"]
    _, ack, path = slash(bot, "/babysit", f"relaunch {EARLY}", user=ALLOWED)
    (reply,) = responses(bot, path)
    assert reply["text"].startswith("`grasp_early` was not relaunched: grasp_early "), "it has not ended"
    assert "Nothing was queued" in reply["text"]
    assert relaunches(bot) == []

    _, ack, path = slash(bot, "/babysit", f"relaunch {failed} resume", user=ALLOWED)
    assert "re-reading its run.toml" in ack["text"]
    (reply,) = responses(bot, path)
    assert "no daemon took it within 3s" in reply["text"], "no daemon here: it waits for `babysit up`"
    (row,) = relaunches(bot)
    assert (row["run"], row["action"], row["requested_by"]) == (failed, "relaunch-resume", f"slack:{ALLOWED}")
    # the other tests share this bot: they see two registered runs and no control request
    registry.update(bot.root / "babysit.toml",
                    lambda r: (replace(r, runs=tuple(e for e in r.runs if e.name != failed)), None))
    store = bot.store()
    try:
        with store.tx() as db:
            db.execute("DELETE FROM control WHERE run=?", (failed,))
    finally:
        store.close()
