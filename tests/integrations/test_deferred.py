"""`DeferredWriter`: a hook's records queued on the training thread and written by a thread of their own —
the same lines in the same order, on disk within a moment, all of them at a flush, at the end and at an
interpreter exit, never twice from a forked child."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from babysit.integrations import DeferredWriter
from babysit.integrations.client import JsonlWriter

REPO = Path(__file__).resolve().parents[2]


def steps(path: Path) -> list[int]:
    return [json.loads(line)["step"] for line in path.read_text().splitlines()] if path.exists() else []


def test_queued_records_reach_the_file_on_their_own_as_the_writer_would_write_them(tmp_path: Path) -> None:
    log, direct = tmp_path / "deferred.jsonl", tmp_path / "direct.jsonl"
    deferred = DeferredWriter(JsonlWriter(log), delay=0.05)
    records = [{"loss": 1 / (i + 3), "lr": 3e-4, "epoch": i / 7, "note": "x" if i % 3 == 0 else 1} for i in range(200)]
    stamps = []
    for i, record in enumerate(records):
        deferred.put(i, record)
        stamps.append(time.time())
    deadline = time.time() + 30
    while len(steps(log)) < len(records) and time.time() < deadline:  # no flush called: its thread writes them
        time.sleep(0.05)
    assert steps(log) == list(range(200))
    got = [json.loads(line) for line in log.read_text().splitlines()]
    writer = JsonlWriter(direct)
    for i, (record, line) in enumerate(zip(records, got, strict=True)):
        assert line["ts"] <= stamps[i]  # the time it was queued, not the time it was written
        writer.append(writer.encode(i, record, line["ts"]))
    assert direct.read_bytes() == log.read_bytes()  # the same bytes JsonlWriter writes
    deferred.close()


_EXIT = """
import os, sys
from babysit.integrations.client import JsonlWriter
from babysit.integrations import DeferredWriter
w = DeferredWriter(JsonlWriter(sys.argv[1]), delay=3600)  # its thread would wait an hour
w.put(1, {"loss": 1.0})
w.put(2, {"loss": 0.5})
if os.fork() == 0:
    sys.exit(0)  # a forked child's interpreter exit: its copy of the queue is the parent's to write
os.wait()
w.put(3, {"loss": 0.25})
sys.exit(0)  # no close(): the interpreter's exit writes what is queued
"""


def test_an_interpreter_exit_writes_what_is_queued_and_a_forked_child_writes_nothing(tmp_path: Path) -> None:
    log = tmp_path / "log.jsonl"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-c", _EXIT, str(log)], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert steps(log) == [1, 2, 3]


def test_flush_writes_now_and_a_bad_record_is_dropped_not_raised(tmp_path: Path, capfd) -> None:
    log = tmp_path / "log.jsonl"
    deferred = DeferredWriter(JsonlWriter(log), delay=3600)
    deferred.put(1, {"loss": 1.0})
    deferred.put("ten", {"loss": 1.0})  # not a step: said once, dropped
    deferred.put(3, {"loss": float("nan")})
    deferred.flush()
    assert steps(log) == [1, 3]
    assert "step must be an integer" in capfd.readouterr().err
    deferred.close()


def test_an_idle_writer_thread_sleeps_until_a_record_rings_it(tmp_path: Path) -> None:
    """No record, no wake-up (each costs the process ~50 µs of CPU on a busy box): the thread blocks until the
    first record of a batch, writes the batch `delay` later, and blocks again."""
    log = tmp_path / "log.jsonl"
    deferred = DeferredWriter(JsonlWriter(log), delay=0.05)
    flushes = []
    flush = deferred.flush

    def counted() -> None:
        flushes.append(time.monotonic())
        flush()

    deferred.flush = counted  # type: ignore[method-assign]  # what its thread calls
    deferred.put(1, {"loss": 1.0})
    deadline = time.time() + 30
    while steps(log) != [1] and time.time() < deadline:
        time.sleep(0.02)
    assert steps(log) == [1]
    time.sleep(0.15)  # the thread's one more look (a sleep that brought nothing), then it blocks
    idle_from = len(flushes)
    time.sleep(0.6)  # twelve delays: a thread polling every delay would have flushed ~12 times
    assert len(flushes) == idle_from
    deferred.put(2, {"loss": 0.5})  # a record rings it again
    while steps(log) != [1, 2] and time.time() < deadline:
        time.sleep(0.02)
    assert steps(log) == [1, 2]
    deferred.close()


def test_records_put_after_close_start_the_thread_again(tmp_path: Path) -> None:
    """HF calls on_train_end (close) and then maybe evaluate(), which logs: those records are written too."""
    log = tmp_path / "log.jsonl"
    deferred = DeferredWriter(JsonlWriter(log), delay=0.05)
    deferred.put(1, {"loss": 1.0})
    deferred.close()
    assert steps(log) == [1]  # close wrote it, without waiting for the thread
    deferred.put(2, {"eval_loss": 0.5})
    deadline = time.time() + 30
    while steps(log) != [1, 2] and time.time() < deadline:
        time.sleep(0.02)
    assert steps(log) == [1, 2]
    deferred.close()
