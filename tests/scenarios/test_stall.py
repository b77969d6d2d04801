"""A stalled run: babysit stops it with a py-spy stack dump, and where py-spy cannot dump a process the
stalled incident's channel message says why, beside the log path babysit saw no record in."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

from babysit.core.render import render
from babysit.run.stackdump import stack_dump
from tests.scenarios.conftest import PY, Daemon, store_of
from tests.support import TRAIN_LOG, register, run_toml


def test_a_stall_is_stopped_and_its_channel_message_names_the_log_and_the_stack_dump(workspace: Path) -> None:
    register(workspace, run_toml("hang", [PY, "-c", "import time; time.sleep(300)"], log=TRAIN_LOG,
                                 guards={"stall_minutes": 1, "stop_grace_seconds": 10, "min_free_host_ram_gib": 0}))
    daemon = Daemon(workspace, "--exit-when-idle", "--gpu-probe", "none")
    assert daemon.wait(timeout=90) == 0, daemon.output()
    (attempt,) = store_of(workspace).attempts("hang")
    assert attempt.outcome == "stalled"
    messages = [json.loads(x) for x in (workspace / ".babysit" / "channel.jsonl").read_text().splitlines()]
    (stalled,) = [m["text"] for m in messages if m["kind"] == "incident" and ": stalled — no new log record" in m["text"]]
    assert f"log babysit reads (no new record there): {workspace / 'outputs' / 'hang' / 'train_log.jsonl'}" \
        in stalled
    # py-spy ships with babysit: either the trainer's stack is in the message, or why it is not
    assert "py-spy dump of pid" in stalled or "⚠️ no stack dump" in stalled, stalled
    # the guard said the cause: the end is said once, on its own (no second `stalled` incident for the exit)
    assert [m["kind"] for m in messages if m["kind"] in ("ended", "incident") and "stalled" in m["text"]] == \
        ["incident", "ended"], [m["text"] for m in messages]


def test_the_dump_says_why_where_py_spy_cannot_read_a_process() -> None:
    sleeper = subprocess.Popen(["sleep", "30"])  # not a Python process: py-spy cannot dump it
    try:
        time.sleep(0.2)
        started = time.monotonic()
        stacks = stack_dump(frozenset({sleeper.pid}), timeout_s=10)
        assert time.monotonic() - started < 10
    finally:
        sleeper.kill()
        sleeper.wait()
    assert set(stacks) == {"note"}
    assert stacks["note"].startswith(f"no stack dump — pid {sleeper.pid}: ")
    text = render("incident", {"run": "r", "attempt": 1, "incident": "stalled", "message": "no new log record",
                               "detail": {"stacks": stacks, "log": "/x/train_log.jsonl"}}).text
    assert "log babysit reads (no new record there): /x/train_log.jsonl" in text
    assert f"⚠️ {stacks['note']}" in text


def test_a_dump_that_was_taken_is_shown_in_the_channel_message_trainer_first() -> None:
    shim = ("Process 10: python /x/babysit/executors/shim.py /a -- python -m trainer\nThread 10 (idle)\n"
            "    wait (shim.py:5)")
    trainer = "Process 11: python -m trainer\nThread 11 (active)\n    step (train.py:90)\n    main (train.py:200)"
    payload = {"run": "r", "attempt": 1, "incident": "stalled", "message": "no new log record",
               "detail": {"stacks": {"10": shim, "11": trainer}}}
    rendered = render("incident", payload)
    assert "py-spy dump of pid 11 (2 process(es) dumped):\n  Process 11: python -m trainer" in rendered.text
    assert "    step (train.py:90)" in rendered.text and "no stack dump" not in rendered.text
    assert any("step (train.py:90)" in json.dumps(b) for b in rendered.blocks), "Slack shows it too"
