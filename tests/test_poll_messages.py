"""What a poll says in words: every flag a snapshot can raise has user text with its figures."""

from __future__ import annotations

import json

import pytest

from babysit.core.reading.log_records import ProgressPoint
from babysit.core.readings import GpuProcess, GpuReading, GpuView, HostReading
from babysit.core.render import flag_line, render, snapshot_line
from babysit.core.snapshot import FLAGS, Snapshot, build_snapshot
from bot.messages import poll_result

GIB = 2**30
POINTS = tuple(ProgressPoint(s, 1000.0 + 0.05 * s) for s in range(0, 101, 10))


def poll_text(**kw) -> str:
    base = dict(run="r", attempt=1, at=5000.0, kind="first", points=POINTS, read_step=1000, gpu_hours_used=0.0061,
                gpu_hours_cap=0.006, gpus=(0,), log_path="outputs/r/train_log.jsonl",
                view=GpuView(True, None, (GpuReading(0, "NVIDIA H200", "GPU-0", 38.0, 1800, GIB, 141 * GIB,
                                                     (GpuProcess(100, "python -m trainer", GIB),), (),
                                                     util_min_pct=12.0),)),
                host=HostReading(64 * GIB, 128 * GIB, GIB, 100.0, frozenset({100})), data_wait_frac=0.009)
    base.update(kw)
    snap = build_snapshot(**base)
    return render("poll", {"run": "r", "snapshot": snap.to_dict()}).text


def test_every_flag_has_words_not_its_raw_name():
    nothing_measured = Snapshot.from_dict({})  # a stored snapshot with none of its figures
    for flag in FLAGS:
        line = flag_line(flag, nothing_measured)
        assert flag not in line, f"{flag} reaches users raw: {line}"


def test_the_readme_h200_profile_reads_low_util_with_its_causes_not_starvation():
    text = poll_text()
    assert "GPU util low (38 %)" in text and "0.9% of each step" in text and "not input starvation" in text
    assert "--num-workers" not in text
    assert "util 38% (min 12%, 1800 samples)" in text


def test_a_gpm_window_says_it_is_the_counters_over_the_window_through_the_stored_poll():
    gpm = GpuView(True, None, (GpuReading(0, "NVIDIA H200", "GPU-0", 38.0, 0, GIB, 141 * GIB,
                                          (GpuProcess(100, "python -m trainer", GIB),), (), util_seconds=1800.4),))
    text = poll_text(view=gpm)  # the snapshot's JSON, as the store and the outbox carry it, then rendered
    assert "util 38% (GPM counters over 30m00s)" in text and "samples" not in text


def test_starvation_with_evidence_prescribes_the_input_pipeline():
    text = poll_text(data_wait_frac=0.45)
    assert "input starvation: GPU util 38 %" in text and "45% of each step" in text and "--num-workers" in text


def test_first_poll_before_any_record_names_the_path_calmly_then_warns():
    early = poll_text(points=(), seconds_since_launch=60.0, stall_seconds=1200.0)
    assert "waiting for the first record in outputs/r/train_log.jsonl (1m00s since launch" in early
    assert "⚠️ waiting" not in early and "no-log-records-yet" not in early
    late = poll_text(points=(), seconds_since_launch=900.0, stall_seconds=1200.0)
    assert "⚠️ no record in outputs/r/train_log.jsonl yet, 15m00s after launch" in late
    assert "stops the run at 20m00s" in late


@pytest.mark.parametrize(("used", "cap", "shown"), [(0.0061, 0.006, "GPU-h 0.0061/0.006"), (3.14159, 12.0, "GPU-h 3.14/12.0")])
def test_gpu_hours_keep_enough_digits(used, cap, shown):
    assert shown in poll_text(gpu_hours_used=used, gpu_hours_cap=cap)


def test_the_bots_poll_answer_and_the_live_header_say_one_line_from_the_stored_poll():
    host = HostReading(64 * GIB, 128 * GIB, GIB, 100.0, frozenset({100}))
    snap = build_snapshot(run="r", attempt=1, at=5000.0, kind="on-demand", points=POINTS, read_step=1000,
                          gpu_hours_used=0.5, gpu_hours_cap=2.0, gpus=(0,), host=host)
    stored = json.loads(json.dumps(snap.to_dict()))  # as the bot reads it from the polls table
    header = render("header", {"run": "r", "attempt": 1, "snapshot": stored}).text
    answer = poll_result("r", "polled", Snapshot.from_dict(stored)).text
    line = snapshot_line(snap)
    assert "step 100" in line and line in header and line in answer


def test_the_bots_runs_list_reads_the_rows_themselves():
    """`/babysit runs` renders the frozen rows `status` renders, not their `--json` dicts."""
    from babysit.view.runview import Read, RunRow
    from bot.messages import runs_message

    rows = [RunRow(run="r", status="running", attempt=2, verdict=Read("PROVISIONAL", "HEALTHY", 0.01, 100)),
            RunRow(run="s", status="registered")]
    assert runs_message(rows).text == ("*2 registered runs:*\n• `r` — running · attempt 2 · HEALTHY (PROVISIONAL)\n"
                                       "• `s` — registered")
