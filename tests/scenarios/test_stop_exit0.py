"""A trainer that exits 0 on babysit's SIGTERM (it saves and leaves, as many do) was stopped, not completed:
an abort of it ends `stopped` (its exit code shown) in the run's outcome, `babysit status`, the web page and
the channel's post (before: `completed` ✅ everywhere, the run shown as done at step 12 of 100000). A real
daemon, a real trainer process, `babysit abort` from the CLI."""

from __future__ import annotations

import json
import time
from pathlib import Path

from babysit.view import runview
from babysit.web.pages import runs_page
from tests.scenarios.conftest import PY, Daemon, babysit, store_of
from tests.support import TRAIN_LOG, register, run_toml, wait_for

TRAINER = """
import json, os, signal, sys, time
os.makedirs(os.path.dirname(sys.argv[1]), exist_ok=True)
stop = []
signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
with open(sys.argv[1], "a") as log:
    for step in range(1, 100001):
        log.write(json.dumps({"step": step, "ts": time.time(), "train_loss": 1.0 / step, "total_steps": 100000}) + "\\n")
        log.flush()
        if stop:
            sys.exit(0)  # saved, and left: exit 0 on the stop signal
        time.sleep(0.2)
"""


def test_a_trainer_that_exits_0_on_an_abort_is_shown_stopped_everywhere(workspace: Path) -> None:
    (workspace / "train.py").write_text(TRAINER)
    register(workspace, run_toml("polite", [PY, "train.py", "outputs/polite/train_log.jsonl"], log=TRAIN_LOG, gpus=[],
                                 guards={"min_free_host_ram_gib": 0.1, "stop_grace_seconds": 20, "stall_minutes": 30}))
    registry = str(workspace / "babysit.toml")
    daemon = Daemon(workspace, "--exit-when-idle")
    store = store_of(workspace)
    log = workspace / "outputs" / "polite" / "train_log.jsonl"
    wait_for("polite's third record", lambda: log.exists() and len(log.read_text().splitlines()) >= 3, 120)
    asked = babysit("abort", "polite", "--registry", registry, cwd=workspace)
    assert "stopping" in asked.stdout, asked.stdout + asked.stderr
    assert daemon.wait(timeout=120) == 0, daemon.output()

    (attempt,) = store.attempts("polite")
    assert attempt.exit_code == 0 and attempt.outcome == "stopped", attempt  # before: completed
    assert attempt.detail["summary"] == "stopped on request (abort), exit 0", attempt.detail["summary"]
    assert store.run_state("polite")[0] == "stopped"

    shown = babysit("status", "--registry", registry, cwd=workspace).stdout
    (line,) = [x for x in shown.splitlines() if x.startswith("polite ")]
    assert " stopped " in line and "completed" not in line, shown

    (row,) = runview.collect(workspace / "babysit.toml")
    page = runs_page([row], time.time(), "")
    assert row.status == "stopped" and "completed" not in page, page

    posts = [json.loads(x) for x in (workspace / ".babysit" / "channel.jsonl").read_text().splitlines()]
    (ended,) = [p["text"] for p in posts if p["kind"] == "ended"]
    assert ended == "⏹ polite attempt 1 ended: stopped — stopped on request (abort), exit 0", ended
    assert not any("✅" in p["text"] or "completed" in p["text"] for p in posts), posts
