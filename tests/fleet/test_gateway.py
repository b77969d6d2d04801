"""One bot for the fleet (docs/fleet.md): two real daemons started with `--bot` on one real PostgreSQL,
against the local Socket Mode server: only the box holding the gateway lease opens a connection (so Slack
has one to deliver each command to); its daemon SIGKILLed, the other box takes the lapsed lease and
connects, and answers."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from tests.fleet.helpers import PY, box_env
from tests.reliability.harness import gpu_file
from tests.slack.conftest import TOKEN
from tests.slack.fake_slack import FakeSlack
from tests.slack.fake_socket import FakeSocketMode
from tests.support import wait_for

APP_TOKEN = "xapp-test-token"
LEASE_S = 3.0


def _holders(url: str) -> list[str]:
    from babysit.db.postgres import PostgresStore

    store = PostgresStore(url, host="test")
    try:
        return [r[0] for r in store._query("SELECT name FROM hosts WHERE gateway_until > ?", (store.now(),))]
    finally:
        store.close()


@pytest.mark.slow  # ~16 s: two daemons, a lease to lapse (CI runs it with the slow tests)
def test_only_the_gateway_box_opens_socket_mode_and_another_takes_over_when_it_dies(
        tmp_path: Path, pg_url: str) -> None:
    fake = FakeSlack(TOKEN, APP_TOKEN).start()
    slack = FakeSocketMode().start()
    fake.socket_mode = slack
    procs: dict[str, subprocess.Popen[bytes]] = {}
    try:
        for name in ("box-a", "box-b"):
            box = tmp_path / name
            box.mkdir()
            gpu_file(box / "gpus.json")
            (box / "babysit.toml").write_text(f'[daemon]\nchannel = "C0RUNS"\n[store]\nurl = "{pg_url}"\n'
                                              f'[host]\nname = "{name}"\nlease_seconds = {LEASE_S}\n')
            env: dict[str, Any] = {**box_env(box), "SLACK_BOT_TOKEN": TOKEN, "SLACK_APP_TOKEN": APP_TOKEN,
                                   "BABYSIT_SLACK_API_URL": fake.api_url}
            env.pop("BABYSIT_SLACK_CHANNEL", None)
            with open(box / "daemon-out.txt", "wb") as out:
                procs[name] = subprocess.Popen(
                    [PY, "-m", "babysit", "up", "--accelerated", "--bot", "--no-view", "--registry",
                     str(box / "babysit.toml")], cwd=box, env=env, stdout=out, stderr=subprocess.STDOUT,
                    start_new_session=True)
        slack.wait_links(1, timeout=60)
        holder = wait_for("one gateway holder", lambda: _holders(pg_url), timeout=30)
        assert len(holder) == 1
        time.sleep(LEASE_S * 2)  # six renewals of both boxes: the other box's claims all refused
        assert len(slack.open_links()) == 1 and len(slack.links) == 1, slack.links  # before: two connections
        assert _holders(pg_url) == holder

        # the holder's daemon SIGKILLed: its websocket drops; the other box takes the lapsed lease
        (gone,) = holder
        other = "box-b" if gone == "box-a" else "box-a"
        os.killpg(procs[gone].pid, signal.SIGKILL)
        procs.pop(gone).wait(10)
        killed = time.monotonic()
        second = slack.wait_links(2, timeout=LEASE_S * 5)
        assert time.monotonic() - killed < LEASE_S * 3
        assert _holders(pg_url) == [other]
        assert len(slack.open_links()) == 1 and slack.open_links()[0] is second
        answer = slack.slash_command("/babysit", "status", user="U0ANYONE", channel="C0RUNS",
                                     response_url=fake.base + "/response/status")
        ack = slack.wait_ack(answer)
        assert ack.link == 2 and ack.payload and "runs" in ack.payload["text"], ack  # the new gateway answers
    finally:
        for proc in procs.values():
            proc.send_signal(signal.SIGTERM)
        for proc in procs.values():
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
        slack.stop()
        fake.stop()


def test_one_gateway_among_three_claimants_and_a_stopped_holder_frees_it_at_once(pg_url: str) -> None:
    """Three boxes' lease members claiming the gateway at every renewal: one holds it, the others are
    refused round after round; the holder stopped on purpose frees it, and another takes it at its next
    renewal (a third of a lease), not after a whole lease."""
    from babysit.db.fleet import FleetMember

    told: dict[str, list[bool]] = {}
    members = {}
    for name in ("box-a", "box-b", "box-c"):
        told[name] = []
        members[name] = FleetMember(pg_url, name, on_wake=lambda: None, on_alert=lambda: None, lease_s=LEASE_S,
                                    on_gateway=told[name].append)
    try:
        for member in members.values():
            member.start()
        time.sleep(LEASE_S)  # three renewals each
        holders = [n for n, m in members.items() if m.gateway]
        assert len(holders) == 1 and _holders(pg_url) == holders, told
        (first,) = holders
        assert told[first] == [True] and all(told[n] == [] for n in members if n != first), told
        stopped = time.monotonic()
        members.pop(first).close()
        assert told[first] == [True, False]
        new = wait_for("another holder", lambda: [n for n, m in members.items() if m.gateway], timeout=LEASE_S * 2)
        assert time.monotonic() - stopped < LEASE_S * 0.8, "the stopped holder's lease was waited out"
        assert len(new) == 1 and _holders(pg_url) == new
    finally:
        for member in members.values():
            member.close()
