"""`babysit run -- CMD`: an unmodified trainer babysat in the foreground with no run.toml and no regex,
its end said as an exit code (0 completed, 3 diverged, 5 stopped, …), Ctrl-C meaning what it says, with
and without a `babysit up`; and an unmodified word_language_model printer read to a FINAL verdict."""

from __future__ import annotations

import json
import math
import os
import re
import shlex
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from babysit.core.spec import adhoc
from babysit.view import runview
from tests.scenarios.conftest import Daemon, babysit, store_of
from tests.scenarios.test_live_view import Terminal
from tests.support import TRAIN_LOG, register, run_toml, wait_for

PY = sys.executable
ROOT = Path(__file__).resolve().parents[2]
ENV = {"BABYSIT_GPU_PROBE": "none", "PYTHONPATH": str(ROOT)}
NANOGPT = [PY, "-m", "babysit.demo.nanogpt_like"]


def start(root: Path, *cmd: str, name: str = "nano", extra: tuple[str, ...] = ()) -> subprocess.Popen:
    return subprocess.Popen([PY, "-m", "babysit", "run", "--accelerated", "--no-view", "--name", name, *extra,
                             "--registry", str(root / "babysit.toml"), "--", *cmd], cwd=root,
                            env={**os.environ, **ENV}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def finish(proc: subprocess.Popen, timeout: float = 120) -> tuple[int, str]:
    out, _ = proc.communicate(timeout=timeout)
    return proc.returncode, out


def wait_running(root: Path) -> None:
    """Until run `nano`'s attempt runs, and a second more: a stop then finds the trainer printing."""
    wait_for("the run launched", lambda: (root / ".babysit" / "state.db").exists()
             and any(a.status == "running" for a in store_of(root).attempts("nano")))
    time.sleep(1.0)


def channel(root: Path, kind: str | None = None) -> list[dict]:
    path = root / ".babysit" / "channel.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    return [r for r in rows if kind is None or r["kind"] == kind]


def test_an_unmodified_nanogpt_is_babysat_with_no_run_toml_and_exits_0(workspace: Path) -> None:
    code, out = finish(start(workspace, *NANOGPT, "--iters", "400", "--eval-every", "100", "--sleep", "0.02"))
    assert code == adhoc.EXIT_COMPLETED, out
    spec = workspace / ".babysit" / "adhoc" / "nano.toml"  # under the state directory: no ./runs/ litter
    assert f"its run.toml is {spec}" in out and 'preset = "auto"' in spec.read_text()
    assert not (workspace / "runs").exists()
    assert "iter 399: loss" in out  # its stdout passed through
    assert 'read by preset "nanogpt": reading step 0: val_loss=5.05' in out
    polls = channel(workspace, "poll")
    assert polls, out
    first = polls[0]["text"]
    assert "s/step" in first and "train_loss=" in first and 'preset "nanogpt"' in first
    assert store_of(workspace).incidents("nano") == []  # no false incident
    records = [json.loads(x) for x in (workspace / ".babysit" / "runs" / "nano" / "records.jsonl").read_text()
               .splitlines()]
    assert {r["step"] for r in records if "train_loss" in r} == set(range(401))
    assert [r["val_loss"] for r in records if "val_loss" in r][:1] == [5.05]
    # the spec it wrote registers as it is, under another name: the file is the user's to edit
    # its end names the spec by its whole path and the registry it is in, so the hint works from any folder
    assert f"its run.toml: {spec} —" in out and f"babysit register COPY --registry {workspace / 'babysit.toml'}" in out
    (workspace / "nano2.toml").write_text(spec.read_text().replace('name = "nano"', 'name = "nano2"'))
    assert babysit("register", str(workspace / "nano2.toml"), "--registry", str(workspace / "babysit.toml"),
                   cwd=workspace).returncode == 0


def test_a_nan_run_is_stopped_while_alive_and_exits_diverged(workspace: Path) -> None:
    started = time.monotonic()
    code, out = finish(start(workspace, *NANOGPT, "--iters", "100000", "--nan-at", "60", "--sleep", "0.02"))
    assert code == adhoc.EXIT_DIVERGED, out
    assert time.monotonic() - started < 60  # 100,000 iterations would take half an hour: it was stopped
    assert "saving checkpoint to out" in out  # the stop signal reached it while it ran
    (attempt,) = store_of(workspace).attempts("nano")
    assert attempt.outcome == "diverged"


def test_ctrl_c_stops_the_run_gracefully_and_exits_stopped(workspace: Path) -> None:
    proc = start(workspace, *NANOGPT, "--iters", "100000", "--sleep", "0.02")
    wait_running(workspace)
    proc.send_signal(signal.SIGINT)
    code, out = finish(proc)
    assert code == adhoc.EXIT_STOPPED, out
    assert "stopping nano gracefully" in out and "saving checkpoint to out" in out
    assert "stopped on request" in out


@pytest.mark.slow
def test_a_second_ctrl_c_kills_a_run_that_does_not_stop(workspace: Path) -> None:
    stubborn = [PY, "-c", "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
                "for i in range(100000):\n    print(f'iter {i}: loss 1.0, time 1.00ms, mfu 1.00%', flush=True)\n"
                "    time.sleep(0.02)\n"]
    proc = start(workspace, *stubborn)
    wait_running(workspace)
    proc.send_signal(signal.SIGINT)
    time.sleep(1.0)
    started = time.monotonic()
    proc.send_signal(signal.SIGINT)
    code, out = finish(proc)
    assert code == adhoc.EXIT_STOPPED, out
    assert time.monotonic() - started < 30  # not the 120-s grace period: killed at once
    assert "killing nano" in out


@pytest.mark.slow
def test_with_babysit_up_running_the_daemon_takes_it_and_babysit_run_follows(workspace: Path) -> None:
    registry = workspace / "babysit.toml"
    registry.write_text("")
    daemon = Daemon(workspace, "--no-view", env=ENV)
    try:
        lock = workspace / ".babysit" / "daemon.lock"
        wait_for("the daemon up", lambda: lock.exists() and lock.read_text().strip())
        code, out = finish(start(workspace, *NANOGPT, "--iters", "300", "--sleep", "0.02"))
        assert code == adhoc.EXIT_COMPLETED, out
        assert "babysits nano; following it here" in out
        assert "iter 299: loss" in out  # its output, passed through from the captured files
        assert "attempt 1/1 launched" in out  # the daemon's messages, read from the outbox
        assert daemon.proc.poll() is None  # the daemon goes on
    finally:
        daemon.proc.send_signal(signal.SIGINT)
        daemon.wait(timeout=30)


SHAPES = [PY, "-m", "babysit.demo.printed_shapes"]


@pytest.mark.parametrize("shape, steps", [
    ("pipes", list(range(10, 301, 10))),
    ("epoch-batch", [e * 100 + b for e in range(3) for b in range(10, 101, 10)]),
    ("keras", [100, 200, 300]),
    ("tqdm", [e * 100 + b for e in range(3) for b in range(10, 101, 10)]),
])
def test_a_script_of_your_own_is_read_with_no_flag(workspace: Path, shape: str, steps: list[int]) -> None:
    """Hand-written printers in the shapes people print, under `babysit run` with no flag: the right steps
    (a per-epoch counter counted on across epochs) and losses, and the answer about reading said early."""
    code, out = finish(start(workspace, *SHAPES, "--shape", shape, "--steps", "300", "--every", "10",
                             "--sleep", "0.002"))
    assert code == adhoc.EXIT_COMPLETED, out
    assert "read by the general reader (docs/your-trainer.md): reading step" in out
    records = [json.loads(x) for x in (workspace / ".babysit" / "runs" / "nano" / "records.jsonl").read_text()
               .splitlines()]
    assert [r["step"] for r in records] == steps
    assert all("loss" in r for r in records)
    assert records[-1]["loss"] == pytest.approx(2.0 * math.exp(-300 / 150) + 0.1, abs=1e-4)
    assert "no record was read" not in out and store_of(workspace).incidents("nano") == []


@pytest.mark.parametrize("shape", ["pipes", "epoch-batch"])
def test_a_nan_printed_in_a_general_shape_stops_the_run_and_exits_3_without_a_retry(workspace: Path,
                                                                                     shape: str) -> None:
    """--retry-on diverged with no [[attempts]]: the identical command would diverge again, so no retry."""
    code, out = finish(start(workspace, *SHAPES, "--shape", shape, "--steps", "100000", "--nan-at", "120",
                             "--sleep", "0.01", extra=("--retry-on", "diverged")))
    assert code == adhoc.EXIT_DIVERGED, out
    assert "after the first nan line" in out  # the stop reached it while it ran
    (attempt,) = store_of(workspace).attempts("nano")
    assert attempt.outcome == "diverged"
    assert "identical command" in out and "retried per retry.on" not in out


def test_an_unreadable_script_says_so_early_and_at_its_end(workspace: Path) -> None:
    code, out = finish(start(workspace, *SHAPES, "--shape", "no-step", "--steps", "300", "--every", "10",
                             "--sleep", "0.01"))
    assert code == adhoc.EXIT_COMPLETED, out
    early = out.index("nothing reads its printed lines yet")
    assert early < out.index("done\n")  # said while it ran, not at its end
    assert "A line: 'loss " in out and "It shows no step counter" in out
    assert "ended with no record read" in out  # the incident at its end
    assert "no record was read from its output" in out  # beside the outcome
    (incident,) = store_of(workspace).incidents("nano")
    assert incident.kind == "log-unreadable"
    status = babysit("status", "--registry", str(workspace / "babysit.toml"), cwd=workspace, env=ENV).stdout
    assert "no printed line gave a record" in status and "once enough lines are in" not in status


def test_an_unknown_format_is_answered_with_a_pattern_and_the_command_that_uses_it(workspace: Path) -> None:
    (workspace / "upd.py").write_text("import time\nfor i in range(1, 40):\n    print(f'upd {i * 10} "
                                      "loss={1 / i:.4f}', flush=True)\n    time.sleep(0.01)\n")
    printer = [PY, "upd.py"]
    code, out = finish(start(workspace, *printer))
    assert code == adhoc.EXIT_COMPLETED, out
    assert "A pattern that would read it:" in out and "babysit run --pattern " in out
    command = out.split("or run again with: ")[1].splitlines()[0]
    pattern = shlex.split(command)[3]
    again = start(workspace, *printer, name="nano2", extra=("--pattern", pattern))
    code, out = finish(again)
    assert code == adhoc.EXIT_COMPLETED, out
    assert "read by its [[source.patterns]]: reading step 10: loss=1" in out


def test_a_refused_run_leaves_no_file_behind(workspace: Path) -> None:
    for _ in range(2):
        res = babysit("run", "--registry", str(workspace / "babysit.toml"), "--", "pythn", "train.py",
                      cwd=workspace, env=ENV)
        assert res.returncode == 2 and "did you mean 'python" in res.stderr
    assert not (workspace / "runs").exists()
    assert list((workspace / ".babysit" / "adhoc").glob("*.toml")) == [] if (workspace / ".babysit").exists() else True


@pytest.mark.parametrize("args, wanted", [
    ([], "no command"), (["--gpus", "a", "--", "true"], "--gpus"), (["--retry-on", "oops", "--", "true"], "oops"),
    (["--name", "Bad Name", "--", "true"], "--name")])
def test_bad_input_exits_2_and_says_what_to_do(workspace: Path, args: list[str], wanted: str) -> None:
    res = babysit("run", "--registry", str(workspace / "babysit.toml"), *args, cwd=workspace, env=ENV)
    assert res.returncode == 2 and wanted in res.stderr and "HINT:" in res.stderr


@pytest.mark.slow
def test_word_language_model_is_read_to_a_final_verdict_with_its_pace(workspace: Path) -> None:
    """pytorch/examples word_language_model's printed lines (babysit/demo/word_language_model_like.py, its
    print formats at commit 0f4dca7d), unchanged: the batch counter restarts every epoch and the valid
    loss has no batch, so the preset computes global steps; the verdict reads valid_loss between epochs."""
    nbatches = 200
    command = [PY, "-m", "babysit.demo.word_language_model_like", "--epochs", "2", "--nbatches", str(nbatches),
               "--log-interval", "20", "--batch-seconds", "0.02"]
    register(workspace, run_toml(
        "wlm", command, run={"total_steps": 2 * nbatches}, guards={"min_free_host_ram_gib": 0.1},
        source={"kind": "stdout", "preset": "word_language_model"},
        prereg={"question": "Does valid loss fall by at least 0.5 between epochs 1 and 2?", "metric": "valid_loss",
                "baseline_step": nbatches, "read_step": 2 * nbatches, "precision": 2,
                "bands": [{"label": "LEARNING", "max": -0.5}], "otherwise": {"label": "FLAT"}}), env=ENV)
    daemon = Daemon(workspace, "--exit-when-idle", "--no-view", env=ENV)
    assert daemon.wait(timeout=120) == 0, daemon.output()
    final = store_of(workspace).final_verdict("wlm")
    assert final is not None and final.body["status"] == "FINAL", final
    assert final.body["label"] == "LEARNING"
    assert final.body["baseline"] == pytest.approx(7.0 * 2.71828 ** (-nbatches / 150) + 4.8, abs=0.01), final.body
    printed = [float(line.split("ms/batch")[1].split("|")[0]) for line in
               (workspace / ".babysit" / "runs" / "wlm" / "attempt-1" / "stdout.log").read_text().splitlines()
               if "ms/batch" in line]
    (row,) = runview.collect(workspace / "babysit.toml", ["wlm"])
    ms_per_batch = sum(printed) / len(printed)
    assert row.seconds_per_step is not None
    assert abs(row.seconds_per_step * 1000 - ms_per_batch) / ms_per_batch < 0.2, (row.seconds_per_step, printed)
    assert store_of(workspace).incidents("wlm") == []


def test_a_run_with_no_source_whose_log_stays_empty_is_told_which_preset_reads_its_lines(workspace: Path) -> None:
    # its log is never written: it prints nanoGPT's lines
    register(workspace, run_toml("plain", [*NANOGPT, "--iters", "200", "--sleep", "0.02"], log=TRAIN_LOG,
                                 guards={"min_free_host_ram_gib": 0.1}, tables={"poll": {"first_after_minutes": 2}}),
             env=ENV)
    daemon = Daemon(workspace, "--exit-when-idle", "--no-view", env=ENV)
    assert daemon.wait(timeout=120) == 0, daemon.output()
    (first,) = [p for p in channel(workspace, "poll") if "first poll" in p["text"]]
    assert 'its printed lines match preset "nanogpt"' in first["text"]
    assert '[source] kind = "stdout", preset = "nanogpt"' in first["text"]
    status = babysit("status", "--registry", str(workspace / "babysit.toml"), cwd=workspace, env=ENV)
    assert 'plain: no record in its log ($BABYSIT_LOG) yet, but its printed lines match preset "nanogpt"' \
        in status.stdout


def test_a_computed_step_that_goes_backwards_is_an_incident_once_with_the_line(workspace: Path) -> None:
    printer = [PY, "-c", "import time\nfor epoch in range(3):\n    for b in (10, 20, 30):\n"
               "        print(f'batch {b} loss {1.0 / (b + epoch):.4f}', flush=True)\n        time.sleep(0.2)\n"]
    register(workspace, run_toml("reset", printer, guards={"min_free_host_ram_gib": 0.1}, source={
        "kind": "stdout", "patterns": [{"regex": r"batch (?P<batch>\d+) loss (?P<loss>[-+.\w]+)", "step": "batch"}]}),
             env=ENV)
    daemon = Daemon(workspace, "--exit-when-idle", "--no-view", env=ENV)
    assert daemon.wait(timeout=120) == 0, daemon.output()
    incidents = [r for r in channel(workspace, "incident") if "step-backwards" in r["text"]]
    assert len(incidents) == 1, channel(workspace, "incident")
    assert "30 → 10" in incidents[0]["text"] and "batch 10 loss" in incidents[0]["text"]
    records = [json.loads(x) for x in (workspace / ".babysit" / "runs" / "reset" / "records.jsonl").read_text()
               .splitlines()]
    assert [r["step"] for r in records] == [10, 20, 30] * 3  # kept as computed, in the order printed


@pytest.mark.slow
def test_on_a_terminal_its_row_is_live_its_output_above_and_a_keyboard_ctrl_c_stops_it(workspace: Path) -> None:
    term = Terminal([PY, "-m", "babysit", "run", "--accelerated", "--gpu-probe", "none", "--name", "tty",
                     "--registry", str(workspace / "babysit.toml"), "--", *NANOGPT, "--iters", "100000",
                     "--sleep", "0.02"], workspace)
    term.wait_for("the run's live row", lambda text: re.search(r"tty\s+running\s+1/1 default\s+\d+", text), 60)
    term.wait_for("its output above the table", lambda text: "iter 40: loss" in text, 60)
    term.ctrl_c()  # the terminal's line discipline: SIGINT to babysit run (the trainer has a session of its own)
    code = term.wait(90)
    assert code == adhoc.EXIT_STOPPED, term.text[-3000:]
    assert "stopping tty gracefully" in term.text and "saving checkpoint to out" in term.text


def test_a_sigterm_to_babysit_run_is_named_so_not_ctrl_c(workspace: Path) -> None:
    proc = start(workspace, *NANOGPT, "--iters", "100000", "--sleep", "0.02")
    wait_running(workspace)
    proc.send_signal(signal.SIGTERM)
    code, out = finish(proc)
    assert code == adhoc.EXIT_STOPPED, out
    assert "SIGTERM: stopping nano gracefully" in out and "Ctrl-C:" not in out.split("SIGTERM")[1]
    with sqlite3.connect(workspace / ".babysit" / "state.db") as db:
        asked = [by for (by,) in db.execute("SELECT requested_by FROM control WHERE run = 'nano'")]
    assert asked == ["babysit run (SIGTERM)"]


def test_on_a_terminal_an_incident_prints_once_not_again_as_a_log_line(workspace: Path) -> None:
    term = Terminal([PY, "-m", "babysit", "run", "--accelerated", "--gpu-probe", "none", "--name", "tty",
                     "--registry", str(workspace / "babysit.toml"), "--", *SHAPES, "--nan-at", "60",
                     "--steps", "100000", "--sleep", "0.01"], workspace)
    code = term.wait(90)
    assert code == adhoc.EXIT_DIVERGED, term.text[-3000:]
    plain = re.sub(r"\x1b\[[0-9;?]*[ -/]*[@-~]", "", term.text)
    assert plain.count("loss = nan at step 60 — stopping the run") == 1, plain[-3000:]


def test_records_that_stop_while_the_output_goes_on_are_said(workspace: Path) -> None:
    """20 records, then 700 lines of another shape over ~7 s (past 500 lines and 5 declared minutes, which
    --accelerated makes 5 s): a log-unreadable incident says the records stopped, the run goes on."""
    (workspace / "drift.py").write_text(
        "import time\nfor i in range(1, 21):\n    print(f'step {i} | loss {1 / i:.4f}', flush=True)\n"
        "for i in range(700):\n    print(f'phase two: item {i} done', flush=True)\n    time.sleep(0.01)\n")
    code, out = finish(start(workspace, PY, "drift.py"))
    assert code == adhoc.EXIT_COMPLETED, out
    (incident,) = [i for i in store_of(workspace).incidents("nano") if i.kind == "log-unreadable"]
    assert incident.body["last_step"] == 20 and incident.body["lines_since_record"] >= 500, incident.body
    assert "its output goes on but gives no record" in out
