"""`[source] kind = "wandb"`: a script that logs with `wandb.log` (offline mode, the real wandb) and nothing
else is read from wandb's own transaction log, values bit-equal to what it logged, at wandb's own steps
and times; and babysat end to end by the daemon, a NaN loss stopped while it runs."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from babysit.core.spec.source import parse_source
from babysit.core.spec.tomlfile import Table
from babysit.sources import wandbfile
from tests.scenarios.conftest import Daemon, kill_runs, store_of
from tests.support import register, run_toml

pytest.importorskip("wandb")
ROOT = Path(__file__).resolve().parents[2]
ENV = {"PYTHONPATH": str(ROOT), "WANDB_MODE": "offline", "WANDB_SILENT": "true", "BABYSIT_GPU_PROBE": "none"}


def source(path: Path):
    spec = parse_source(Table({"kind": "wandb"}, "run.toml", "source"), workdir=path, name="r", log=None)
    return dataclasses.replace(spec, path=path)


def log_with_wandb(tmp_path: Path, *args: str) -> Path:
    out = tmp_path / "wandb_dir"
    done = subprocess.run([sys.executable, "-m", "tests.integrations.wandb_plain", *args], cwd=tmp_path,
                          env={**os.environ, **ENV, "WANDB_DIR": str(out)}, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    return out


def test_wandb_logs_are_read_bit_equal_at_wandbs_steps_and_times(tmp_path):
    started = time.time()
    out = log_with_wandb(tmp_path, "--steps", "40", "--nan-at", "30")
    got = wandbfile.read(source(out), {})
    assert got.problems == ()
    expected = {s: 3.0 * math.exp(-s / 20) + 0.5 for s in range(5, 41, 5)}
    by_step = {i.step: i for i in got.items}
    assert sorted(by_step) == sorted(expected)
    for step, loss in expected.items():
        logged = by_step[step].metrics["train/loss"]
        assert (math.isnan(logged) and step >= 30) or logged == loss  # bit-equal: wandb keeps the repr
        assert by_step[step].metrics["lr"] == 1e-3 and "note" not in by_step[step].metrics
        assert started <= by_step[step].ts <= time.time()  # wandb's own _timestamp
    assert by_step[20].metrics["eval/loss"] == expected[20] + 0.1  # one step's calls are one record
    again = wandbfile.read(source(out), got.state)
    assert again.items == ()  # read on from where it stopped: nothing twice


def test_a_record_written_in_part_waits_for_the_rest(tmp_path):
    out = log_with_wandb(tmp_path, "--steps", "200", "--every", "1", "--sleep", "0")
    (path,) = wandbfile.run_files(out)
    data = path.read_bytes()
    whole = wandbfile.read(source(out), {})
    cut = tmp_path / "cut" / "wandb" / "offline-run-x" / "run-x.wandb"
    cut.parent.mkdir(parents=True)
    state: dict = {}
    items = []
    for end in [*range(0, len(data), 997), len(data)]:  # grows in odd pieces, across 32 KiB blocks
        cut.write_bytes(data[:end])
        got = wandbfile.read(source(tmp_path / "cut"), state)
        assert got.problems == ()
        state, items = got.state, items + list(got.items)
    assert [(i.step, dict(i.metrics)) for i in items] == [(i.step, dict(i.metrics)) for i in whole.items]
    assert len(data) > 32768 and len(items) == 200


def test_a_file_that_is_not_wandbs_is_said_not_read(tmp_path):
    bad = tmp_path / "wandb" / "run-x" / "run-x.wandb"
    bad.parent.mkdir(parents=True)
    bad.write_bytes(b"not a wandb file at all")
    got = wandbfile.read(source(tmp_path), {})
    assert got.items == () and "not a wandb transaction log" in got.problems[0]


@pytest.mark.slow
def test_the_daemon_babysits_a_wandb_script_and_stops_its_nan_live(tmp_path):
    command = [sys.executable, "-m", "tests.integrations.wandb_plain", "--steps", "100000", "--nan-at", "60",
               "--sleep", "0.02"]
    spec = run_toml("wb", command, env={"WANDB_MODE": "offline", "WANDB_SILENT": "true", "PYTHONPATH": str(ROOT)},
                    source={"kind": "wandb"}, guards={"min_free_host_ram_gib": 0.1, "stop_grace_seconds": 5},
                    retry={"max_attempts": 1})
    try:
        register(tmp_path, spec, env=ENV)
        daemon = Daemon(tmp_path, "--exit-when-idle", "--no-view", env=ENV)
        assert daemon.wait(timeout=180) == 0, daemon.output()
    finally:
        kill_runs(tmp_path)
    (attempt,) = store_of(tmp_path).attempts("wb")
    assert attempt.outcome == "diverged", attempt
    records = [json.loads(x) for x in (tmp_path / ".babysit" / "runs" / "wb" / "records.jsonl").read_text()
               .splitlines()]
    assert [r["train/loss"] for r in records if r["step"] == 5] == [3.0 * math.exp(-5 / 20) + 0.5]
    assert (tmp_path / "outputs" / "wb" / "wandb").is_dir()  # $WANDB_DIR: what this run alone writes
