"""The incremental JSONL reader against real files: partial lines, garbage, resets, huge lines."""

from __future__ import annotations

import itertools
import json
import math
import os
from collections.abc import Sequence
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from babysit.core.reading.log_records import LogRecord, ProgressPoint, metric_series, seconds_per_step
from babysit.sources.logtail import TailState, read_all, read_new, read_recent


def line(step: int, ts: float, **metrics: object) -> bytes:
    return (json.dumps({"step": step, "ts": ts, **metrics}) + "\n").encode()


def append(path: Path, data: bytes) -> None:
    with open(path, "ab") as f:
        f.write(data)


def steps(records: tuple[LogRecord, ...] | list[LogRecord]) -> list[int]:
    return [r.step for r in records]


def test_missing_file_is_reported_and_keeps_the_state(tmp_path: Path) -> None:
    state = TailState(offset=7, records=3)
    got = read_new(tmp_path / "nope.jsonl", state)
    assert got.missing and got.records == () and got.state == state and not got.reset


def test_partial_last_line_is_left_for_next_time_then_completed(tmp_path: Path) -> None:
    log = tmp_path / "log.jsonl"
    full = line(1, 10.0, loss=0.5) + line(2, 11.0, loss=0.4)
    cut = len(line(1, 10.0, loss=0.5)) + 9
    log.write_bytes(full[:cut])
    first = read_new(log, TailState())
    assert steps(first.records) == [1]
    assert first.partial_bytes == 9 and first.state.offset == len(line(1, 10.0, loss=0.5))
    append(log, full[cut:])
    second = read_new(log, first.state)
    assert steps(second.records) == [2] and second.partial_bytes == 0
    assert second.state.offset == len(full) and second.state.records == 2
    assert second.records[0].metrics == {"loss": 0.4}
    assert second.records[0].offset == first.state.offset


def test_blank_lines_are_skipped_not_garbage(tmp_path: Path) -> None:
    log = tmp_path / "log.jsonl"
    log.write_bytes(b"\n" + line(1, 1.0) + b"   \n\r\n" + line(2, 2.0) + b"\n")
    got = read_new(log, TailState())
    assert steps(got.records) == [1, 2] and got.garbage == 0


@pytest.mark.parametrize("bad", [
    b"not json",
    b"[1, 2, 3]",
    b'"a string"',
    b'{"ts": 1.0, "loss": 1}',  # no step
    b'{"step": "3", "ts": 1.0}',  # step not an int
    b'{"step": true, "ts": 1.0}',  # bool is not a step
    b'{"step": 3.0, "ts": 1.0}',  # a float is not a step
    b'{"step": 3}',  # no ts
    b'{"step": 3, "ts": "yesterday"}',
    b'{"step": 3, "ts": NaN}',
    b'{"step": 3, "ts": Infinity}',
    b'{"step": 3, "ts": false}',
    b'{"step": 3, "ts": 1.0, "loss": 0.5',  # torn JSON with a newline after it
    b'{"step": 3, "ts": 1.0, "name": "\xff\xfe"}',  # invalid UTF-8
    b"[" * 100_000,  # nests deeper than the JSON parser recurses
])
def test_each_kind_of_garbage_is_counted_and_skipped(tmp_path: Path, bad: bytes) -> None:
    log = tmp_path / "log.jsonl"
    log.write_bytes(line(1, 1.0) + bad + b"\n" + line(2, 2.0))
    got = read_new(log, TailState())
    assert steps(got.records) == [1, 2]
    assert got.garbage == 1 and got.state.garbage == 1
    assert read_all(log) == (list(got.records), 1)


def test_nan_and_inf_metrics_are_kept_out_of_metrics_but_visible_in_fields(tmp_path: Path) -> None:
    log = tmp_path / "log.jsonl"
    log.write_bytes(
        b'{"step": 5, "ts": 1.0, "train_loss": NaN, "grad_norm": Infinity, "lr": 0.001, "n": 3, '
        b'"big": 1e999, "huge": ' + b"9" * 400 + b', "ok": true, "reason": "x", "event": "diverged"}\n'
    )
    (rec,) = read_new(log, TailState()).records
    assert dict(rec.metrics) == {"lr": 0.001, "n": 3.0}
    assert math.isnan(rec.fields["train_loss"])
    assert rec.fields["grad_norm"] == math.inf and rec.fields["big"] == math.inf and rec.fields["huge"] == math.inf
    assert rec.fields["ok"] is True and rec.fields["reason"] == "x"
    assert rec.event == "diverged" and "event" not in rec.fields
    assert set(rec.nonfinite) == {"train_loss", "grad_norm", "big", "huge"}


def test_records_are_immutable(tmp_path: Path) -> None:
    log = tmp_path / "log.jsonl"
    log.write_bytes(line(1, 1.0, loss=1.0))
    (rec,) = read_all(log)[0]
    with pytest.raises(TypeError):
        rec.metrics["loss"] = 2.0  # type: ignore[index]


def test_truncation_resets_and_reads_again_from_zero(tmp_path: Path) -> None:
    log = tmp_path / "log.jsonl"
    log.write_bytes(line(1, 1.0) + line(2, 2.0) + line(3, 3.0))
    first = read_new(log, TailState())
    with open(log, "r+b") as f:  # same inode, shorter content: a trainer restarted with mode "w"
        f.truncate(0)
        f.write(line(1, 9.0))
    got = read_new(log, first.state)
    assert got.reset and steps(got.records) == [1] and got.records[0].ts == 9.0
    assert got.state.resets == 1 and got.state.offset == len(line(1, 9.0))


def test_a_file_renamed_over_the_log_resets(tmp_path: Path) -> None:
    log = tmp_path / "log.jsonl"
    log.write_bytes(line(1, 1.0) + line(2, 2.0))
    first = read_new(log, TailState())
    new = tmp_path / "new.jsonl"
    new.write_bytes(line(1, 5.0) + line(2, 6.0) + line(3, 7.0) + line(4, 8.0))
    os.replace(new, log)
    got = read_new(log, first.state)
    assert got.reset and steps(got.records) == [1, 2, 3, 4] and got.state.resets == 1
    assert got.state.file_id == (os.stat(log).st_dev, os.stat(log).st_ino)


def test_rewrite_in_place_with_the_same_size_is_detected_by_the_head_hash(tmp_path: Path) -> None:
    log = tmp_path / "log.jsonl"
    old = line(1, 1.0, loss=0.25) + line(2, 2.0, loss=0.25)
    new = line(1, 3.0, loss=0.75) + line(2, 4.0, loss=0.75)
    assert len(old) == len(new)
    log.write_bytes(old)
    ino = os.stat(log).st_ino
    first = read_new(log, TailState())
    with open(log, "r+b") as f:
        f.write(new)
    assert os.stat(log).st_ino == ino and os.stat(log).st_size == first.state.offset
    got = read_new(log, first.state)
    assert got.reset and [r.ts for r in got.records] == [3.0, 4.0]


def test_the_head_grows_with_a_small_file_and_appends_never_reset(tmp_path: Path) -> None:
    log = tmp_path / "log.jsonl"
    state = TailState()
    for i in range(40):  # grows past the 256 hashed bytes, one line at a time
        append(log, line(i, float(i)))
        got = read_new(log, state)
        assert not got.reset and steps(got.records) == [i]
        state = got.state
    assert state.head_len == 256 and state.records == 40 and state.resets == 0


def test_a_huge_line_is_skipped_without_being_buffered(tmp_path: Path) -> None:
    log = tmp_path / "log.jsonl"
    max_line, max_bytes = 1000, 4096
    huge = b'{"step": 2, "ts": 2.0, "blob": "' + b"x" * 50_000 + b'"}\n'
    log.write_bytes(line(1, 1.0) + huge[:20_000])
    state = TailState()
    got = read_new(log, state, max_bytes=max_bytes, max_line_bytes=max_line)
    # One window: the first record, then the huge line is garbage and the reader drops it as it goes.
    assert steps(got.records) == [1] and got.garbage == 1
    assert got.state.skipping and got.state.offset == max_bytes and got.partial_bytes == 0
    reads = 0
    state = got.state
    while state.offset < log.stat().st_size:
        got = read_new(log, state, max_bytes=max_bytes, max_line_bytes=max_line)
        assert got.state.offset - state.offset <= max_bytes and got.records == () and got.garbage == 0
        state, reads = got.state, reads + 1
    assert state.skipping and reads >= 4  # the rest of the line went by in bounded windows
    append(log, huge[20_000:] + line(3, 3.0))
    while True:
        got = read_new(log, state, max_bytes=max_bytes, max_line_bytes=max_line)
        state = got.state
        if got.records:
            break
    assert steps(got.records) == [3] and not state.skipping and state.garbage == 1
    assert state.offset == log.stat().st_size
    whole, garbage = read_all(log, max_line_bytes=max_line)
    assert steps(whole) == [1, 3] and garbage == 1


def test_a_complete_line_longer_than_the_limit_is_garbage(tmp_path: Path) -> None:
    log = tmp_path / "log.jsonl"
    long = line(2, 2.0, blob="y" * 200)
    log.write_bytes(line(1, 1.0) + long + line(3, 3.0))
    got = read_new(log, TailState(), max_line_bytes=100)
    assert steps(got.records) == [1, 3] and got.garbage == 1 and not got.state.skipping


def test_a_second_read_parses_only_the_appended_bytes(tmp_path: Path) -> None:
    log = tmp_path / "log.jsonl"
    log.write_bytes(b"".join(line(i, float(i)) for i in range(1000)))
    first = read_new(log, TailState())
    assert first.state.offset == log.stat().st_size and len(first.records) == 1000
    extra = line(1000, 1000.0) + line(1001, 1001.0)
    append(log, extra)
    second = read_new(log, first.state)
    assert steps(second.records) == [1000, 1001]
    assert second.records[0].offset == first.state.offset
    assert second.state.offset - first.state.offset == len(extra)
    again = read_new(log, second.state)
    assert again.records == () and again.state.offset == second.state.offset and not again.reset


def test_max_bytes_bounds_one_read_and_the_next_read_continues(tmp_path: Path) -> None:
    log = tmp_path / "log.jsonl"
    log.write_bytes(b"".join(line(i, float(i)) for i in range(100)))
    state, seen = TailState(), []
    while state.offset < log.stat().st_size:
        got = read_new(log, state, max_bytes=500, max_line_bytes=100)
        assert got.state.offset - state.offset <= 500
        seen += steps(got.records)
        state = got.state
    assert seen == list(range(100))


def test_steps_are_returned_in_file_order_without_judgement(tmp_path: Path) -> None:
    log = tmp_path / "log.jsonl"
    log.write_bytes(line(5, 1.0) + line(3, 2.0) + line(3, 3.0) + line(4, 4.0))
    assert steps(read_all(log)[0]) == [5, 3, 3, 4]


def test_state_round_trips_through_json() -> None:
    state = TailState(offset=12, file_id=(3, 99), head="ab" * 32, head_len=200, skipping=True,
                      records=4, garbage=2, resets=1)
    assert TailState.from_dict(json.loads(json.dumps(state.to_dict()))) == state
    assert TailState.from_dict({}) == TailState()


def test_read_all_parses_an_unterminated_last_line_and_refuses_a_missing_file(tmp_path: Path) -> None:
    log = tmp_path / "log.jsonl"
    log.write_bytes(line(1, 1.0) + b'{"step": 2, "ts": 2.0}')
    assert steps(read_all(log)[0]) == [1, 2]
    log.write_bytes(line(1, 1.0) + b'{"step": 2, "ts')  # a torn write at the end
    assert (steps(read_all(log)[0]), read_all(log)[1]) == ([1], 1)
    with pytest.raises(FileNotFoundError):
        read_all(tmp_path / "absent.jsonl")


def test_metric_series_is_sorted_by_step_and_the_last_value_wins() -> None:
    recs = [
        LogRecord(0, 0.0, {"loss": 3.0}), LogRecord(10, 1.0, {"loss": 2.0}), LogRecord(20, 2.0, {"loss": 1.5}),
        LogRecord(20, 2.5, {"eval": 9.0}),  # no loss: does not erase step 20's loss
        LogRecord(10, 3.0, {"loss": 2.2}),  # resumed from step 10: re-logged
        LogRecord(15, 4.0, {"loss": 1.9}),
    ]
    assert metric_series(recs, "loss") == ((0, 3.0), (10, 2.2), (15, 1.9), (20, 1.5))
    assert metric_series(recs, "eval") == ((20, 9.0),)
    assert metric_series(recs, "absent") == ()


def test_seconds_per_step_over_a_steady_run() -> None:
    points = [ProgressPoint(i * 10, 100.0 + i * 5.0) for i in range(50)]
    assert seconds_per_step(points) == pytest.approx(0.5)
    assert seconds_per_step(points[:2]) == pytest.approx(0.5)


def test_seconds_per_step_ignores_a_clock_going_backwards() -> None:
    points = [ProgressPoint(0, 100.0), ProgressPoint(10, 110.0), ProgressPoint(20, 50.0),  # clock stepped back
              ProgressPoint(30, 60.0), ProgressPoint(40, 70.0)]
    assert seconds_per_step(points) == pytest.approx(1.0)


def test_seconds_per_step_ignores_repeated_and_resumed_steps_and_uses_the_window() -> None:
    points = [ProgressPoint(0, 0.0), ProgressPoint(10, 100.0),  # slow start: 10 s/step
              ProgressPoint(10, 101.0),  # an eval record at the same step
              ProgressPoint(20, 111.0), ProgressPoint(5, 112.0),  # resumed from step 5
              ProgressPoint(15, 122.0), ProgressPoint(25, 132.0)]
    # step 10 counts from its first record (t=100): 10 -> 20 took 11 s, not the 10 s after the eval
    assert seconds_per_step(points, window=4) == pytest.approx(31.0 / 30)
    assert seconds_per_step(points, window=100) == pytest.approx(131.0 / 40)


def test_seconds_per_step_needs_progress() -> None:
    assert seconds_per_step([]) is None
    assert seconds_per_step([ProgressPoint(1, 1.0)]) is None
    assert seconds_per_step([ProgressPoint(1, 1.0), ProgressPoint(1, 2.0)]) is None
    assert seconds_per_step([ProgressPoint(1, 2.0), ProgressPoint(2, 1.0)]) is None
    with pytest.raises(ValueError):
        seconds_per_step([ProgressPoint(1, 1.0)], window=1)


def test_seconds_per_step_counts_each_step_from_its_first_record(tmp_path: Path) -> None:
    """What real trainers write: several records a step (the loss, then the learning rate and the
    step's timing once the optimizer stepped), and an eval record at the step it evaluated. 2.5 s a
    step, of which 2 s between the step's first and its last record: pairing every record read 0.5."""
    log = tmp_path / "log.jsonl"
    t, out = 1000.0, []
    for step in range(1, 41):
        out.append(line(step, t, loss=2.0 - step / 100))
        out.append(line(step, t + 2.0, lr=3e-4, ms_per_batch=2500.0))
        t += 2.5
        if step % 10 == 0:  # an eval at this step, logged at the same step after it ran (5 s)
            out.append(line(step, t + 5.0, eval_loss=1.9))
            t += 5.0
    log.write_bytes(b"".join(out))
    records = read_all(log)[0]
    assert seconds_per_step(records[-9:]) == pytest.approx(2.5)  # steps 38..40: between the evals
    assert seconds_per_step(records) == pytest.approx((19 * 2.5 + 5.0) / 19)  # steps 21..40, the eval at 30


class CountingPoints(Sequence):
    """A run's points that count which of them were looked at."""

    def __init__(self, points: list[ProgressPoint]) -> None:
        self.points, self.looked = points, set()

    def __len__(self) -> int:
        return len(self.points)

    def __getitem__(self, i: int) -> ProgressPoint:  # type: ignore[override]
        assert isinstance(i, int), "only single points are read"
        self.looked.add(i % len(self.points))
        return self.points[i]


def test_seconds_per_step_looks_only_as_far_back_as_its_window() -> None:
    """A guard round derives every run's pace from its 256 newest points: only the window's newest
    steps are looked at (all 256 were, at every round, for 1,000 runs: bench/scale.py)."""
    points = CountingPoints([ProgressPoint(i // 2, 100.0 + i) for i in range(256)])  # two records a step
    assert seconds_per_step(points, window=20) == pytest.approx(2.0)
    assert len(points.looked) <= 2 * 20 + 2
    assert max(points.looked) == 255 and min(points.looked) >= 256 - 2 * 20 - 2


def _pace_reference(points: Sequence[ProgressPoint], window: int = 20) -> float | None:
    """The pace's rule written plainly (every step's first point, then the newest window-1 usable pairs)."""
    firsts = [p for i, p in enumerate(points) if i == 0 or points[i - 1].step != p.step]
    total_dt, total_steps, pairs = 0.0, 0, 0
    for older, newer in reversed(list(itertools.pairwise(firsts))):
        dt, dstep = newer.ts - older.ts, newer.step - older.step
        if dt > 0 and dstep > 0 and math.isfinite(dt):
            total_dt, total_steps, pairs = total_dt + dt, total_steps + dstep, pairs + 1
            if pairs >= window - 1:
                break
    return total_dt / total_steps if pairs else None


@settings(max_examples=400, deadline=None)
@given(pts=st.lists(st.tuples(st.integers(0, 12), st.floats(-5, 60, allow_nan=False)), max_size=70),
       window=st.integers(2, 25))
def test_seconds_per_step_is_the_plain_rule(pts: list[tuple[int, float]], window: int) -> None:
    """Steps repeated, going back, clocks going back, windows shorter and longer than the points."""
    points = [ProgressPoint(step, ts) for step, ts in pts]
    got, want = seconds_per_step(points, window), _pace_reference(points, window)
    assert (got is None) == (want is None) and (got is None or got == pytest.approx(want)), points


def test_seconds_per_step_accepts_records(tmp_path: Path) -> None:
    log = tmp_path / "log.jsonl"
    log.write_bytes(b"".join(line(i, 2.0 * i) for i in range(10)))
    assert seconds_per_step(read_all(log)[0]) == pytest.approx(2.0)


# --- properties ---------------------------------------------------------------------------------

valid_records = st.lists(
    st.fixed_dictionaries(
        {"step": st.integers(-5, 10**6), "ts": st.floats(0, 2e9, allow_nan=False)},
        optional={
            "loss": st.floats(allow_nan=False, allow_infinity=False),
            "event": st.sampled_from(["start", "stopped", "diverged"]),
            "note": st.text(max_size=20),
            "n": st.integers(-(10**6), 10**6),
        },
    ),
    max_size=30,
)


def as_tuple(r: LogRecord) -> tuple[object, ...]:
    return (r.step, r.ts, dict(r.metrics), r.event, dict(r.fields), r.offset)


def split(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({min(c, len(data)) for c in cuts})
    return [data[a:b] for a, b in zip([0, *points], [*points, len(data)], strict=True)]


def tail_in_chunks(log: Path, chunks: list[bytes], **limits: int) -> tuple[list[LogRecord], TailState]:
    state, got = TailState(), []
    for chunk in chunks:
        append(log, chunk)
        while True:  # drain: with a small window one append may need several reads
            read = read_new(log, state, **limits)
            assert not read.reset and not read.missing
            assert read.state.offset <= log.stat().st_size
            got.extend(read.records)
            progressed = read.state.offset != state.offset
            state = read.state
            if not progressed:
                break
    return got, state


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture])  # examples: the profile (tests/conftest.py)
@given(records=valid_records, cuts=st.lists(st.integers(0, 4000), max_size=12))
def test_incremental_reads_of_any_chunking_equal_the_whole_file_read(
    tmp_path_factory: pytest.TempPathFactory, records: list[dict[str, object]], cuts: list[int]
) -> None:
    log = tmp_path_factory.mktemp("prop") / "log.jsonl"
    data = b"".join((json.dumps(r) + "\n").encode() for r in records)
    got, state = tail_in_chunks(log, split(data, cuts))
    whole, garbage = read_all(log)
    assert garbage == 0 and state.garbage == 0
    assert [as_tuple(r) for r in got] == [as_tuple(r) for r in whole]
    assert len(whole) == len(records) and state.offset == len(data)


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture])  # examples: the profile (tests/conftest.py)
@given(
    pieces=st.lists(st.one_of(
        st.builds(lambda r: (json.dumps(r) + "\n").encode(), valid_records.map(lambda rs: rs[0] if rs else {})),
        st.binary(max_size=300),
    ), max_size=25),
    cuts=st.lists(st.integers(0, 6000), max_size=12),
)
def test_garbage_interleaved_never_raises_and_small_windows_agree_with_the_whole_read(
    tmp_path_factory: pytest.TempPathFactory, pieces: list[bytes], cuts: list[int]
) -> None:
    log = tmp_path_factory.mktemp("prop") / "log.jsonl"
    data = b"".join(pieces) + b"\n"
    limits = {"max_bytes": 150, "max_line_bytes": 120}  # small: skip mode crosses chunk and window edges
    got, state = tail_in_chunks(log, split(data, cuts), **limits)
    whole, garbage = read_all(log, max_line_bytes=limits["max_line_bytes"])
    assert state.offset == len(data) and not state.skipping
    assert [repr(as_tuple(r)) for r in got] == [repr(as_tuple(r)) for r in whole]
    assert state.garbage == garbage


def test_read_recent_reads_only_the_end_and_drops_the_cut_first_line_and_the_unfinished_last(tmp_path: Path) -> None:
    log = tmp_path / "log.jsonl"
    append(log, b"".join(line(s, 1000.0 + s, train_loss=0.5) for s in range(1, 2001)))
    append(log, b'{"step": 2001, "ts": 30')  # the trainer is mid-write
    size = log.stat().st_size
    got = read_recent(log, max_bytes=4096)
    assert got is not None and 20 < len(got) < 4096 // 40
    assert steps(got) == list(range(2001 - len(got), 2001)), "whole lines only, up to the last complete one"
    assert got[0].offset > size - 4096
    assert log.stat().st_size == size, "read-only"
    whole = read_recent(log, max_bytes=10 * size)
    assert whole is not None and steps(whole)[0] == 1, "a window holding the whole file keeps its first line"


def test_read_recent_says_none_for_a_log_it_cannot_read_and_nothing_for_one_long_line(tmp_path: Path) -> None:
    assert read_recent(tmp_path / "absent.jsonl") is None
    log = tmp_path / "log.jsonl"
    append(log, line(1, 1.0, blob="x" * 10_000))
    assert read_recent(log, max_bytes=1024) == ()


def test_values_no_float_holds_are_kept_out_of_metrics_and_a_step_beyond_an_integer_is_garbage() -> None:
    from babysit.sources.logtail import parse_line

    huge = 10**400
    record = parse_line(b'{"step": 5, "ts": 1.0, "e": %d, "n": -%d, "tiny": 1e-320, "big": 1.7e308, "x": NaN}'
                        % (huge, huge))
    assert record is not None and dict(record.metrics) == {"tiny": 1e-320, "big": 1.7e308}
    assert record.fields["e"] == math.inf and record.fields["n"] == -math.inf and math.isnan(record.fields["x"])
    assert parse_line(b'{"step": %d, "ts": 1.0, "e": 1.0}' % huge) is None
    assert parse_line(b'{"step": %d, "ts": 1.0}' % 2**63) is None
    assert parse_line(b'{"step": %d, "ts": 1.0}' % (2**63 - 1)) is not None


def _parse_line_before(line: bytes, offset: int = 0) -> LogRecord | None:
    """parse_line as it was before its short path (one json.loads, the type helpers per value): the rule
    the short path must keep, line for line."""
    from types import MappingProxyType

    from babysit.sources.logtail import MAX_STEP

    def number(value: object) -> bool:
        return isinstance(value, (int, float)) and not isinstance(value, bool)

    def as_float(value: object) -> float:
        try:
            return float(value)  # type: ignore[arg-type]
        except OverflowError:
            return math.inf if value > 0 else -math.inf  # type: ignore[operator]

    def finite(value: object) -> float | None:
        if not number(value):
            return None
        f = as_float(value)
        return f if math.isfinite(f) else None

    try:
        obj = json.loads(line.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        return None
    if not isinstance(obj, dict):
        return None
    step, ts = obj.get("step"), finite(obj.get("ts"))
    if not isinstance(step, int) or isinstance(step, bool) or ts is None or abs(step) > MAX_STEP:
        return None
    metrics: dict[str, float] = {}
    fields: dict[str, object] = {}
    event = None
    for key, value in obj.items():
        if key in ("step", "ts"):
            continue
        if key == "event" and isinstance(value, str):
            event = value
            continue
        f = finite(value)
        if f is not None:
            metrics[key] = f
        elif number(value):
            fields[key] = as_float(value)
        else:
            fields[key] = value
    return LogRecord(step, ts, MappingProxyType(metrics), event, MappingProxyType(fields), offset)


def _shape(record: LogRecord | None) -> object:
    """A record as comparable text (NaN != NaN as a value; its repr is the same)."""
    if record is None:
        return None
    return (record.step, repr(record.ts), type(record.ts), repr(sorted(record.metrics.items())),
            [type(v) for v in record.metrics.values()], record.event, repr(sorted(record.fields.items(), key=repr)),
            record.offset)


_values = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True), st.integers(min_value=-(10**400), max_value=10**400),
    st.integers(min_value=-(2**64), max_value=2**64), st.booleans(), st.none(), st.text(max_size=5),
    st.lists(st.integers(), max_size=2), st.dictionaries(st.text(max_size=2), st.integers(), max_size=2))
_special = st.sampled_from([math.nan, math.inf, -math.inf, 1.7e308, 1e-320, -0.0, 10**400, 2**63, True, "x"])
_metric_keys = st.sampled_from(["event", "loss", "lr", "grad_norm", "eval_loss", "total_steps", "é"])
_keys = st.one_of(st.sampled_from(["step", "ts"]), _metric_keys)


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(obj=st.one_of(st.dictionaries(_keys, _values, max_size=7), _values),
       record=st.tuples(st.one_of(st.integers(min_value=0, max_value=10**6), st.integers(min_value=-(2**64),
                                                                                      max_value=2**64)),
                        st.one_of(st.floats(min_value=0, max_value=2e9), st.floats(), st.integers()),
                        st.dictionaries(_metric_keys, st.one_of(_special, _values), max_size=6)),
       as_record=st.booleans(),
       around=st.sampled_from(["", " ", "\t", "\r", "\ufeff", "x", ",", "]", " \r", "{}"]),
       where=st.sampled_from(["before", "after", "none", "none", "none"]),
       cut=st.sampled_from([0, 0, 0, 1, 2]), offset=st.integers(min_value=0, max_value=10**6))
def test_parse_line_short_path_reads_every_line_as_json_loads_did(obj: object, record: tuple, as_record: bool,
                                                                  around: str, where: str, cut: int,
                                                                  offset: int) -> None:
    if as_record:  # mostly a line with a step and a time, then any values (others replace them at random)
        obj = {"step": record[0], "ts": record[1], **record[2]}
    text = json.dumps(obj, allow_nan=True)
    if cut:  # a torn write
        text = text[:-cut]
    text = around + text if where == "before" else text + around if where == "after" else text
    from babysit.sources.logtail import parse_line

    data = text.encode("utf-8", "surrogatepass")
    assert _shape(parse_line(data, offset)) == _shape(_parse_line_before(data, offset)), data


@pytest.mark.parametrize("data", [
    b'{"step": 1, "ts": 2}', b'{"step": 1, "ts": true}', b'{"step": true, "ts": 1.0}', b'{"step": 1.0, "ts": 1.0}',
    b'{"step": 1, "ts": NaN}', b'{"step": 1, "ts": 1e999}', b'{"step": 1, "ts": 1.0, "event": 3, "loss": -Infinity}',
    b'{"step": 1, "ts": 1.0, "step": 2}', b'\xff{"step": 1, "ts": 1.0}', b'[{"step": 1, "ts": 1.0}]',
    b'{"step": 1, "ts": 1.0}{"step": 2, "ts": 1.0}', b'{"step": 1, "ts": 1.0, "x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
    b'\xef\xbb\xbf{"step": 1, "ts": 1.0}', b'{"step": 1, "ts": 1.0, "n": 1' + b"0" * 5000 + b"}",
])
def test_parse_line_short_path_edge_lines(data: bytes) -> None:
    from babysit.sources.logtail import parse_line

    assert _shape(parse_line(data, 3)) == _shape(_parse_line_before(data, 3))
