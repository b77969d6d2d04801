"""Slack delivers each command to ANY of an app's Socket Mode connections ("each payload may be sent to any
of the connections": Slack's Socket Mode docs). Two connections open — box-a's and box-b's bots, two
gateway candidates or a gateway and a stray `babysit bot --socket` — against the local Socket Mode server
drawing a connection at random for every envelope; two real daemons on one real PostgreSQL, three runs
each. Every `/verdict RUN` answers with RUN's verdict as its own box stored it, and every `/babysit abort
RUN` (the command, then the confirmed click: two envelopes, each drawn on its own) is carried out by RUN's
box, whichever bot got it (issue 27: with one SQLite a box, half of them reached the wrong box)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.fleet.helpers import PY, box_env, run_toml
from tests.fleet.test_fleet_reads import _body
from tests.reliability.harness import PREREG, gpu_file
from tests.slack.conftest import TOKEN
from tests.slack.fake_slack import FakeSlack
from tests.slack.fake_socket import FakeSocketMode
from tests.support import wait_for

APP_TOKEN = "xapp-test-token"
ADMIN = "U0ADMIN01"
RUNS = {"box-a": ("ra1", "ra2", "ra3"), "box-b": ("rb1", "rb2", "rb3")}


def _spec(box: Path, run: str, gpu: int) -> Path:
    return run_toml(box, run, gpus=[gpu], prereg=PREREG)


def _responses(fake: FakeSlack, path: str, n: int, timeout: float = 30.0) -> list[dict[str, Any]]:
    got: list[dict[str, Any]] = []

    def enough() -> bool:
        got[:] = [c.body for c in fake.calls_to("response") if c.path == path]
        return len(got) >= n

    wait_for(f"{n} answer(s) on {path}", enough, timeout=timeout, every=0.05)
    return got


@pytest.mark.slow  # ~40 s: two daemons, two bots, six trainers, 26 envelopes (CI runs it with the slow tests)
def test_commands_drawn_at_random_between_two_connections_reach_the_run_s_own_box(
        tmp_path: Path, pg_url: str) -> None:
    from babysit.db.postgres import PostgresStore

    fake = FakeSlack(TOKEN, APP_TOKEN).start()
    slack = FakeSocketMode(delivery="random", seed=27).start()
    fake.socket_mode = slack
    procs: list[subprocess.Popen[bytes]] = []
    boxes = {}
    store = PostgresStore(pg_url, host="test")
    try:
        for name, runs in RUNS.items():
            box = boxes[name] = tmp_path / name
            box.mkdir()
            gpu_file(box / "gpus.json")
            (box / "babysit.toml").write_text(
                f'[daemon]\nguard_interval_seconds = 3600\nchannel = "C0RUNS"\nabort_allow_list = ["{ADMIN}"]\n'
                f'[store]\nurl = "{pg_url}"\n[host]\nname = "{name}"\nlease_seconds = 3\n')
            for i, run in enumerate(runs):
                out = subprocess.run([PY, "-m", "babysit", "register", str(_spec(box, run, i % 2)), "--accelerated",
                                      "--registry", str(box / "babysit.toml")], cwd=box, env=box_env(box),
                                     capture_output=True, text=True, timeout=60)
                assert out.returncode == 0, out.stderr
        for box in boxes.values():
            env = {**box_env(box), "SLACK_BOT_TOKEN": TOKEN, "SLACK_APP_TOKEN": APP_TOKEN,
                   "BABYSIT_SLACK_API_URL": fake.api_url}
            for argv, log in ((["up", "--accelerated", "--no-view"], "daemon-out.txt"),
                              (["bot", "--socket"], "bot-out.txt")):
                with open(box / log, "wb") as out:
                    procs.append(subprocess.Popen([PY, "-m", "babysit", *argv, "--registry", str(box / "babysit.toml")],
                                                  cwd=box, env=env, stdout=out, stderr=subprocess.STDOUT,
                                                  start_new_session=True))
        slack.wait_links(2, timeout=60)
        every = [run for runs in RUNS.values() for run in runs]
        wait_for("every run running", lambda: sorted(a.run for a in store.live_attempts() if a.status == "running")
                 == sorted(every), timeout=90)
        owners = store.run_hosts()
        assert {run: owners[run] for run in every} == {run: box for box, runs in RUNS.items() for run in runs}
        for box, runs in RUNS.items():  # each box's FINAL read of its runs, as its daemon stores one
            own = PostgresStore(pg_url, host=box)
            try:
                for run in runs:
                    body = {**_body(run, "FINAL", 1000), "interpretation": f"{run} read on {box}"}
                    own.save_verdict(run, body, own.now(), final=True)
            finally:
                own.close()
        # box-b's GPUs, as its daemon published them with its lease (the gateway's /babysit gpus reads them)
        info = wait_for("box-b's GPU report", lambda: next(
            (h.info.get("gpus") for h in store.hosts() if h.name == "box-b" and h.info.get("gpus")), None))
        assert [g["name"] for g in info["gpus"]] == ["Simulated H200 #0", "Simulated H200 #1"], info

        drawn: dict[str, list[tuple[str, int]]] = {"verdict": [], "click": []}  # (the run's box, the link)

        def delivered(what: str, run: str, envelope: str, ack: Any) -> None:
            (delivery,) = slack.deliveries_of(envelope)  # once: no redelivery, so no second answer
            assert ack.link == delivery.link, (ack, delivery)  # answered by the bot it was delivered to
            drawn[what].append((owners[run], delivery.link))

        # 14 /verdict commands, round-robin over the six runs
        for i in range(14):
            run = every[i % len(every)]
            path = f"/response/verdict-{i}"
            envelope = slack.slash_command("/verdict", run, user="U0ANYONE", channel="C0RUNS",
                                           response_url=fake.base + path)
            ack = slack.wait_ack(envelope)
            assert ack.payload and run in ack.payload["text"], ack
            delivered("verdict", run, envelope, ack)
            (card,) = _responses(fake, path, 1)
            assert "FINAL VERDICT" in json.dumps(card) and f"{run} read on {owners[run]}" in json.dumps(card), card

        # six aborts: the command (the confirm button) and the click, each drawn on its own
        for i, run in enumerate(every):
            envelope = slack.slash_command("/babysit", f"abort {run}", user=ADMIN, channel="C0RUNS",
                                           response_url=fake.base + f"/response/ask-{i}")
            ack = slack.wait_ack(envelope)
            assert ack.payload and f"Abort `{run}`?" in ack.payload["text"], ack
            path = f"/response/abort-{i}"
            click = slack.block_action("babysit_abort_confirmed", run, user=ADMIN, channel="C0RUNS",
                                       response_url=fake.base + path)
            delivered("click", run, click, slack.wait_ack(click))
            queued, result = _responses(fake, path, 2)
            assert f"Abort of `{run}` requested" in queued["text"], queued
            assert f"`{run}` is stopping: the daemon sent SIGTERM" in result["text"], result
        rows = store._query("SELECT run, host, claimed_by, result FROM control WHERE action = 'abort' ORDER BY id")
        assert [(r[0], r[1], r[2], r[3]) for r in rows] == [(run, owners[run], owners[run], "stopping") for run in every]
        wait_for("every run aborted", lambda: not store.live_attempts(), timeout=60)
        ended = {a.run: a.outcome for a in store.all_attempts()}
        assert ended == dict.fromkeys(every, "stopped"), ended  # SIGTERM on request: stopped, no retry

        # both connections answered: the draws did spread the envelopes (the seed makes it so every time)
        used = {d.link for d in slack.deliveries}
        assert len(slack.open_links()) == 2 and used == {1, 2}, slack.deliveries
        # ...and each bot got commands for the other box's runs: a /verdict of each box's runs on each
        # connection, and one connection got the abort clicks of both boxes' runs (whichever bot it is)
        assert {(box, link) for box, link in drawn["verdict"]} == {(b, n) for b in RUNS for n in (1, 2)}, drawn
        assert any({box for box, link in drawn["click"] if link == n} == set(RUNS) for n in (1, 2)), drawn
        assert len(slack.deliveries) >= 26 and not [a for a in slack.acks if a.late]
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
        for a in store.live_attempts():
            if a.pid and a.pid > 1:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(a.pid, signal.SIGKILL)
        store.close()
        slack.stop()
        fake.stop()
