"""SlackChannel against a real local HTTP server: placement, outages, 429s and restarts lose nothing and
post nothing twice."""

from __future__ import annotations

import time
from pathlib import Path

from babysit.channels.delivery import DeliveryWorker
from babysit.channels.notify import Delivery, deliver_due
from babysit.core.snapshot import Snapshot
from babysit.db.store import PollRow, Store
from babysit.slack.channel import SlackChannel
from babysit.slack.client import web_client
from tests.slack.conftest import PNG, TOKEN
from tests.slack.fake_slack import FakeSlack

VERDICT = {"run": "r1", "status": "FINAL", "metric": "eval_mae", "baseline_step": 500, "read_step": 1000,
           "at_step": 1000, "baseline": 1.0, "read": 1.6929, "delta": 0.6929, "label": "AMBIGUOUS",
           "rules": [{"name": "original", "bounds": {"HEALTHY": {"max": 0.3}, "SAME-DRIFT": {"min": 1.0159}},
                      "label": "AMBIGUOUS"}],
           "interpretation": "owner call", "corroboration": {"train_delta": 0.1, "monotone_rise": True}}


class Clock:
    def __init__(self, start: float) -> None:
        self.t = start

    def __call__(self) -> float:
        return self.t


def channel(state: Path, store: Store) -> SlackChannel:
    return SlackChannel(web_client(), state, default_channel="C0DEFAULT", store=store)


def launch(store: Store, run: str, t: float, channel_name: str = "#ml-runs") -> int:
    return store.enqueue(run, "launch", {"run": run, "attempt": 1, "max_attempts": 3, "profile": "default",
                                         "argv": ["python", "-m", "trainer"], "gpus": [0], "executor": "local",
                                         "channel": channel_name}, t)


def poll(store: Store, run: str, parent: int, t: float, step: int) -> int:
    return store.enqueue(run, "poll", {"run": run, "snapshot": {"run": run, "kind": "periodic", "step": step}}, t,
                         thread_of=parent)


def drain(store: Store, ch: SlackChannel, clock: Clock, rounds: int = 60, step: float = 5.0) -> None:
    for _ in range(rounds):
        deliver_due(store, ch, clock)
        if store.pending_count() == 0:
            return
        clock.t += step
    raise AssertionError(f"{store.pending_count()} messages still pending")


def outbox_ids(fake: FakeSlack) -> list[int]:
    return [m["metadata"]["event_payload"]["id"] for m in fake.posts()]


def test_launch_threads_header_and_final_verdict_with_its_chart(slack_env: FakeSlack, state: Path, store: Store,
                                                                tmp_path: Path) -> None:
    clock = Clock(1_000_000.0)
    chart = tmp_path / "r1.png"
    chart.write_bytes(PNG)
    root = launch(store, "r1", clock.t)
    poll(store, "r1", root, clock.t, 10)
    store.enqueue("r1", "header", {"run": "r1", "attempt": 1, "snapshot": {"step": 10, "eta_seconds": 60}}, clock.t,
                  thread_of=root)
    store.enqueue("r1", "incident", {"run": "r1", "attempt": 1, "incident": "stalled", "message": "no step",
                                     "mention": ["U024BE7LH"]}, clock.t, thread_of=root)
    store.enqueue("r1", "verdict", {"run": "r1", "verdict": VERDICT, "chart_path": str(chart), "channel": "#ml-runs"},
                  clock.t)
    drain(store, channel(state, store), clock)

    posts = slack_env.posts()
    assert [p["metadata"]["event_payload"]["id"] for p in posts] == [1, 2, 4, 5]
    top = posts[0]
    assert top["channel"] == "CMLRUNS" and top["thread_ts"] is None and top["blocks"]
    assert posts[1]["thread_ts"] == top["ts"] and posts[2]["thread_ts"] == top["ts"]
    assert "<@U024BE7LH>" in posts[2]["text"]
    assert posts[3]["thread_ts"] is None and "AMBIGUOUS" in posts[3]["text"]  # the verdict: in the channel
    (update,) = slack_env.calls_to("chat.update")
    assert update.body["ts"] == top["ts"] and "python -m trainer" in update.body["text"]
    assert "step 10" in update.body["text"]
    assert list(slack_env.uploads.values()) == [PNG, PNG]  # into the channel and into the launch thread
    completes = slack_env.calls_to("files.completeUploadExternal")
    assert [c.body.get("channel_id") for c in completes] == ["CMLRUNS", "CMLRUNS"]
    assert [c.body.get("thread_ts") for c in completes] == [None, top["ts"]]
    assert store.message(1).remote_ref == f"CMLRUNS:{top['ts']}"


def test_outage_of_503s_then_recovery_delivers_each_message_once_in_order(slack_env: FakeSlack, state: Path,
                                                                         store: Store) -> None:
    clock = Clock(1_000_000.0)
    roots = {run: launch(store, run, clock.t) for run in ("a", "b")}
    for step in (1, 2, 3):
        for run, root in roots.items():
            poll(store, run, root, clock.t, step)
    slack_env.fail(9)
    drain(store, channel(state, store), clock)

    assert len(slack_env.calls_to("chat.postMessage", outcome="503")) > 0
    ids = outbox_ids(slack_env)
    assert sorted(ids) == list(range(1, 9))  # every message, once
    for run in ("a", "b"):
        own = [i for i in ids if store.message(i).run == run]
        assert own == sorted(own)  # and in each run's order
    assert all(store.message(i).status == "sent" for i in ids)


def test_429_burst_honours_retry_after(slack_env: FakeSlack, state: Path, store: Store) -> None:
    clock = Clock(1_000_000.0)
    launch(store, "r", clock.t)
    slack_env.rate_limit(1, retry_after=7)
    ch = channel(state, store)
    assert deliver_due(store, ch, clock) == 0
    message = store.message(1)
    assert message.status == "pending" and message.next_try_at == clock.t + 7
    clock.t += 6.9
    assert deliver_due(store, ch, clock) == 0 and len(slack_env.calls_to("chat.postMessage", None)) == 1
    clock.t += 0.1
    assert deliver_due(store, ch, clock) == 1
    assert outbox_ids(slack_env) == [1]


def test_connection_reset_after_slack_accepted_the_post_does_not_post_twice(slack_env: FakeSlack, state: Path,
                                                                            store: Store) -> None:
    clock = Clock(1_000_000.0)
    root = launch(store, "r", clock.t, channel_name="C0RUNS")
    poll(store, "r", root, clock.t, 5)
    ch = channel(state, store)
    slack_env.reset(2, after_handling=True, only={"chat.postMessage"})
    drain(store, ch, clock)
    assert outbox_ids(slack_env) == [1, 2]  # each accepted once, the lost answers found by metadata
    assert slack_env.calls_to("conversations.history") and slack_env.calls_to("conversations.replies")
    assert store.message(2).remote_ref.endswith(slack_env.posts()[1]["ts"])


def test_restart_between_post_and_mark_sent_reuses_the_post(slack_env: FakeSlack, state: Path, store: Store) -> None:
    clock = Clock(1_000_000.0)
    launch(store, "r", clock.t)
    message = store.message(1)
    ref = channel(state, store).deliver(Delivery(message, None, None))  # posted; the daemon dies before mark_sent
    store.close()

    fresh = Store.in_dir(state)
    try:
        assert deliver_due(fresh, channel(state, fresh), clock) == 1
        assert fresh.message(1).remote_ref == ref
    finally:
        fresh.close()
    assert outbox_ids(slack_env) == [1]


def test_restart_with_a_lost_journal_finds_the_post_by_its_metadata(slack_env: FakeSlack, state: Path,
                                                                    store: Store) -> None:
    clock = Clock(1_000_000.0)
    launch(store, "r", clock.t, channel_name="C0RUNS")
    slack_env.reset(1, after_handling=True, only={"chat.postMessage"})
    assert deliver_due(store, channel(state, store), clock) == 0  # accepted, answer lost: tries = 1
    (state / "slack_journal.jsonl").unlink()
    clock.t += 10
    assert deliver_due(store, channel(state, store), clock) == 1
    assert outbox_ids(slack_env) == [1]


def test_unknown_channel_and_bad_token_fail_for_good_without_the_token_in_the_error(
        slack_env: FakeSlack, state: Path, store: Store) -> None:
    clock = Clock(1_000_000.0)
    launch(store, "a", clock.t, channel_name="C-MISSING")
    assert deliver_due(store, channel(state, store), clock) == 0
    assert store.message(1).status == "failed" and "channel_not_found" in store.message(1).error

    launch(store, "b", clock.t)
    bad = SlackChannel(web_client("xoxb-wrong-secret-token"), state, store=store)
    deliver_due(store, bad, clock)
    failed = store.message(2)
    assert failed.status == "failed" and "invalid_auth" in failed.error
    assert "xoxb" not in failed.error and TOKEN not in failed.error


def test_network_timeout_is_transient(slack_env: FakeSlack, state: Path, store: Store) -> None:
    clock = Clock(1_000_000.0)
    launch(store, "r", clock.t, channel_name="C0RUNS")
    slack_env.slow(1, 2.0)
    ch = SlackChannel(web_client(timeout=1), state, store=store)
    assert deliver_due(store, ch, clock) == 0
    assert store.message(1).status == "pending" and "network error" in store.message(1).error
    clock.t += 5
    drain(store, ch, clock)
    assert outbox_ids(slack_env) == [1]  # the slow post landed; the retry found it instead of reposting


def test_a_poll_round_reaches_slack_through_the_delivery_thread_each_post_once_under_its_launch(
        slack_env: FakeSlack, state: Path, store: Store) -> None:
    """A round's polls are recorded together (their posts name the poll; the snapshot is read back for
    rendering) and the delivery thread, settling after the burst, posts each run's poll in its thread and
    edits its header to the poll's step: in order per run, nothing twice."""
    runs = [f"r{i}" for i in range(20)]
    roots = {run: launch(store, run, 1_000_000.0) for run in runs}
    worker = DeliveryWorker(store, channel(state, store))
    store.on_enqueue = worker.wake
    worker.start()
    try:
        slack_env.wait_calls("chat.postMessage", n=len(runs), timeout=60)
        store.record_polls([PollRow(run, 1, 1_000_100.0, "first", Snapshot.from_dict({"run": run, "kind": "first", "step": 40 + i}),
                                    thread_of=roots[run], payload={"run": run}) for i, run in enumerate(runs)])
        slack_env.wait_calls("chat.update", n=len(runs), timeout=60)
        deadline = time.monotonic() + 60
        while store.pending_count() and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        worker.close()
    posts = slack_env.posts()
    assert sorted(outbox_ids(slack_env)) == outbox_ids(slack_env) and len(posts) == 2 * len(runs)
    top = {p["metadata"]["event_payload"]["run"]: p["ts"] for p in posts if p["thread_ts"] is None}
    for i, run in enumerate(runs):
        (reply,) = [p for p in posts if p["thread_ts"] == top[run]]
        assert f"step {40 + i}" in reply["text"]
    updates = {c.body["ts"]: c.body["text"] for c in slack_env.calls_to("chat.update")}
    assert all(f"step {40 + i}" in updates[top[run]] for i, run in enumerate(runs))
    assert store.pending_count() == 0
