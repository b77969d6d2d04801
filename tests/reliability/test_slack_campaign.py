"""Slack campaign: the real outbox worker and SlackChannel over real HTTP against tests/slack/fake_slack.py,
through outages of many minutes (a time-shifted clock: each delivery round is 5 s or a minute of
daemon time), 429 storms, slow answers and connection resets before and after Slack took the post.
Nothing lost, nothing posted twice, each run's order kept, threads intact, and the delivering
process's memory flat while its outbox grows through a long outage.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from babysit.channels.notify import deliver_due
from babysit.db.store import Store
from babysit.slack.channel import SlackChannel
from babysit.slack.client import web_client
from tests.slack.fake_slack import FakeSlack

TOKEN = "xoxb-reliability-token"
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeSlack]:
    server = FakeSlack(TOKEN).start()
    monkeypatch.setenv("BABYSIT_SLACK_API_URL", server.api_url)
    monkeypatch.setenv("SLACK_BOT_TOKEN", TOKEN)
    yield server
    server.stop()


class Clock:
    def __init__(self) -> None:
        self.t = 1_000_000.0

    def __call__(self) -> float:
        return self.t


def launch(store: Store, run: str, t: float) -> int:
    return store.enqueue(run, "launch", {"run": run, "attempt": 1, "max_attempts": 3, "profile": "p",
                                         "argv": ["python", "-m", "trainer"], "gpus": [0], "executor": "local",
                                         "channel": "C0RUNS"}, t)


def poll(store: Store, run: str, root: int, t: float, step: int) -> int:
    return store.enqueue(run, "poll", {"run": run, "snapshot": {"run": run, "kind": "periodic", "step": step}}, t,
                         thread_of=root)


def check_delivered_once_in_order(fake: FakeSlack, store: Store) -> None:
    posts = fake.posts()
    ids = [p["metadata"]["event_payload"]["id"] for p in posts]
    assert len(ids) == len(set(ids)), f"posted twice: {sorted(i for i in set(ids) if ids.count(i) > 1)}"
    everything = [m.id for m in store.messages() if m.kind != "header"]
    assert sorted(ids) == everything, "every message posted (headers are edits)"
    assert all(m.status == "sent" for m in store.messages())
    by_ts = {p["ts"]: p for p in posts}
    for run in {m.run for m in store.messages()}:
        own = [i for i in ids if store.message(i).run == run]
        assert own == sorted(own), f"{run} out of order: {own}"
    for p in posts:  # a poll is threaded under its own run's launch post
        m = store.message(p["metadata"]["event_payload"]["id"])
        if m.thread_of is not None:
            parent = by_ts[p["thread_ts"]]
            assert parent["metadata"]["event_payload"]["id"] == m.thread_of


def clear(fake: FakeSlack) -> None:
    fake.fail(0)
    fake.rate_limit(0, 1)
    fake.slow(0, 0)
    fake.reset(0)
    fake.reset(0, after_handling=True)


def test_a_twenty_minute_storm_of_outages_429s_slow_answers_and_resets_loses_and_repeats_nothing(
        fake: FakeSlack, tmp_path: Path) -> None:
    """Three runs keep queueing while Slack is down for 6 minutes (each round 5 s of daemon time), then rate-limits, answers slowly and
    drops connections (before and after taking the post), then comes back."""
    store = Store.in_dir(tmp_path)
    ch = SlackChannel(web_client(timeout=1), tmp_path, default_channel="C0RUNS", store=store)
    clock = Clock()
    rng = random.Random(7)
    roots = {run: launch(store, run, clock.t) for run in ("a", "b", "c")}
    phases = [(72, "outage"), (24, "429"), (6, "slow"), (60, "reset"), (60, "reset-after"), (60, "mixed")]
    step = 0
    for rounds, phase in phases:  # 5 s a round: 282 rounds = 23.5 minutes of daemon time
        clear(fake)
        for _ in range(rounds):
            step += 1
            run = rng.choice(sorted(roots))
            poll(store, run, roots[run], clock.t, step)
            if phase == "outage":
                fake.fail(10**6)
            elif phase == "429":
                fake.fail(0)
                fake.rate_limit(3, retry_after=rng.choice((1, 5, 30)))
            elif phase == "slow":
                fake.slow(1, 1.3)  # past the client's 1 s timeout: the post lands, the answer is lost
            elif phase == "reset":
                fake.reset(1, only={"chat.postMessage"})
            elif phase == "reset-after":
                fake.reset(1, after_handling=True, only={"chat.postMessage"})
            else:  # mixed: one random fault a round
                fault = rng.choice(("429", "reset", "reset-after", "503", "none"))
                if fault == "429":
                    fake.rate_limit(1, retry_after=2)
                elif fault == "503":
                    fake.fail(1)
                elif fault != "none":
                    fake.reset(1, after_handling=fault == "reset-after", only={"chat.postMessage"})
            deliver_due(store, ch, clock)
            clock.t += 5
    clear(fake)
    for _ in range(400):
        if store.pending_count() == 0:
            break
        deliver_due(store, ch, clock)
        clock.t += 30
    assert store.pending_count() == 0
    assert fake.calls_to("chat.postMessage", outcome="503") and fake.calls_to("chat.postMessage", outcome="429")
    assert fake.calls_to("chat.postMessage", outcome="reset") and fake.calls_to("chat.postMessage", "reset-after")
    check_delivered_once_in_order(fake, store)
    store.close()


def test_429_storm_waits_out_every_retry_after_and_never_hammers(fake: FakeSlack, tmp_path: Path) -> None:
    store = Store.in_dir(tmp_path)
    ch = SlackChannel(web_client(), tmp_path, default_channel="C0RUNS", store=store)
    clock = Clock()
    root = launch(store, "r", clock.t)
    for s in range(5):
        poll(store, "r", root, clock.t, s)
    fake.rate_limit(20, retry_after=60)
    for _ in range(20 * 12 + 60):  # 5 s rounds
        deliver_due(store, ch, clock)
        clock.t += 5
    limited = [c for c in fake.calls if c.outcome == "429"]  # a post, or the lookup for an earlier try
    assert len(limited) == 20, "one call per Retry-After window (60 s = 12 rounds), never more"
    assert len(fake.calls) == 20 + 1 + 6, "then one lookup (for the message tried before) and six posts"
    assert store.pending_count() == 0
    check_delivered_once_in_order(fake, store)
    store.close()


def test_the_delivering_process_memory_stays_flat_through_a_long_outage(fake: FakeSlack, tmp_path: Path) -> None:
    """600 rounds (10 hours of daemon time) of an outage while 6000 messages pile up in the outbox."""
    fake.fail(10**9)
    env = {**os.environ, "BABYSIT_SLACK_API_URL": fake.api_url, "SLACK_BOT_TOKEN": TOKEN, "PYTHONPATH": str(ROOT)}
    res = subprocess.run([sys.executable, "-m", "tests.reliability.slack_worker", str(tmp_path), "600", "10"],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-3000:]
    samples = [json.loads(line) for line in res.stdout.splitlines() if line.startswith("{\"round\"")]
    assert samples[-1]["pending"] == 6000
    warm = samples[2]["rss"]  # after the first 100 rounds: imports, SQLite cache and HTTP pools are warm
    growth = samples[-1]["rss"] - warm
    assert growth < 4 * 2**20, f"RSS grew {growth / 2**20:.1f} MiB while the outbox grew: {samples}"
    assert fake.calls_to("chat.postMessage", outcome="503"), "the worker kept trying through the outage"
