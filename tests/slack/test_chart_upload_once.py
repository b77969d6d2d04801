"""The FINAL verdict's chart is shared exactly once into the channel and once into the launch thread, even
when the delivering process is SIGKILLed right after any of files_upload_v2's three steps took effect
(the upload URL issued, the bytes accepted, the share completed) and then restarted."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from babysit.db.store import Store
from babysit.slack.upload import shared_in
from tests.slack.conftest import PNG
from tests.slack.fake_slack import FakeSlack
from tests.slack.test_slack_channel import VERDICT, launch

ROOT = Path(__file__).resolve().parents[2]


def deliver(state: Path, crash_at: str | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ}
    env.pop("BABYSIT_CRASH_AT", None)
    if crash_at:
        env["BABYSIT_CRASH_AT"] = crash_at
    return subprocess.run([sys.executable, "-m", "tests.slack.deliver_worker", str(state)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("crash_at", ["chart-after-url", "chart-after-bytes", "chart-after-complete",
                                      "chart-after-complete:2"])
def test_a_sigkill_after_any_upload_step_then_a_restart_shares_the_chart_exactly_once(
        crash_at: str, slack_env: FakeSlack, state: Path, store: Store, tmp_path: Path) -> None:
    chart = tmp_path / "r1.png"
    chart.write_bytes(PNG)
    now = time.time()
    launch(store, "r1", now, channel_name="C0RUNS")
    store.enqueue("r1", "verdict", {"run": "r1", "verdict": VERDICT, "chart_path": str(chart), "channel": "C0RUNS"},
                  now)

    killed = deliver(state, crash_at)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    restarted = deliver(state)
    assert restarted.returncode == 0, restarted.stderr

    launch_post, verdict_post = slack_env.posts()  # each posted once
    assert "AMBIGUOUS" in verdict_post["text"]
    where = sorted((s["channel"], s["thread_ts"] or "") for s in slack_env.shares)
    assert where == sorted([("C0RUNS", ""), ("C0RUNS", launch_post["ts"])]), slack_env.shares
    shared_files = {s["file"] for s in slack_env.shares}
    assert all(slack_env.uploads[f] == PNG for f in shared_files)  # what was shared is the chart's bytes
    assert all(m.status == "sent" for m in store.messages())


def test_shared_in_tells_a_channel_post_from_a_thread_reply() -> None:
    file = {"shares": {"public": {"C1": [{"ts": "10.1", "thread_ts": None}]},
                       "private": {"G1": [{"ts": "11.1", "thread_ts": "5.0"}]}}}
    assert shared_in(file, "C1", None) and not shared_in(file, "C1", "5.0")
    assert shared_in(file, "G1", "5.0") and not shared_in(file, "G1", None)
    assert not shared_in({}, "C1", None) and not shared_in(file, "C2", None)
