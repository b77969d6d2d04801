"""Poll snapshots as tables: progress, ETA, GPU-hour projection, per-GPU rows and flags."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from babysit.core.guards import Holder
from babysit.core.reading.log_records import ProgressPoint
from babysit.core.readings import GpuProcess, GpuReading, GpuView, HostReading
from babysit.core.render import render
from babysit.core.snapshot import GpuRow, Snapshot, build_snapshot, project_gpu_hours, steps_from_argv

GIB = 2**30
POINTS = tuple(ProgressPoint(s, 1000.0 + 30.0 * s) for s in range(0, 101, 10))  # 30 s/step, at step 100
TRAINER = GpuProcess(100, "python -m trainer", 70 * GIB)
POLICY = GpuProcess(4242, "policy_server", 61 * GIB)


def reading(index=0, util=97.0, procs=(TRAINER,), faults=()) -> GpuReading:
    return GpuReading(index, "NVIDIA H200", f"GPU-{index}", util, 12, 71 * GIB, 141 * GIB, tuple(procs),
                      tuple(faults))


HOST = HostReading(64 * GIB, 128 * GIB, 20 * GIB, 850.0, frozenset({100}))


def snap(**kw):
    base = dict(run="r", attempt=1, at=5000.0, kind="first", points=POINTS, read_step=1000, gpu_hours_used=1.0,
                gpu_hours_cap=12.0, gpus=(0,), view=GpuView(True, None, (reading(),)), host=HOST,
                starvation_util_pct=50, min_free_host_ram_gib=8)
    base.update(kw)
    return build_snapshot(**base)


def test_first_poll_reports_util_pace_and_free_ram():
    s = snap()
    assert (s.step, s.seconds_per_step, s.eta_seconds, s.target_step) == (100, 30.0, 900 * 30.0, 1000)
    assert s.gpus[0].util_pct == 97.0 and s.gpus[0].held_by_foreign == ()
    assert s.available_ram_bytes == 64 * GIB and s.run_rss_bytes == 20 * GIB and s.run_cpu_pct == 850.0
    assert s.gpu_hours_projected == pytest.approx(1.0 + 900 * 30 / 3600)
    assert s.flags == () and s.gpu_note is None


@pytest.mark.parametrize(("kw", "flag"), [
    pytest.param(dict(view=GpuView(True, None, (reading(util=20.0),)), data_wait_frac=0.5), "input-starvation",
                 id="starved"),
    pytest.param(dict(view=GpuView(True, None, (reading(util=20.0),)), data_wait_frac=0.01), "gpu-util-low",
                 id="low-util-without-starvation"),
    pytest.param(dict(points=(), seconds_since_launch=60.0, stall_seconds=1200.0), "waiting-for-first-record",
                 id="start-up"),
    pytest.param(dict(host=HostReading(4 * GIB, 128 * GIB, 1, 1.0, frozenset({100}))), "host-memory-pressure",
                 id="low-ram"),
    pytest.param(dict(view=GpuView(False, "no driver — install it", ())), "gpu-unseen", id="no-gpu-visible"),
    pytest.param(dict(view=None), "gpu-unseen", id="gpu-not-read"),
    pytest.param(dict(view=GpuView(True, None, ())), "gpu-unseen", id="run-gpu-missing"),
    pytest.param(dict(view=GpuView(True, None, (reading(procs=(TRAINER, POLICY)),))), "gpu-held", id="held"),
    pytest.param(dict(view=GpuView(True, None, (reading(faults=("xid 79",)),))), "gpu-fault", id="fault"),
    pytest.param(dict(seconds_since_last_record=700.0, stall_seconds=1200.0), "stalled?", id="stall-suspect"),
    pytest.param(dict(points=()), "no-log-records-yet", id="no-records"),
    pytest.param(dict(points=(), seconds_since_launch=700.0, stall_seconds=1200.0), "no-log-records-yet",
                 id="no-records-after-start-up"),
    pytest.param(dict(gpu_hours_used=11.9), "gpu-hours-projection", id="projection-past-cap"),
])
def test_flags(kw, flag):
    assert flag in snap(**kw).flags


@pytest.mark.parametrize("kw", [
    pytest.param(dict(view=GpuView(True, None, (reading(util=20.0),)), steps_advanced=False), id="no-progress"),
    pytest.param(dict(view=GpuView(True, None, (reading(util=None),))), id="util-not-measured"),
    pytest.param(dict(view=GpuView(True, None, (reading(util=20.0),)), points=POINTS[:1]), id="no-pace-yet"),
    pytest.param(dict(seconds_since_last_record=500.0, stall_seconds=1200.0), id="recent-record"),
])
def test_no_false_flags(kw):
    s = snap(**kw)
    assert "input-starvation" not in s.flags and "stalled?" not in s.flags


def test_low_util_without_data_wait_evidence_never_says_starvation():
    """The README's H200 profile: util 38 % from small batches, the trainer waiting on data 0.9 %."""
    s = snap(view=GpuView(True, None, (reading(util=38.0),)), data_wait_frac=0.009)
    assert "input-starvation" not in s.flags and "gpu-util-low" in s.flags


def test_zombie_holder_is_not_foreign_in_a_poll():
    exiting = GpuProcess(555, "python -m trainer", GIB, zombie=True)
    s = snap(view=GpuView(True, None, (reading(procs=(TRAINER, exiting)),)))
    assert s.gpus[0].held_by_foreign == () and "gpu-held" not in s.flags


def test_unavailable_gpu_view_is_a_note_never_zero():
    s = snap(view=GpuView(False, "no NVIDIA driver here — install the NVIDIA driver", ()))
    assert s.gpu_note == "no GPU visible: no NVIDIA driver here — install the NVIDIA driver"
    assert s.gpus[0] == GpuRow.blank(0) and s.gpus[0].util_pct is None and s.gpus[0].visible is False


def test_cpu_run_has_no_gpu_rows_or_note():
    s = snap(gpus=(), view=None)
    assert s.gpus == () and s.gpu_note is None and "gpu-unseen" not in s.flags
    assert s.gpu_hours_projected == 1.0  # zero GPUs: no GPU-hours accrue


def test_foreign_holders_unknown_without_run_pids():
    s = snap(host=None, view=GpuView(True, None, (reading(procs=(POLICY,)),)))
    assert s.gpus[0].held_by_foreign is None and "gpu-held" not in s.flags


def test_foreign_holder_is_listed_with_pid_name_memory():
    s = snap(view=GpuView(True, None, (reading(procs=(TRAINER, POLICY)),)))
    assert s.gpus[0].held_by_foreign == (Holder(0, 4242, "policy_server", 61 * GIB),)
    assert s.to_dict()["gpus"][0]["held_by_foreign"] == [
        {"pid": 4242, "name": "policy_server", "used_memory_bytes": 61 * GIB}]  # as the store holds it


@pytest.mark.parametrize(("read_step", "end_step", "target", "eta"), [
    (1000, 2000, 1000, 900 * 30.0),  # the verdict's read comes first
    (None, 2000, 2000, 1900 * 30.0),  # no prereg: the command's --steps
    (None, None, None, None),  # unknown
    (50, None, 50, 0.0),  # past the target
])
def test_eta_target(read_step, end_step, target, eta):
    s = snap(read_step=read_step, end_step=end_step)
    assert (s.target_step, s.eta_seconds) == (target, eta)


def test_past_the_read_step_the_eta_counts_to_the_end_as_status_does():
    """Polls counted to the read step for ever (ETA 0 once past it) while status counted on to the end."""
    s = snap(points=(), step=1500, seconds_per_step=2.0, read_step=1000, end_step=2000)
    assert (s.target_step, s.eta_seconds) == (2000, 500 * 2.0)


def test_explicit_progress_overrides_points():
    s = snap(points=(), step=500, seconds_per_step=10.0)
    assert (s.step, s.eta_seconds) == (500, 5000.0)


@pytest.mark.parametrize(("args", "expected"), [
    ((1.0, 30.0, 900, 1), 1.0 + 7.5),
    ((1.0, 30.0, 900, 8), 1.0 + 60.0),
    ((1.0, None, 900, 1), None),
    ((1.0, 30.0, None, 1), None),
    ((1.0, 30.0, -5, 1), 1.0),
])
def test_project_gpu_hours(args, expected):
    assert project_gpu_hours(*args) == (pytest.approx(expected) if expected is not None else None)


@pytest.mark.parametrize(("argv", "expected"), [
    (["t", "--steps", "1000"], 1000), (["t", "--steps=250"], 250), (["t", "--max-steps", "7"], 7),
    (["t", "--steps", "10", "--steps", "20"], 20), (["t", "--steps", "{steps}"], None), (["t"], None),
    (["python", "train.py", "--max_iters=5000"], 5000), (["t", "--max_steps", "300"], 300),  # nanoGPT, HF
])
def test_steps_from_argv(argv, expected):
    assert steps_from_argv(argv) == expected


def test_to_dict_is_json_able_and_complete():
    s = snap(latest_eval={"eval_chunk_mae": 12.5}, latest_eval_step=250,
             provisional={"label": "AMBIGUOUS", "delta": 0.7, "status": "PROVISIONAL"}, note="running")
    data = json.loads(json.dumps(s.to_dict()))
    assert data["latest_eval"] == {"eval_chunk_mae": 12.5} and data["provisional"]["status"] == "PROVISIONAL"
    assert data["gpus"][0]["index"] == 0 and data["note"] == "running" and data["flags"] == []


def test_a_stored_snapshot_reads_back_as_the_value_it_was():
    """The renderers get the frozen Snapshot back from a poll's stored JSON: every field, not a dict."""
    s = snap(latest_eval={"eval_chunk_mae": 12.5}, latest_eval_step=250, seconds_since_launch=90.0,
             provisional={"label": "AMBIGUOUS", "delta": 0.7, "status": "PROVISIONAL"}, note="PENDING",
             view=GpuView(True, None, (reading(util=20.0, procs=(TRAINER, POLICY)),)), data_wait_frac=0.4,
             seconds_since_last_record=700.0, stall_seconds=1200.0, log_path="outputs/r/train_log.jsonl",
             shown_metrics={"train_loss": [100, 2.5]}, reading="📄 preset nanogpt")
    assert s.flags  # the figures behind flags travel too
    back = Snapshot.from_dict(json.loads(json.dumps(s.to_dict())))
    assert back == s
    assert back.progress == s.progress and back.gpus[0].held_by_foreign == (Holder(0, 4242, "policy_server", 61 * GIB),)


def test_a_snapshot_stored_before_a_field_existed_reads_it_as_unknown():
    old = {k: v for k, v in snap().to_dict().items() if k not in ("n_gpus", "stall_seconds", "reading", "note")}
    back = Snapshot.from_dict(old)
    assert back.stall_seconds is None and back.reading is None and back.note is None
    assert back.progress.n_gpus == 1  # counted from its GPU rows (core/progress.py)


def test_unknown_kind_is_rejected():
    with pytest.raises(ValueError, match="kind"):
        snap(kind="sometimes")


STORED = Path(__file__).parent / "fixtures" / "store" / "snapshots_2026-12-02.json"  # make_snapshots.py made it


def test_what_the_store_holds_today_reads_back_typed_and_writes_the_same_json():
    """Snapshots a real Store recorded before the GPU rows were typed (every kind of row: holders with memory
    known and not, processes not listed, a blank GPU, no GPU visible, a CPU run): each reads back as typed
    values and is written again byte for byte, so old rows load and new rows are what readers expect."""
    stored = json.loads(STORED.read_text())
    assert len(stored) == 4
    for d in stored:
        s = Snapshot.from_dict(d)
        assert all(isinstance(g, GpuRow) for g in s.gpus)
        assert all(isinstance(h, Holder) for g in s.gpus for h in g.held_by_foreign or ())
        assert s.to_dict() == d
        assert json.dumps(s.to_dict(), sort_keys=True) == json.dumps(d, sort_keys=True)
    first, unlisted, unseen, cpu = (Snapshot.from_dict(d) for d in stored)
    assert first.gpus[0].held_by_foreign == (Holder(0, 4242, "policy_server", 61 * GIB), Holder(0, 4343, "viewer", None))
    assert first.gpus[1].faults == ("xid 79",) and first.gpus[1].util_min_pct == 3.0
    assert unlisted.gpus == (GpuRow(0, True, "NVIDIA H200", None, None, 12, 71 * GIB, 141 * GIB, None, ()),
                             GpuRow.blank(3))
    assert unseen.gpus == (GpuRow.blank(0),) and cpu.gpus == ()


def test_the_renderers_say_of_a_typed_snapshot_what_they_said_of_its_dict():
    """The poll post and the live header of each stored snapshot, word for word what the renderers said when
    they read the dict (snapshots_2026-12-02.rendered.json, written by the code before)."""
    said = json.loads(STORED.with_suffix(".rendered.json").read_text())
    for d, before in zip(json.loads(STORED.read_text()), said, strict=True):
        assert render("poll", {"snapshot": d}).text == before["poll"]
        assert render("header", {"run": "r", "attempt": 2, "snapshot": d}).text == before["header"]


def test_a_row_an_older_daemon_or_a_test_wrote_reads_with_unknowns_not_zeros():
    (row,) = Snapshot.from_dict({"gpus": [{"util_pct": 90.0}]}).gpus
    assert row == GpuRow(0, False, None, 90.0, None, 0, None, None, None, ())
    assert Snapshot.from_dict({"gpus": [{"index": 5}, {"util_pct": 1.0}]}).gpus[1].index == 1  # its place


def test_a_poll_of_a_job_across_nodes_has_every_nodes_gpus_named_by_node():
    """Each node's GPU 0 is a row of its own: the mean util is over both nodes, a fault on n2 is said on n2,
    and a GPU one node's sidecar did not list is "not seen" on that node."""
    from dataclasses import replace

    across = GpuView(True, None, (replace(reading(util=90.0), node="n1"),
                                  replace(reading(util=50.0, faults=("xid 79",)), node="n2")))
    s = snap(view=across, host=None)
    assert [(g.node, g.index, g.util_pct) for g in s.gpus] == [("n1", 0, 90.0), ("n2", 0, 50.0)]
    assert s.mean_util_pct == 70.0 and "gpu-fault" in s.flags
    assert Snapshot.from_dict(json.loads(json.dumps(s.to_dict()))).gpus == s.gpus
    assert "GPU 0 on n2: xid 79" in render("poll", {"snapshot": s.to_dict()}).text
    gone = snap(view=GpuView(True, None, (replace(reading(), node="n1"), replace(reading(index=3), node="n2"))),
                host=None)
    assert gone.gpu_note == "no GPU visible: GPU 0 on n2 not seen by the probe" and "gpu-unseen" in gone.flags
