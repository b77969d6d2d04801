"""`babysit up --bot` over Socket Mode: one real daemon process posts through the Web API and answers through
the socket. A socket side that is unreachable (apps.connections.open failing, the server gone) never stops
the babysitting; once Slack is back the bot connects by itself and an abort is confirmed and carried out."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from babysit.db.store import Store
from bot.messages import ABORT_ACTION_ID
from tests.slack.conftest import TOKEN
from tests.slack.fake_slack import FakeSlack
from tests.slack.fake_socket import FakeSocketMode
from tests.support import TRAIN_LOG, register, run_toml, wait_for

APP_TOKEN = "xapp-test-token"
ALLOWED = "UALLOWED01"
RUN = "sock_run"
TRAINER = Path(__file__).resolve().parents[1] / "reliability" / "fake_trainer.py"


def workspace(root: Path) -> None:
    (root / "babysit.toml").write_text(f'[daemon]\nchannel = "C0RUNS"\nabort_allow_list = ["{ALLOWED}"]\n')
    cmd = [sys.executable, str(TRAINER), f"outputs/{RUN}/train_log.jsonl", "--steps", "100000", "--sleep", "0.1"]
    register(root, run_toml(RUN, cmd, log=TRAIN_LOG, gpus=[], poll=(1, 1),
                            guards={"min_free_host_ram_gib": 0.1, "stop_grace_seconds": 5, "stall_minutes": 120}))


def thread_posts(fake: FakeSlack) -> int:
    return sum(1 for p in fake.posts() if p["thread_ts"])


@pytest.mark.slow  # ~11 s alone, ~17 s beside other tests: a daemon, a trainer and the bot's reconnect backoff
def test_up_bot_posts_and_answers_in_one_process_and_babysits_on_while_the_socket_is_gone(tmp_path: Path) -> None:
    workspace(tmp_path)
    fake = FakeSlack(TOKEN, APP_TOKEN).start()
    slack = FakeSocketMode().start()
    env = {**os.environ, "SLACK_BOT_TOKEN": TOKEN, "SLACK_APP_TOKEN": APP_TOKEN, "BABYSIT_SLACK_API_URL": fake.api_url,
           "BABYSIT_GPU_PROBE": "none"}
    env.pop("BABYSIT_SLACK_CHANNEL", None)
    with open(tmp_path / "daemon-out.txt", "wb") as out:
        daemon = subprocess.Popen([sys.executable, "-m", "babysit", "up", "--accelerated", "--bot", "--no-view",
                                   "--registry", str(tmp_path / "babysit.toml")], cwd=tmp_path, env=env,
                                  stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        # Slack's socket side unreachable at startup (apps.connections.open fails): the daemon babysits
        wait_for("the launch post", lambda: any(RUN in (p["text"] or "") for p in fake.posts()), timeout=60)
        wait_for("polls posted before the bot could connect", lambda: thread_posts(fake) >= 2, timeout=30)
        assert fake.calls_to("apps.connections.open") and not slack.links

        # reachable again: the bot connects by itself; one process, both directions
        fake.socket_mode = slack
        slack.wait_links(1, timeout=30)
        status = slack.slash_command("/babysit", f"status {RUN}", user="U0ANYONE", channel="C0RUNS",
                                     response_url=fake.base + "/response/status")
        assert RUN in slack.wait_ack(status).payload["text"]  # type: ignore[index]

        # the socket server goes away and cannot be reopened: the daemon keeps polling and posting
        fake.socket_mode = None  # apps.connections.open now fails
        slack.stop()  # every connection cut, every reconnect refused
        before = thread_posts(fake)
        wait_for("polls posted with the bot cut off", lambda: thread_posts(fake) >= before + 3, timeout=30)
        assert daemon.poll() is None

        # Slack is back (a new server, a new URL): the bot reconnects by itself, and an abort is confirmed
        # and carried out
        slack = FakeSocketMode().start()
        fake.socket_mode = slack
        slack.wait_links(1, timeout=30)
        prompt = slack.slash_command("/babysit", f"abort {RUN}", user=ALLOWED, channel="C0RUNS",
                                     response_url=fake.base + "/response/prompt")
        assert slack.wait_ack(prompt).payload["blocks"]  # type: ignore[index]
        slack.block_action(ABORT_ACTION_ID, RUN, user=ALLOWED, channel="C0RUNS",
                           response_url=fake.base + "/response/click")
        answers = wait_for("the abort's answer", lambda: [c.body["text"] for c in fake.calls_to("response")
                                                          if c.path == "/response/click" and "stopping" in
                                                          c.body.get("text", "")], timeout=30)
        assert len(answers) == 1
        store = Store.in_dir(tmp_path / ".babysit")
        try:
            wait_for("the run to end aborted", lambda: store.run_state(RUN)[0] not in ("pending", "running", "stopping"),
                     timeout=30)
            status_after = store.run_state(RUN)[0]
            requests = store._query("SELECT * FROM control WHERE action = 'abort'")
        finally:
            store.close()
        assert len(requests) == 1 and status_after == "stopped", status_after

        wait_for("the abort posted in the run's thread", lambda: any(
            "abort" in (p["text"] or "") and p["thread_ts"] for p in fake.posts()), timeout=30)
        assert daemon.poll() is None
    finally:
        if daemon.poll() is None:
            os.killpg(daemon.pid, signal.SIGKILL)
        daemon.wait(10)
        slack.stop()
        fake.stop()
