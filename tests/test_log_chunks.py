"""A run's reading in bounded chunks (babysit/run/log_chunks.py): a backlog is read a chunk at a time, every
line counted once; the records the pump made are handed over as logtail would read them back (the
same steps, times, metrics and non-finite fields, the same tail), and read from the file instead when
someone else wrote to the record log too."""

from __future__ import annotations

import math
from pathlib import Path

from babysit.core.spec.run_toml import load_spec
from babysit.run.log_chunks import CHUNK_BYTES, RunReader
from babysit.sources import logtail
from tests.support import run_toml, stdout_source

RUN = run_toml("r1", ["python", "train.py"],
               source=stdout_source(r"iter (?P<step>\d+): loss (?P<loss>[-+.\w]+), time (?P<ms>[\d.]+)ms"))


def setup(tmp_path: Path, lines: list[str]) -> tuple[RunReader, Path]:
    (tmp_path / "run.toml").write_text(RUN)
    spec = load_spec(tmp_path / "run.toml")
    sd = tmp_path / "sd"
    attempt = sd / "runs" / "r1" / "attempt-1"
    attempt.mkdir(parents=True)
    (attempt / "stdout.log").write_text("".join(line + "\n" for line in lines))
    (attempt / "stderr.log").write_text("")
    return RunReader(spec, sd, {}), attempt / "stdout.log"


def drain(reader: RunReader) -> list:
    chunks = []
    while True:
        chunk = reader.next_chunk(1000.0 + len(chunks))
        reader.applied()
        chunks.append(chunk)
        if not chunk.more:
            return chunks


def comparable(records) -> list[tuple]:
    return [(r.step, r.ts, dict(r.metrics), {k: repr(v) for k, v in r.fields.items()}, r.offset) for r in records]


def test_a_backlog_is_read_in_bounded_chunks_every_line_once(tmp_path: Path) -> None:
    pad = "x" * 200
    n = 40_000  # ~9 MiB of stdout
    reader, _ = setup(tmp_path, [f"iter {i}: loss {1 + i / n:.6f}, time 1.00ms {pad}" for i in range(n)])
    chunks = drain(reader)
    assert len(chunks) >= 9  # a chunk at a time, never the whole backlog
    assert all(len(c.read.records) * 230 <= 1.1 * CHUNK_BYTES for c in chunks)
    steps = [r.step for c in chunks for r in c.read.records]
    assert steps == list(range(n))
    assert reader.pump.state["lines"] == reader.pump.state["records"] == n
    assert reader.unread_bytes() == 0


def test_the_pumps_records_are_what_logtail_reads_back_and_the_tail_is_the_same(tmp_path: Path) -> None:
    reader, _ = setup(tmp_path, ["iter 1: loss 4.25, time 35.12ms", "iter 2: loss nan, time 1.0ms",
                                 "iter 3: loss -inf, time 1.0ms", "noise", "iter 4: loss 1e-320, time 2ms"])
    chunks = drain(reader)
    handed = [r for c in chunks for r in c.read.records]
    back, garbage = logtail.read_all(reader.records_log)
    assert garbage == 0 and comparable(handed) == comparable(back)
    assert math.isnan(handed[1].fields["loss"]) and handed[2].fields["loss"] == -math.inf
    assert "loss" not in handed[1].metrics and handed[3].metrics["loss"] == 1e-320
    read_back = logtail.read_new(reader.records_log, logtail.TailState())
    assert reader.tail == read_back.state  # offset, file, head and count as a read would leave them


def test_records_someone_else_appended_are_read_from_the_file(tmp_path: Path) -> None:
    reader, stdout = setup(tmp_path, ["iter 1: loss 4.0, time 1ms"])
    drain(reader)
    with open(reader.records_log, "a") as f:  # the trainer's own babysit.log into $BABYSIT_LOG
        f.write('{"step": 1, "ts": 1.0, "eval_loss": 3.5}\n')
    with open(stdout, "a") as f:
        f.write("iter 2: loss 3.0, time 1ms\n")
    handed = [r for c in drain(reader) for r in c.read.records]
    assert [(r.step, dict(r.metrics)) for r in handed] == [(1, {"eval_loss": 3.5}),
                                                           (2, {"loss": 3.0, "ms": 1.0})]
    assert reader.tail.offset == reader.records_log.stat().st_size
