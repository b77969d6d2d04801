"""kind = "tensorboard" over real event files written by torch's SummaryWriter, read with the
official tensorboard loader: bursts, a second file appearing, a record cut mid-write, restarts."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy
import pytest

from babysit.core.reading.log_records import metric_series, seconds_per_step
from babysit.core.spec.run_toml import RunSpec, load_spec
from babysit.sources import SourcePump, records_path, unreadable
from babysit.sources.logtail import read_all
from babysit.sources.tensorboard import event_files
from tests.conftest import Lazy, missing

pytestmark = pytest.mark.skipif(missing("torch", "tensorboard"), reason="needs torch and tensorboard (the dev extra)")
tb = Lazy("torch.utils.tensorboard")

RUN = """
[run]
name = "r1"
command = ["python", "train.py"]
[source]
kind = "tensorboard"
path = "runs/{name}"
"""


def spec_from(tmp_path: Path, text: str = RUN) -> RunSpec:
    path = tmp_path / "run.toml"
    path.write_text(textwrap.dedent(text))
    return load_spec(path, display="run.toml")


def records(spec: RunSpec, state_dir: Path) -> list:
    recs, garbage = read_all(records_path(spec, state_dir))
    assert garbage == 0
    return recs


def writer(spec: RunSpec, sub: str = "") -> Any:  # a torch.utils.tensorboard.SummaryWriter
    assert spec.source.path is not None
    return tb.SummaryWriter(str(spec.source.path / sub))


def test_scalars_flushed_in_bursts_keep_their_own_steps_and_wall_times(tmp_path: Path) -> None:
    spec = spec_from(tmp_path, RUN + '[source.metrics]\n"train/loss" = "loss"\n')
    sd = tmp_path / "sd"
    staging = tmp_path / "staging"
    w = tb.SummaryWriter(str(staging))
    t0 = 1_700_000_000.0
    for step in range(0, 50, 10):  # 2 s/step
        w.add_scalar("train/loss", 1.0 / (step + 1), step, walltime=t0 + 2.0 * step)
        w.add_scalar("lr", 0.1, step, walltime=t0 + 2.0 * step)
    for step in range(50, 100, 10):
        w.add_scalar("train/loss", 1.0 / (step + 1), step, walltime=t0 + 2.0 * step, new_style=True)  # TF2 tensors
    w.close()
    (written,) = event_files(staging)
    data = written.read_bytes()
    assert spec.source.path is not None
    spec.source.path.mkdir(parents=True)
    target = spec.source.path / written.name
    pump = SourcePump(spec, sd)
    added = []
    for burst in range(1, 4):  # the writer's flushes reach the disk in three bursts, cut anywhere
        with open(target, "ab") as f:
            f.write(data[(burst - 1) * len(data) // 3: burst * len(data) // 3])
        result = pump.pump(now=t0 + 600 + burst)
        assert result.output_grew
        added.append(result.records_added)
    assert sum(added) == 10 and all(added)
    recs = records(spec, sd)
    assert [r.step for r in recs] == list(range(0, 100, 10))
    assert [r.ts for r in recs] == [t0 + 2.0 * s for s in range(0, 100, 10)]  # the events' times, not the reads'
    assert dict(recs[0].metrics) == {"loss": 1.0, "lr": 0.1}  # one record per step; float32 0.1 read as 0.1
    assert metric_series(recs, "loss")[3] == (30, float(str(numpy.float32(1.0 / 31))))
    assert seconds_per_step(recs) == pytest.approx(2.0)


def test_a_second_event_file_is_picked_up_while_the_run_goes(tmp_path: Path) -> None:
    spec = spec_from(tmp_path)
    sd = tmp_path / "sd"
    train = writer(spec)
    train.add_scalar("loss", 2.0, 1, walltime=100.0)
    train.flush()
    pump = SourcePump(spec, sd)
    pump.pump(now=1.0)
    evals = writer(spec, "eval")  # a new file in a subfolder, as HF and Lightning write them
    evals.add_scalar("eval/loss", 1.5, 1, walltime=101.0)
    evals.flush()
    train.add_scalar("loss", 1.8, 2, walltime=102.0)
    train.flush()
    pump.pump(now=2.0)
    recs = records(spec, sd)
    assert sorted((r.step, *r.metrics.items()) for r in recs) == [
        (1, ("eval/loss", 1.5)), (1, ("loss", 2.0)), (2, ("loss", 1.8))]
    assert len(event_files(spec.source.path)) == 2  # type: ignore[arg-type]
    train.close()
    evals.close()


def test_a_record_cut_mid_write_is_read_once_it_is_whole(tmp_path: Path) -> None:
    spec = spec_from(tmp_path)
    sd = tmp_path / "sd"
    source = tmp_path / "elsewhere"
    w = tb.SummaryWriter(str(source))
    for step in (1, 2, 3):
        w.add_scalar("loss", float(step), step, walltime=float(step))
    w.close()
    (full,) = event_files(source)
    data = full.read_bytes()
    assert spec.source.path is not None
    spec.source.path.mkdir(parents=True)
    target = spec.source.path / full.name
    target.write_bytes(data[:-7])  # the last record's tail is not on disk yet
    pump = SourcePump(spec, sd)
    assert pump.pump(now=1.0).records_added == 2
    with open(target, "ab") as f:
        f.write(data[-7:])
    assert pump.pump(now=2.0).records_added == 1
    assert [r.step for r in records(spec, sd)] == [1, 2, 3]


def test_a_restarted_pump_neither_loses_nor_duplicates_events(tmp_path: Path) -> None:
    spec = spec_from(tmp_path)
    sd = tmp_path / "sd"
    w = writer(spec)
    for step in range(5):
        w.add_scalar("loss", float(step), step, walltime=float(step))
    w.flush()
    persisted = json.loads(json.dumps(SourcePump(spec, sd).pump(now=1.0).state))
    for step in range(5, 8):
        w.add_scalar("loss", float(step), step, walltime=float(step))
    w.flush()
    SourcePump(spec, sd, persisted).pump(now=2.0)  # a new daemon: new loaders, the old events skipped
    w.add_scalar("loss", 8.0, 8, walltime=8.0)
    w.close()
    lost_state = SourcePump(spec, sd, persisted)  # and one whose last state was never persisted
    lost_state.pump(now=3.0)
    assert [r.step for r in records(spec, sd)] == list(range(9))


def test_only_non_scalar_summaries_are_evidence_for_log_unreadable(tmp_path: Path) -> None:
    spec = spec_from(tmp_path)
    sd = tmp_path / "sd"
    w = writer(spec)
    w.add_histogram("weights", numpy.arange(10.0), 1)
    w.add_text("note", "hello", 1)
    w.close()
    result = SourcePump(spec, sd).pump(now=1.0)
    assert result.records_added == 0 and result.lines_seen == 2
    message = unreadable(spec.source, result.evidence, log=records_path(spec, sd))
    assert message is not None and "2 summary values read, 0 scalar records" in message


def test_an_empty_or_missing_directory_is_a_problem_not_an_error(tmp_path: Path) -> None:
    spec = spec_from(tmp_path)
    result = SourcePump(spec, tmp_path / "sd").pump(now=1.0)
    assert result.records_added == 0 and result.problems == (f"{spec.source.path} does not exist (yet)",)


def test_without_the_tensorboard_package_the_error_names_the_extra(tmp_path: Path) -> None:
    spec = spec_from(tmp_path)
    w = writer(spec)
    w.add_scalar("loss", 1.0, 1)
    w.close()
    program = textwrap.dedent(f"""
        import sys
        sys.modules["tensorboard"] = None  # as if not installed: importing it raises ImportError
        import babysit.sources as sources
        from babysit.core.spec.run_toml import load_spec
        assert "tensorboard" not in [m for m in sys.modules if sys.modules[m] is not None]
        spec = load_spec({str(tmp_path / "run.toml")!r})
        result = sources.SourcePump(spec, {str(tmp_path / "sd")!r}).pump(now=1.0)
        print(result.problems[0])
        try:
            sources.require()
        except sources.TensorBoardMissing as exc:
            print(exc.exit_code, exc.message, "|", exc.hint)
    """)
    out = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=60, check=True)
    problem, error = out.stdout.strip().splitlines()
    assert "needs the tensorboard package" in problem and "pip install 'babysit[tensorboard]'" in problem
    assert error.startswith('2 [source] kind = "tensorboard" needs the tensorboard package')
    assert "pip install 'babysit[tensorboard]'" in error


def test_verdict_offline_reads_a_tensorboard_directory_given_with_log(tmp_path: Path, monkeypatch, capsys) -> None:
    """`babysit verdict run.toml --log DIR` for a TensorBoard [source]: said "does not exist" of a directory
    that exists; now DIR is read through the same adapter as the daemon's."""
    from babysit.cli import main

    spec = spec_from(tmp_path, RUN + textwrap.dedent("""
        [prereg]
        metric = "eval_loss"
        baseline_step = 100
        read_step = 300
        [[prereg.bands]]
        label = "HEALTHY"
        max = 0.1
        [source.metrics]
        "eval/loss" = "eval_loss"
        """))
    w = writer(spec)
    for step, value in ((100, 2.0), (200, 1.9), (300, 1.95)):
        w.add_scalar("eval/loss", value, step)
    w.close()
    elsewhere = tmp_path / "copy"
    subprocess.run(["cp", "-r", str(spec.source.path), str(elsewhere)], check=True)
    monkeypatch.chdir(tmp_path)
    assert main(["verdict", "run.toml", "--log", str(elsewhere), "--json"]) == 0
    out = capsys.readouterr()
    body = json.loads(out.out)
    assert (body["status"], body["label"], body["at_step"]) == ("FINAL", "HEALTHY", 300)
    assert body["delta"] == pytest.approx(-0.05)
    assert f"chart: {tmp_path / 'r1.verdict.png'}" in out.err, "drawn beside the directory read, not in a temp dir"
    assert main(["verdict", "run.toml"]) == 0, "without --log: [source].path"
    assert "log:       " + str(spec.source.path) in capsys.readouterr().out
    assert main(["verdict", "run.toml", "--log", str(tmp_path / "run.toml")]) == 2
    assert "expected an event directory for [source] kind = \"tensorboard\"" in capsys.readouterr().err
