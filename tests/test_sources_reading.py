"""A run's reading of a flood, as the daemon does it (babysit/run/run_log.py over babysit/run/log_chunks.py): a read
of many chunks saves the offsets once, after the record log is durable, so what is saved never runs ahead
of what the record log holds; and a read that hands the rest to the reader thread leaves it free to read."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from babysit.run.log_chunks import CHUNK_BYTES
from tests.supervised import supervised_run
from tests.support import run_toml, stdout_source

RUN_TOML = run_toml("r", ["python", "train.py"], guards={"min_free_host_ram_gib": 1},
                    source=stdout_source(r"iter (?P<step>\d+): loss (?P<train_loss>[-+.\w]+)"))

FLOOD = "".join(f" {i % 100:3d}%|###   | {i}/200000 [00:01<00:02, 100000.00it/s]\n"
                + (f"iter {i}: loss {4 - i / 1e5:.4f}\n" if i % 100 == 0 else "") for i in range(1, 40_001))


@contextmanager
def supervised(tmp_path: Path) -> Iterator[object]:
    with supervised_run(tmp_path, RUN_TOML, FLOOD) as (sup, _):
        yield sup


def saved_source(tmp_path: Path) -> dict:
    import sqlite3

    con = sqlite3.connect(tmp_path / ".babysit" / "state.db")
    try:
        (source,) = con.execute("SELECT source FROM run_reading WHERE run = 'r'").fetchone()
    finally:
        con.close()
    return json.loads(source)


def test_a_read_of_many_chunks_saves_once_after_one_fsync_of_the_record_log(tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: a store commit and an fsync per chunk (~30 a second under a flood). Now one of each per read,
    the fsync first: the saved record-log length is never more than the record log held when it was synced."""
    from babysit.db.store import Store

    records_log = tmp_path / ".babysit" / "runs" / "r" / "records.jsonl"
    synced: list[int] = []  # the record log's size at each fsync of it
    saves: list[tuple[int, int | None]] = []  # (records_bytes saved, the record log's size at the last fsync)
    real_fsync, real_write = os.fsync, Store._write_readings

    def fsync(fd: int) -> None:
        if os.path.realpath(f"/proc/self/fd/{fd}") == str(records_log.resolve()):
            synced.append(os.fstat(fd).st_size)
        real_fsync(fd)

    def write(self: Store, readings: list) -> None:
        for _, _, source, _, _ in readings:
            saves.append((source["records_bytes"], synced[-1] if synced else None))
        real_write(self, readings)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(Store, "_write_readings", write)
    with supervised(tmp_path) as sup:
        assert len(FLOOD) > 8 * CHUNK_BYTES
        sup.runlog.read_log(drain=True)
        assert saved_source(tmp_path)["lines"] == 40_400  # every line read, in one call
    assert len(saves) == 1 and len(synced) == 1, (saves, synced)
    saved, durable = saves[0]
    assert durable is not None and saved == durable == records_log.stat().st_size
    assert records_log.read_text().count('"train_loss"') == 400


def test_a_guard_read_hands_the_rest_to_the_reader_thread_and_it_reads_on(tmp_path: Path) -> None:
    """A guard reads a budget's worth and wishes the rest on the reader thread: the thread, woken at once,
    must find the reading free (it gave up on a lock the guard still held for its fsync, and the flood
    waited for the next tick)."""
    with supervised(tmp_path) as sup:
        sup.ctx.reads.start()
        sup.runlog.read_log(budget=0.0, wait=False)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and sup.runlog.reader.pump.state["lines"] < 40_400:
            time.sleep(0.02)  # (never taking the reader's lock: a reader thread that finds it taken waits for a wish)
        assert sup.runlog.reader.pump.state["lines"] == 40_400
