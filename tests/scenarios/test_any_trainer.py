"""babysit babysits a trainer it did not write, unchanged: nanoGPT-format stdout read with patterns only."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from tests.scenarios.conftest import Daemon, babysit, store_of
from tests.support import register, run_toml, stdout_source

TRAINER = "babysit.demo.nanogpt_like"  # nanoGPT's printed lines, no babysit code
PATTERNS = (r"iter (?P<step>\d+): loss (?P<train_loss>\S+), time (?P<ms>[\d.]+)ms",
            r"step (?P<step>\d+): train loss \S+, val loss (?P<val_loss>\S+)")


def register_run(root: Path, name: str, *, attempts: list[list[str]], patterns: tuple[str, ...] = PATTERNS,
                 prereg: dict | None = None) -> None:
    register(root, run_toml(name, [sys.executable, "-m", TRAINER], run={"total_steps": 60},
                            source=stdout_source(*patterns), poll=(1, 1), retry={"on": ["diverged"]},
                            guards={"min_free_host_ram_gib": 0.1, "stop_grace_seconds": 10},
                            attempts={f"p{i + 1}": a for i, a in enumerate(attempts)}, prereg=prereg))


def run_daemon(root: Path) -> None:
    daemon = Daemon(root, "--exit-when-idle", "--no-view")
    assert daemon.wait(timeout=120) == 0, daemon.output()


def test_a_nanogpt_stdout_trainer_gets_polls_with_pace_eta_and_its_metrics(workspace: Path) -> None:
    register_run(workspace, "nano", attempts=[["--iters", "60", "--sleep", "0.05"]])
    run_daemon(workspace)
    store = store_of(workspace)
    (attempt,) = store.attempts("nano")
    assert attempt.outcome == "completed"
    polls = [p.snapshot for p in store.polls("nano", 50)]
    assert polls, "polled"
    paced = [p for p in polls if p.seconds_per_step]
    assert paced and all(0.02 < (p.seconds_per_step or 0) < 0.5 for p in paced), [p.seconds_per_step for p in paced]
    assert any(p.eta_seconds is not None and p.target_step == 60 for p in paced)
    shown = polls[0].shown_metrics or {}
    assert "train_loss" in shown and "val_loss" in shown, shown
    records = [json.loads(line) for line in (workspace / ".babysit" / "runs" / "nano" / "records.jsonl")
               .read_text().splitlines()]
    assert [r["step"] for r in records if "val_loss" in r] == [0, 20, 40, 60]
    assert not [i for i in store.incidents("nano") if i.kind in ("stalled", "log-unreadable")]


def test_its_nan_twin_is_stopped_as_diverged_while_alive_and_retried(workspace: Path) -> None:
    register_run(workspace, "nano_nan", attempts=[["--iters", "100000", "--nan-at", "15"], ["--iters", "40"]])
    run_daemon(workspace)
    store = store_of(workspace)
    first, second = store.attempts("nano_nan")
    assert first.outcome == "diverged", first.detail
    assert first.detail.get("nonfinite") == "train_loss = nan at step 15"
    assert second.outcome == "completed"
    live = [i for i in store.incidents("nano_nan") if i.kind == "diverged" and i.body.get("metric")]
    assert live, "the live guard stopped it (the trainer itself would run on to iteration 100000)"
    assert (live[0].body["metric"], live[0].body["step"]) == ("train_loss", 15)
    assert store.run_state("nano_nan")[0] == "finished"


def test_a_nan_run_that_exits_0_is_never_completed(workspace: Path) -> None:
    register_run(workspace, "nano_nan0", attempts=[["--iters", "30", "--nan-at", "25", "--sleep", "0.001"]])
    run_daemon(workspace)
    store = store_of(workspace)
    attempts = store.attempts("nano_nan0")
    assert [a.outcome for a in attempts] == ["diverged"], [a.detail for a in attempts]  # never clean
    status, facts = store.run_state("nano_nan0")
    assert status == "failed" and "identical command" in facts["end_reason"]  # its one profile: not run again


def test_nanogpts_default_preamble_and_its_compile_raise_no_incident(workspace: Path) -> None:
    """nanoGPT prints ~50 lines (its config file, vocab size, parameter counts, fused AdamW, "compiling the
    model…") and compiles for a minute before its first `iter` line: babysit called that log-unreadable."""
    register_run(workspace, "nano_pre", attempts=[["--iters", "40", "--sleep", "0.02", "--compile-seconds", "3"]])
    run_daemon(workspace)
    store = store_of(workspace)
    (attempt,) = store.attempts("nano_pre")
    assert attempt.outcome == "completed"
    assert len(store.polls("nano_pre", 50)) >= 2, "polled during the preamble (1 s a declared minute)"
    assert not [(i.kind, i.body) for i in store.incidents("nano_pre") if i.kind in ("stalled", "log-unreadable")]


def test_patterns_that_match_nothing_raise_log_unreadable_and_the_run_goes_on(workspace: Path) -> None:
    wrong = tuple(p.replace("iter (?P<step>", "iteration (?P<step>").replace("step (?P<step>", "epoch (?P<step>")
                  for p in PATTERNS)
    # 150 lines over ~8 s: past both thresholds (100 lines, 5 declared minutes = 5 s under --accelerated)
    register_run(workspace, "nano_wrong", patterns=wrong, attempts=[["--iters", "150", "--sleep", "0.05"]])
    run_daemon(workspace)
    store = store_of(workspace)
    (attempt,) = store.attempts("nano_wrong")
    assert attempt.outcome == "completed"
    (incident,) = [i for i in store.incidents("nano_wrong") if i.kind == "log-unreadable"]
    assert incident.body["records_parsed"] == 0 and incident.body["lines_seen"] >= 100
    assert 5 <= incident.body["waited_seconds"] < 30  # real seconds, not the declared minutes shown as 5m
    posted = [m for m in map(json.loads, (workspace / ".babysit" / "channel.jsonl").read_text().splitlines())
              if m.get("kind") == "incident" and "log-unreadable" in json.dumps(m)]
    text = json.dumps(posted)
    assert "0 records parsed" in text and "iteration (?P<step>" in text and "not stopped" in text
    assert "babysit waited " in text and "s after the first line of output and saw " in text
    assert not [i for i in store.incidents("nano_wrong") if i.kind == "stalled"]


PREREG = {"question": "Does val loss fall between iterations 20 and 60?", "metric": "val_loss", "baseline_step": 20,
          "read_step": 60, "bands": [{"label": "IMPROVES", "max": 0.0}], "otherwise": {"label": "FLAT-OR-WORSE"}}


def test_the_frozen_verdict_reads_the_values_the_trainer_printed(workspace: Path) -> None:
    register_run(workspace, "nano_read", prereg=PREREG, attempts=[["--iters", "60", "--sleep", "0.01"]])
    run_daemon(workspace)
    out = babysit("verdict", "nano_read", "--json", "--registry", str(workspace / "babysit.toml"), cwd=workspace)
    assert out.returncode == 0, out.stderr
    verdict = json.loads(out.stdout)
    printed = {}
    stdout = (workspace / ".babysit" / "runs" / "nano_read" / "attempt-1" / "stdout.log").read_text()
    for line in stdout.splitlines():
        if line.startswith("step "):
            step, rest = line[5:].split(":", 1)
            printed[int(step)] = float(rest.rsplit("val loss ", 1)[1])
    assert verdict["status"] == "FINAL" and verdict["label"] == "IMPROVES"
    assert abs(verdict["delta"] - (printed[60] - printed[20])) < 1e-9, (verdict, printed)
