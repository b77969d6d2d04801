"""A read's records as columns (`records.Block`, written by `records.write_batch`, handed on as a
`RecordBatch`) are the very records, bytes and run state of the same records one at a time."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from babysit.sources import patterns, records
from tests.supervised import supervised_run
from tests.support import run_toml, stdout_source


def test_a_batch_is_the_sequence_of_records_the_loop_hands_on(tmp_path: Path) -> None:
    blocks = [records.Block(("a", "b"), [1, 2, 3], ([1.0, 2.0, 3.5], [0.5, 0.25, 1e300])),
              records.Item(4, {"c": 2.0}), records.Block(("a",), [5, 6], ([float("nan"), 1.0],))]
    path = tmp_path / "r.jsonl"
    written, anchor, batch = records.write_batch(path, blocks, (0, 1.8e9 - 5), 1.8e9, 0)
    one_by_one = records.stamp(list(records.items_of(blocks)), (0, 1.8e9 - 5), 1.8e9)
    lines = [records.encode(it) for it in one_by_one]
    assert path.read_bytes() == b"".join(lines) and written == len(b"".join(lines))
    assert list(batch) == list(records.as_log_records(one_by_one, lines, 0))
    assert [batch[i] for i in range(-len(batch), len(batch))] == list(batch) * 2
    assert anchor == (one_by_one[-1].step, one_by_one[-1].ts)


def test_stamps_are_written_as_repr_of_the_rounded_time() -> None:
    rng = random.Random(3)
    stamps = [rng.uniform(1e-3, 10) for _ in range(3000)] + [rng.uniform(1.7e9, 2**31 - 1) for _ in range(3000)]
    stamps += [1.0, 2.0, 1e-3, 2**31 - 1e-3, 1800000000.0, 1800000000.0000005, 0.0015, 123.4564999]
    for chunk in (stamps, [1e-4, 5.0], [2.0**31, 1.0], [3e9]):  # outside the range: repr(round()) itself
        assert records._ts_texts(chunk) == [repr(round(x, 6)) for x in chunk]


RUN_TOML = run_toml(
    "r", ["python", "train.py"], run={"total_steps": 100000}, guards={"min_free_host_ram_gib": 1},
    source=stdout_source(r"iter (?P<step>\d+): loss (?P<train_loss>[-+.\w]+), grad_norm (?P<grad_norm>[-+.\w]+)",
                         r"step (?P<step>\d+): eval_loss (?P<eval_loss>[-+.\w]+), total_steps (?P<total_steps>\d+)"),
    prereg={"question": "Does eval loss fall?", "metric": "eval_loss", "baseline_step": 0, "read_step": 4000,
            "bands": [{"label": "IMPROVES", "max": 0.0}], "otherwise": {"label": "FLAT-OR-WORSE"}})


def _runlog_state(tmp_path: Path, text: str, columns: bool, monkeypatch: pytest.MonkeyPatch) -> dict:
    tmp_path.mkdir()
    with supervised_run(tmp_path, RUN_TOML, text) as (sup, clock):
        with monkeypatch.context() as mp:
            if not columns:  # the reader hands each record on as an item of its own
                mp.setattr(patterns, "_append", lambda pieces, step, metrics: pieces.append(records.Item(step, metrics)))
            clock.advance(5)
            sup.runlog.read_log(drain=True)
        log = sup.runlog
        handed = log.pumped.records if log.pumped is not None else None
        took_columns = isinstance(handed, records.RecordBatch) and any(
            isinstance(seg, records.ColumnSegment) for seg in handed.segments)
        assert took_columns == columns
        return {"points": [(p.step, p.ts) for p in log.points], "recent": repr(list(log.recent)),
                "shown": repr(log.latest_shown), "eval": (log.latest_eval, log.latest_eval_step),
                "declared": log.declared_end, "nonfinite": repr(log.nonfinite), "pending": log.nonfinite_pending,
                "series": sup.verdicts.series_cache.series() if sup.verdicts.series_cache else None,
                "provisional": sup.verdicts.provisional,
                "records": (tmp_path / ".babysit" / "runs" / "r" / "records.jsonl").read_bytes()}


@pytest.mark.parametrize("tail", ["", "iter 9000: loss 1.0, grad_norm inf\n", "iter 9000: loss nan, grad_norm 1.0\n"])
def test_a_run_reads_the_same_from_columns_as_from_records(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                           tail: str) -> None:
    """The run's state after a read (step points, recent records, shown metrics, the latest eval, the
    declared end, divergence, the verdict's series) is the same whether the records came as columns or
    one by one; with a NaN or an inf in the read too (a grad norm's first inf is pending, a loss's is
    divergence)."""
    lines = []
    for i in range(1, 8001):
        lines.append(f"iter {i}: loss {4 - i / 4000:.4f}, grad_norm {1 + (i % 7) / 10:.2f}")
        if i % 1000 == 0 or i == 1:
            lines.append(f"step {i if i > 1 else 0}: eval_loss {3 - i / 8000:.4f}, total_steps {8000 + i}")
    text = "\n".join(lines) + "\n" + tail
    columns = _runlog_state(tmp_path / "columns", text, True, monkeypatch)
    one_by_one = _runlog_state(tmp_path / "one_by_one", text, False, monkeypatch)
    assert columns == one_by_one
    assert columns["declared"] == 16000 and columns["eval"][1] == 8000 and len(columns["points"]) == 256
    assert [step for step, _ in columns["series"][0]] == [0, *range(1000, 8001, 1000)]  # the verdict's series
