"""Slack `/babysit abort` → SIGTERM at the trainer: how long from the confirming click to the signal.

  python bench/abort_latency.py                 # 4 trials with the wake, 1 without (~1 min)

Everything is real but Slack: `babysit up` at its real-time cadence (guard round every 30 s), the bot
(`babysit bot --http`) answering a really signed `block_actions` POST (the "Abort it" button of
`/babysit abort RUN`) through a local fake of Slack's Web API (tests/slack/fake_slack.py), and
trainers that stamp the wall time at which SIGTERM reaches them. Latency = stamp − the moment the POST
was sent. Target ≤ 1 s.

Side by side, the same abort without the wake (the request written to the store, no signal to the
daemon): what a daemon that polls for control requests gets — here its guard round's backstop, at
most one guard interval (the daemon before babysit.runtime.wake polled every tick). `--before DIR` runs the
same trials against the code exported in DIR (bench/export_before.sh): its daemon and its bot.
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parents[1]))
from _common import Daemon, emit, kill_runs, wait_for, write_registry, write_run

SECRET = "bench-signing-secret"
TOKEN = "xoxb-bench"
ALLOWED = "UBENCH0001"
TRAINER = """
import json, os, signal, sys, time
stamp, log = sys.argv[1], os.environ["BABYSIT_LOG"]
def stop(*_):
    with open(stamp, "w") as f:
        f.write(repr(time.time()))
    os._exit(10)
signal.signal(signal.SIGTERM, stop)
with open(log, "a", buffering=1) as f:
    step = 0
    while True:
        step += 1
        f.write(json.dumps({"step": step, "ts": time.time(), "train_loss": 1.0}) + "\\n")
        time.sleep(0.5)
"""


def _sql(db: Path, sql: str, args: tuple = ()) -> list[tuple]:
    """One statement on the daemon's database, without babysit's Store (which would migrate it)."""
    con = sqlite3.connect(db, timeout=30)
    try:
        with con:
            return con.execute(sql, args).fetchall()
    finally:
        con.close()


def click(url: str, fake_base: str, run: str) -> None:
    """The "Abort it" button of `/babysit abort RUN`, clicked by an allow-listed user, signed as Slack signs."""
    payload = {"type": "block_actions", "team": {"id": "T0001"}, "user": {"id": ALLOWED},
               "channel": {"id": "C0BENCH"}, "response_url": fake_base + f"/response/{run}", "trigger_id": "t",
               "container": {"type": "message"}, "api_app_id": "A1", "token": "legacy",
               "actions": [{"type": "button", "action_id": "babysit_abort_confirmed", "block_id": "babysit_abort",
                            "value": run, "action_ts": str(time.time())}]}
    body = urlencode({"payload": json.dumps(payload)})
    ts = int(time.time())
    sig = "v0=" + hmac.new(SECRET.encode(), f"v0:{ts}:{body}".encode(), hashlib.sha256).hexdigest()
    req = urllib.request.Request(url, data=body.encode(), method="POST", headers={
        "Content-Type": "application/x-www-form-urlencoded", "X-Slack-Request-Timestamp": str(ts),
        "X-Slack-Signature": sig})
    with urllib.request.urlopen(req, timeout=30) as resp:
        assert resp.status == 200, resp.status


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--trials", type=int, default=4, help="aborts through Slack (default 4)")
    p.add_argument("--no-wake-trials", type=int, default=1, help="aborts without the wake (default 1)")
    p.add_argument("--before", metavar="DIR", help="also measure the code exported in DIR")
    p.add_argument("--json", metavar="PATH")
    args = p.parse_args(argv)
    results = {"now": trials(args, {})}
    if args.before:
        results["before"] = trials(args, {"PYTHONPATH": os.pathsep.join(
            x for x in (args.before, os.environ.get("PYTHONPATH")) if x)})
    rows: list[list[Any]] = []
    for code, got in results.items():
        for kind, times in got.items():
            if times:
                rows.append([code, f"/babysit abort → SIGTERM ({kind})", ", ".join(f"{t:.3f}" for t in times),
                             f"{max(times):.3f} s", "≤ 1 s" if kind == "wake" else "—"])
    worst = max(results["now"]["wake"]) if results["now"]["wake"] else None
    notes = [f"target ≤ 1 s: {'met' if worst is not None and worst <= 1 else 'MISSED'} (worst {worst:.3f} s)"
             if worst is not None else "no trial with the wake",
             "daemon at its real-time cadence (guard round every 30 s); the bot over HTTP with a signed click"]
    emit("abort latency", ["code", "path", "trials (s)", "worst", "target"], rows, {"results": results}, args.json,
         notes)
    return 0


def trials(args: argparse.Namespace, code_env: dict[str, str]) -> dict[str, list[float]]:
    """The aborts against one daemon and bot (the code on code_env's PYTHONPATH): seconds to SIGTERM."""
    from tests.slack.fake_slack import FakeSlack

    root = Path(tempfile.mkdtemp(prefix="babysit-abort-"))
    (root / "trainer.py").write_text(TRAINER)
    names = [f"a{i}" for i in range(args.trials + args.no_wake_trials)]
    for name in names:
        write_run(root, name, [sys.executable, str(root / "trainer.py"), str(root / f"{name}.stamp")])
    registry = write_registry(root, names)
    registry.write_text(registry.read_text().replace(
        "[daemon]\n", f'[daemon]\nchannel = "C0BENCH"\nabort_allow_list = ["{ALLOWED}"]\n', 1))
    fake = FakeSlack(TOKEN).start()
    daemon = Daemon(root, env={"BABYSIT_GPU_PROBE": "none", **code_env})
    bot = subprocess.Popen([sys.executable, "-m", "babysit", "bot", "--http", "0", "--host", "127.0.0.1",
                            "--registry", str(registry)], cwd=root, text=True, stdout=subprocess.PIPE,
                           stderr=open(root / "bot.stderr", "w"),  # noqa: SIM115 - the child owns it
                           env={**os.environ, "SLACK_BOT_TOKEN": TOKEN, "SLACK_SIGNING_SECRET": SECRET,
                                "BABYSIT_SLACK_API_URL": fake.api_url, **code_env})
    results: dict[str, list[float]] = {"wake": [], "no wake": []}
    try:
        line = bot.stdout.readline() if bot.stdout else ""
        if "serving" not in line:
            raise RuntimeError(f"the bot did not start: {line!r}; see {root / 'bot.stderr'}")
        url = line.split("serving ", 1)[1].strip()
        db = root / ".babysit" / "state.db"
        wait_for(lambda: db.exists() and _sql(db, "SELECT COUNT(*) FROM attempts WHERE status='running'")[0][0]
                 == len(names), 120, "every run running")
        time.sleep(3)
        for i, name in enumerate(names):
            stamp = root / f"{name}.stamp"
            waked = i < args.trials
            t0 = time.time()
            if waked:
                click(url, fake.base, name)
            else:
                # written as the CLI writes it, the daemon not told (raw SQL: the store of any version)
                _sql(db, "INSERT INTO control (run, action, requested_by, requested_at) VALUES (?, ?, ?, ?)",
                     (name, "abort", "bench:no-wake", t0))
            got = float(wait_for(lambda s=stamp: s.exists() and s.read_text(), 120, f"SIGTERM at {name}"))
            results["wake" if waked else "no wake"].append(got - t0)
    finally:
        bot.terminate()
        bot.wait(timeout=20)
        daemon.stop()
        kill_runs(root)
        fake.stop()
    shutil.rmtree(root, ignore_errors=True)
    return results


if __name__ == "__main__":
    sys.exit(main())
