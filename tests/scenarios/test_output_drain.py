"""Nothing a trainer prints is lost when it exits: its output is read to the end before the exit is
classified and the verdict read, however large the burst, and so after a daemon restart (issue 31).

Before the fix the exit read a bounded number of windows (1 + 8 pumps of 4 MiB) and finalized: a
2,000,000-line burst lost ~1,000,000 lines and the final `val loss` line the verdict reads. The fast
tests print long lines (the budgets were in bytes), so a short test exceeds them several times over.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

import pytest

from babysit.db.store import Store
from tests.scenarios.conftest import Daemon, store_of
from tests.support import register, run_toml, stdout_source, wait_for

BASELINE, FINAL = 4.0, 2.3456
TRAINER = r"""
import os, sys, time
n, pad, go = int(sys.argv[1]), "x" * int(sys.argv[2]), sys.argv[3]
while go != "-" and not os.path.exists(go):  # a restart test holds the burst until the daemon is down
    time.sleep(0.02)
w = sys.stdout.write
w("step 0: train loss 4.0000, val loss %.4f\n" % BASELINE)
for i in range(1, n + 1):
    w(f"iter {i}: loss {3 + (i % 1000) / 1000:.4f}, time 1.00ms{pad}\n")
w(f"step {n}: train loss 2.5000, val loss {FINAL:.4f}\n")  # the last line, just before the exit
""".replace("BASELINE", repr(BASELINE)).replace("FINAL", repr(FINAL))


def register_printer(root: Path, name: str, lines: int, pad: int, go: str = "-", trainer: str = TRAINER) -> None:
    register(root, run_toml(
        name, [sys.executable, "-c", trainer, str(lines), str(pad), go], run={"total_steps": lines},
        guards={"min_free_host_ram_gib": 0.1, "stop_grace_seconds": 10},
        source=stdout_source(r"iter (?P<step>\d+): loss (?P<train_loss>[-+.\w]+), time (?P<ms>[\d.]+)ms",
                             r"step (?P<step>\d+): train loss [-+.\w]+, val loss (?P<val_loss>[-+.\w]+)"),
        prereg={"question": "Does val loss fall over the run?", "metric": "val_loss", "baseline_step": 0,
                "read_step": lines, "bands": [{"label": "IMPROVES", "max": 0.0}],
                "otherwise": {"label": "FLAT-OR-WORSE"}}))


def assert_read_to_the_end(root: Path, name: str, lines: int) -> None:
    store = store_of(root)
    try:
        (attempt,) = store.attempts(name)
        assert attempt.outcome == "completed", attempt.detail
        final = store.final_verdict(name)
        assert final is not None, store.run_state(name)
        body = final.body
        assert body["status"] == "FINAL" and body["label"] == "IMPROVES", body
        assert abs(body["delta"] - (FINAL - BASELINE)) < 1e-9, body  # the last line's value, read
        source = store.run_state(name)[1]["source"]
        assert source["lines"] == source["records"] == lines + 2, source  # every line counted, each one record
    finally:
        store.close()
    with open(root / ".babysit" / "runs" / name / "records.jsonl", "rb") as f:
        assert sum(1 for _ in f) == lines + 2


def test_a_burst_far_over_the_old_read_budgets_is_read_to_its_last_line_before_the_verdict(
        workspace: Path) -> None:
    lines = 20_000  # x 2,000 bytes: 40 MiB of stdout in a fraction of a second, then the exit (over 36 MiB)
    register_printer(workspace, "burst", lines, pad=1960)
    daemon = Daemon(workspace, "--exit-when-idle", "--no-view", "--gpu-probe", "none")
    assert daemon.wait(timeout=300) == 0, daemon.output()
    assert_read_to_the_end(workspace, "burst", lines)


def test_a_backlog_written_while_no_daemon_was_up_is_read_whole_by_the_next_one(workspace: Path) -> None:
    lines = 20_000  # x 2,000 bytes: 40 MiB, over the old adoption read's 36 MiB whatever the timing
    go = workspace / "go"
    register_printer(workspace, "backlog", lines, pad=1960, go=str(go))
    first = Daemon(workspace, "--no-view", "--gpu-probe", "none")
    store = Store.in_dir(workspace / ".babysit")
    try:
        attempt = wait_for("the launch", lambda: next((a for a in store.attempts("backlog") if a.pid), None), 60)
    finally:
        store.close()
    first.proc.send_signal(signal.SIGTERM)  # the daemon goes, the run stays
    assert first.wait(timeout=60) == 0, first.output()
    go.touch()  # now the burst and the exit, with no daemon up
    wait_for("the trainer's exit", lambda: not _alive(attempt.pid), 60)
    second = Daemon(workspace, "--exit-when-idle", "--no-view", "--gpu-probe", "none")
    assert second.wait(timeout=300) == 0, second.output()
    assert_read_to_the_end(workspace, "backlog", lines)


UNTERMINATED = r"""
import sys
n = int(sys.argv[1])
print("step 0: train loss 4.0000, val loss %.4f" % BASELINE)
for i in range(1, n + 1):
    print(f"iter {i}: loss {3 + (i % 1000) / 1000:.4f}, time 1.00ms")
print("a warning with no newline", end="", file=sys.stderr)
print(f"step {n}: train loss 2.5000, val loss %.4f" % FINAL, end="")  # the eval, no newline, and the exit
""".replace("BASELINE", repr(BASELINE)).replace("FINAL", repr(FINAL))


def test_a_last_printed_line_without_its_newline_is_read_at_the_exit(workspace: Path) -> None:
    """`print(..., end="")` then exit: the unterminated last line is a line once the trainer is gone
    (never while it lives: it may be writing that line still). Before, it was never read: the verdict
    missed the final eval it prints."""
    register_printer(workspace, "noeol", 200, pad=0, trainer=UNTERMINATED)
    daemon = Daemon(workspace, "--exit-when-idle", "--no-view", "--gpu-probe", "none")
    assert daemon.wait(timeout=120) == 0, daemon.output()
    store = store_of(workspace)
    try:
        final = store.final_verdict("noeol")
        assert final is not None and final.body["status"] == "FINAL", store.run_state("noeol")
        assert abs(final.body["delta"] - (FINAL - BASELINE)) < 1e-9, final.body  # the unterminated line's value
        source = store.run_state("noeol")[1]["source"]
        assert source["records"] == 202 and source["lines"] == 203, source  # stderr's unterminated line counted
    finally:
        store.close()
    last = (workspace / ".babysit" / "runs" / "noeol" / "records.jsonl").read_text().splitlines()[-1]
    assert json.loads(last)["val_loss"] == FINAL and json.loads(last)["step"] == 200


@pytest.mark.slow
def test_two_million_printed_lines_then_the_final_eval_are_all_read(workspace: Path) -> None:
    """The issue's measurement: nanoGPT-length lines, 2,000,000 of them in a few seconds."""
    lines = 2_000_000
    register_printer(workspace, "two_million", lines, pad=0)
    daemon = Daemon(workspace, "--exit-when-idle", "--no-view", "--gpu-probe", "none")
    assert daemon.wait(timeout=600) == 0, daemon.output()
    assert_read_to_the_end(workspace, "two_million", lines)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie (the shim's child reaped late) is gone for our purpose
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"
    except OSError:
        return False


VANISHES = r"""
import os, sys, time
for i in range(1, 6):
    print(f"iter {i}: loss 3.5, time 1.00ms", flush=True)
time.sleep(2)  # read meanwhile
os.unlink(os.readlink("/proc/self/fd/1"))  # its captured stdout removed under it (a cleanup script)
print("iter 6: loss 3.0, time 1.00ms", flush=True)
"""


def test_a_source_that_vanished_before_it_was_read_to_its_end_is_named_in_the_ended_message(
        workspace: Path) -> None:
    register(workspace, run_toml("gone", [sys.executable, "-c", VANISHES], guards={"min_free_host_ram_gib": 0.1},
                                 source=stdout_source(r"iter (?P<step>\d+): loss (?P<train_loss>[-+.\w]+)")))
    daemon = Daemon(workspace, "--exit-when-idle", "--no-view", "--gpu-probe", "none")
    assert daemon.wait(timeout=120) == 0, daemon.output()
    stdout_log = workspace / ".babysit" / "runs" / "gone" / "attempt-1" / "stdout.log"
    ended = [m for m in map(json.loads, (workspace / ".babysit" / "channel.jsonl").read_text().splitlines())
             if m.get("kind") == "ended"]
    assert len(ended) == 1 and f"not read to its end: {stdout_log} vanished" in ended[0]["text"], ended
    store = store_of(workspace)
    try:
        (attempt,) = store.attempts("gone")
        assert attempt.detail["undrained"] == [str(stdout_log)]
    finally:
        store.close()
