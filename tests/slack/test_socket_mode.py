"""`babysit bot --socket` as a real subprocess (Bolt's real Socket Mode client) against a local Socket Mode
server (tests/slack/fake_socket.py) and the fake Web API: commands and clicks answered through the
socket, acks inside Slack's 3 s, and reconnects — after a `disconnect`, a dropped socket, a lost ack —
that neither lose nor double a command."""

from __future__ import annotations

import itertools
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from babysit.db.store import Store
from bot.messages import ABORT_ACTION_ID
from bot.owner_calls import HOLD_ACTION_ID
from tests.slack.conftest import TOKEN
from tests.slack.fake_slack import FakeSlack
from tests.slack.fake_socket import FakeSocketMode
from tests.slack.test_bot_http import ALLOWED, CHANNEL, DONE, EARLY, FIXTURES, register

APP_TOKEN = "xapp-test-token"
OWNER = "UOWNER0001"
REQUEST_WAIT_S = 4  # /babysit poll and abort answer after this: longer than Slack's 3 s ack limit
_paths = itertools.count(1)


@dataclass
class SocketBot:
    fake: FakeSlack
    slack: FakeSocketMode
    root: Path
    proc: subprocess.Popen
    owner_call: int  # an open owner call of the campaign "saga" (owners: OWNER)

    def command(self, command: str, text: str, user: str = "U0CASUAL1") -> tuple[str, str]:
        """Send a slash command through the socket; returns (envelope id, its response_url path)."""
        path = f"/response/socket-{next(_paths)}"
        envelope = self.slack.slash_command(command, text, user=user, channel=CHANNEL,
                                            response_url=self.fake.base + path)
        return envelope, path

    def click_abort(self, run: str, user: str) -> tuple[str, str]:
        path = f"/response/socket-{next(_paths)}"
        envelope = self.slack.block_action(ABORT_ACTION_ID, run, user=user, channel=CHANNEL,
                                           response_url=self.fake.base + path)
        return envelope, path

    def responses(self, path: str, n: int = 1, timeout: float = 20.0) -> list[dict[str, Any]]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            got = self.responses_now(path)
            if len(got) >= n:
                return got
            time.sleep(0.05)
        raise AssertionError(f"fewer than {n} response(s) on {path} within {timeout}s")

    def responses_now(self, path: str) -> list[dict[str, Any]]:
        return [c.body for c in self.fake.calls_to("response") if c.path == path]

    def requests_by(self, user: str) -> list[Any]:
        store = Store.in_dir(self.root / ".babysit")
        try:
            return [r for r in store._query("SELECT * FROM control") if r["requested_by"] == f"slack:{user}"]
        finally:
            store.close()

    def link_count(self) -> int:
        with self.slack.lock:
            return len(self.slack.links)


def open_owner_call(root: Path) -> int:
    """A campaign whose owner call (launch the next run, or hold?) waits for OWNER's click."""
    (root / "campaign.toml").write_text(f'[campaign]\nname = "saga"\nquestion = "why?"\nowners = ["{OWNER}"]\n'
                                        '[[suspects]]\nname = "lr"\n')
    store = Store.in_dir(root / ".babysit")
    try:
        store.save_campaign("saga", str(root / "campaign.toml"), "0" * 64, time.time())
        call = store.open_owner_call("saga", DONE, "launch the next run, or hold?", ("launch", "hold"),
                                     {"label": "HEALTHY", "proposals": {}}, time.time(), dedupe_key="socket")
    finally:
        store.close()
    return call.id


@pytest.fixture(scope="module")
def bot(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SocketBot]:
    root = tmp_path_factory.mktemp("socketbot")
    shutil.copy(FIXTURES / "rigonly_train_log.jsonl", root)
    (root / "babysit.toml").write_text(f'[daemon]\nchannel = "{CHANNEL}"\nabort_allow_list = ["{ALLOWED}"]\n')
    register(root, DONE, None)
    register(root, EARLY, 4)
    owner_call = open_owner_call(root)
    fake = FakeSlack(TOKEN, APP_TOKEN).start()
    slack = FakeSocketMode().start()
    fake.socket_mode = slack
    env = {**os.environ, "SLACK_BOT_TOKEN": TOKEN, "SLACK_APP_TOKEN": APP_TOKEN,
           "BABYSIT_SLACK_API_URL": fake.api_url}
    env.pop("SLACK_SIGNING_SECRET", None)
    proc = subprocess.Popen([sys.executable, "-m", "babysit", "bot", "--socket", "--request-wait",
                             str(REQUEST_WAIT_S), "--registry", str(root / "babysit.toml")],
                            cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = proc.stdout.readline() if proc.stdout else ""
    if "Socket Mode" not in line:
        proc.kill()
        raise AssertionError(f"bot did not start: {line!r} {proc.stderr.read() if proc.stderr else ''}")
    slack.wait_links(1)
    yield SocketBot(fake, slack, root, proc, owner_call)
    proc.kill()
    proc.wait(10)
    slack.stop()
    fake.stop()


def test_slash_command_is_acked_with_its_answer_through_the_socket(bot: SocketBot) -> None:
    envelope, _ = bot.command("/babysit", "help")
    ack = bot.slack.wait_ack(envelope)
    assert ack.payload is not None and "/verdict RUN" in ack.payload["text"]
    assert not ack.late and len(bot.slack.deliveries_of(envelope)) == 1


def test_verdict_acks_at_once_and_answers_through_the_response_url(bot: SocketBot) -> None:
    envelope, path = bot.command("/verdict", DONE)
    ack = bot.slack.wait_ack(envelope)
    assert ack.payload is not None and "Reading the verdict" in ack.payload["text"]
    (card,) = bot.responses(path)
    assert "SAME-DRIFT" in card["text"] and "FINAL" in card["text"]


def test_a_slow_answer_is_acked_within_three_seconds_and_answered_later(bot: SocketBot) -> None:
    """/babysit poll waits REQUEST_WAIT_S (> 3 s) for a daemon: the ack goes first, the answer after."""
    user = "U0SLOWPOLL"
    envelope, path = bot.command("/babysit", f"poll {DONE}", user=user)
    ack = bot.slack.wait_ack(envelope)
    assert ack.payload is not None and "Poll of" in ack.payload["text"]
    assert bot.responses_now(path) == []  # the answer is still being waited for
    (answer,) = bot.responses(path)
    assert "no daemon took it" in answer["text"]
    assert not ack.late and len(bot.slack.deliveries_of(envelope)) == 1  # never re-sent: acked in time
    assert len(bot.requests_by(user)) == 1


def test_abort_is_confirmed_then_queued_once_from_the_button_click(bot: SocketBot) -> None:
    envelope, _ = bot.command("/babysit", f"abort {DONE}", user=ALLOWED)
    ack = bot.slack.wait_ack(envelope)
    assert ack.payload is not None
    buttons = [e for b in ack.payload["blocks"] if b["type"] == "actions" for e in b["elements"]]
    assert buttons[0]["action_id"] == ABORT_ACTION_ID and buttons[0]["confirm"]
    assert bot.requests_by(ALLOWED) == []  # nothing queued before the confirmed click

    click, path = bot.click_abort(DONE, ALLOWED)
    assert bot.slack.wait_ack(click).payload is None  # a click is acked empty; the answer replaces the prompt
    queued, unanswered = bot.responses(path, 2)
    assert queued["replace_original"] is True and "requested by" in queued["text"]
    assert "no daemon took it" in unanswered["text"]
    (request,) = bot.requests_by(ALLOWED)
    assert request["run"] == DONE and request["action"] == "abort"


def test_abort_from_someone_off_the_allow_list_is_refused_and_queues_nothing(bot: SocketBot) -> None:
    envelope, _ = bot.command("/babysit", f"abort {DONE}", user="U0INTRUDER")
    assert "not allowed to abort" in bot.slack.wait_ack(envelope).payload["text"]  # type: ignore[index]
    click, path = bot.click_abort(DONE, "U0INTRUDER")  # a forged click: the allow list is checked again
    bot.slack.wait_ack(click)
    (refused,) = bot.responses(path)
    assert "not allowed to abort" in refused["text"]
    assert bot.requests_by("U0INTRUDER") == []


@pytest.mark.parametrize("reason", ["refresh_requested", "link_disabled"])
def test_after_a_disconnect_the_bot_reconnects_and_no_command_is_lost_or_doubled(bot: SocketBot,
                                                                                  reason: str) -> None:
    user = f"U0DISC{reason[:4].upper()}"
    before = bot.link_count()
    bot.slack.disconnect(reason)
    sent = [bot.command("/babysit", f"poll {DONE}", user=user) for _ in range(2)]  # while it reconnects
    bot.slack.wait_links(before + 1)
    for envelope, _ in sent:
        assert bot.slack.wait_ack(envelope).payload is not None
    after, _ = bot.command("/babysit", f"poll {DONE}", user=user)
    assert bot.slack.wait_ack(after).link > before  # answered on a new connection
    assert len(bot.requests_by(user)) == 3  # one request a command: none lost, none doubled
    for envelope, path in sent:
        bot.responses(path)
        assert len(bot.responses_now(path)) == 1 and len(bot.slack.acks_of(envelope)) >= 1


def dropped(bot: SocketBot, user: str, *, reset: bool, reconnect_s: float) -> None:
    before = bot.link_count()
    bot.slack.drop(reset=reset)
    envelope, path = bot.command("/babysit", f"poll {DONE}", user=user)
    bot.slack.wait_links(before + 1, timeout=reconnect_s)
    assert bot.slack.wait_ack(envelope, timeout=reconnect_s).link > before
    bot.responses(path)
    assert len(bot.requests_by(user)) == 1 and len(bot.responses_now(path)) == 1


def test_after_the_socket_is_reset_the_bot_reconnects_and_no_command_is_lost_or_doubled(bot: SocketBot) -> None:
    dropped(bot, "U0RESET", reset=True, reconnect_s=15)


@pytest.mark.slow  # slack_sdk 3.48's built-in client notices a FIN only when its pings fail: ~10 s
def test_after_the_socket_is_closed_without_a_close_frame_the_bot_reconnects_and_loses_nothing(
        bot: SocketBot) -> None:
    dropped(bot, "U0DROPPED", reset=False, reconnect_s=40)


def test_an_ack_lost_in_flight_is_re_sent_and_the_command_runs_once(bot: SocketBot) -> None:
    """The ack dies with its connection; Slack re-sends the envelope on the next one after 3 s: the bot
    acks it again with the same answer and does not queue a second request or answer twice."""
    user = "U0LOSTACK"
    before = bot.link_count()
    bot.slack.lose_next_ack()
    envelope, path = bot.command("/babysit", f"poll {DONE}", user=user)
    bot.slack.wait_links(before + 1)
    ack = bot.slack.wait_ack(envelope, timeout=15)
    deliveries = bot.slack.deliveries_of(envelope)
    assert [d.attempt for d in deliveries] == [0, 1] and deliveries[1].link > deliveries[0].link
    assert ack.payload is not None and "Poll of" in ack.payload["text"]  # the first run's ack, again
    bot.responses(path)
    time.sleep(0.5)
    assert len(bot.requests_by(user)) == 1 and len(bot.responses_now(path)) == 1


def test_an_owner_call_click_whose_ack_is_lost_is_decided_and_recorded_once(bot: SocketBot) -> None:
    """The campaign's owner-call button through the socket; its re-send must not come back as a second
    click ("already decided") in the record."""
    before = bot.link_count()
    bot.slack.lose_next_ack()
    path = f"/response/socket-{next(_paths)}"
    click = bot.slack.block_action(HOLD_ACTION_ID, str(bot.owner_call), user=OWNER, channel=CHANNEL,
                                   response_url=bot.fake.base + path)
    bot.slack.wait_links(before + 1)
    bot.slack.wait_ack(click, timeout=15)
    assert [d.attempt for d in bot.slack.deliveries_of(click)] == [0, 1]
    (answer,) = bot.responses(path)
    assert f"*hold* chosen by <@{OWNER}>" in answer["text"]
    time.sleep(0.5)
    store = Store.in_dir(bot.root / ".babysit")
    try:
        clicks = [(c["user"], c["action"], c["outcome"]) for c in store.clicks()]
        decided = store.owner_call(bot.owner_call)
    finally:
        store.close()
    assert clicks == [(OWNER, "hold", "accepted")] and decided.decision == "hold"
    assert len(bot.responses_now(path)) == 1


@pytest.mark.parametrize(("app_token", "says"), [(APP_TOKEN, "Slack is unreachable"), ("xapp-revoked", "SLACK_APP_TOKEN")])
def test_bot_socket_that_cannot_connect_exits_saying_why(tmp_path: Path, app_token: str, says: str) -> None:
    (tmp_path / "babysit.toml").write_text(f'[daemon]\nchannel = "{CHANNEL}"\n')
    fake = FakeSlack(TOKEN, APP_TOKEN).start()  # no socket server: apps.connections.open fails
    try:
        env = {**os.environ, "SLACK_BOT_TOKEN": TOKEN, "SLACK_APP_TOKEN": app_token, "BABYSIT_SLACK_API_URL": fake.api_url}
        res = subprocess.run([sys.executable, "-m", "babysit", "bot", "--socket", "--registry",
                              str(tmp_path / "babysit.toml")], cwd=tmp_path, env=env, capture_output=True, text=True,
                             timeout=60)
    finally:
        fake.stop()
    assert res.returncode != 0 and "cannot open Socket Mode" in res.stderr and says in res.stderr, res.stderr
    assert "Traceback" not in res.stderr
