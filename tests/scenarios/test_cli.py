"""The CLI as a user runs it: register, status, the daemon's signals, the demo."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import pytest

from tests.scenarios.conftest import Daemon, babysit, kill_runs, pid_alive, store_of, tiny_run, wait_for

PREREG_FIXTURE = """
[prereg]
metric = "eval_chunk_mae"
baseline_step = 2
read_step = 4
[[prereg.bands]]
label = "HEALTHY"
max = 0.1
[prereg.fixture]
log = "fixture.jsonl"
expect_delta = {delta}
expect_label = "HEALTHY"
"""


def fixture_log(root: Path) -> None:
    lines = [{"step": 2, "ts": 1.0, "eval_chunk_mae": 1.0}, {"step": 4, "ts": 2.0, "eval_chunk_mae": 1.05}]
    (root / "fixture.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))


def test_help_lists_every_command_quickly(tmp_path: Path) -> None:
    res = babysit("--help", cwd=tmp_path)
    assert res.returncode == 0
    for command in ("register", "up", "status", "verdict", "amend", "prereg", "abort", "smoke", "bot", "demo"):
        assert command in res.stdout


def test_register_is_idempotent_and_a_refusal_leaves_the_registry_byte_identical(tmp_path: Path) -> None:
    reg = tmp_path / "babysit.toml"
    spec = tiny_run(tmp_path, "reg_ok", steps=10)
    first = babysit("register", str(spec), "--accelerated", "--registry", str(reg), cwd=tmp_path)
    assert first.returncode == 0 and first.stdout.startswith("added: reg_ok")
    before = reg.read_bytes()
    again = babysit("register", str(spec), "--accelerated", "--registry", str(reg), cwd=tmp_path)
    assert again.returncode == 0 and again.stdout.startswith("unchanged: reg_ok")
    assert reg.read_bytes() == before

    bad = tmp_path / "bad.toml"
    bad.write_text(spec.read_text().replace("[guards]", "[guards]\ngpu_hours_cap = -1"))
    res = babysit("register", str(bad), "--accelerated", "--registry", str(reg), cwd=tmp_path)
    assert res.returncode == 2
    assert res.stderr.startswith(f"ERROR: {bad}: guards.gpu_hours_cap: expected a positive number, got -1")
    assert reg.read_bytes() == before

    slow = babysit("register", str(spec), "--registry", str(reg), cwd=tmp_path)  # cadence 3 min, no --accelerated
    assert slow.returncode == 2 and "poll.every_minutes: expected a number >= 30" in slow.stderr
    assert "HINT:" in slow.stderr and reg.read_bytes() == before


def test_a_changed_prereg_under_the_same_name_is_refused(tmp_path: Path) -> None:
    reg = tmp_path / "babysit.toml"
    fixture_log(tmp_path)
    spec = tiny_run(tmp_path, "frozen", steps=10, extra=PREREG_FIXTURE.format(delta=0.05))
    assert babysit("register", str(spec), "--accelerated", "--registry", str(reg), cwd=tmp_path).returncode == 0
    before = reg.read_bytes()
    spec.write_text(spec.read_text().replace("max = 0.1", "max = 0.2"))
    res = babysit("register", str(spec), "--accelerated", "--registry", str(reg), cwd=tmp_path)
    assert res.returncode == 2 and "different experiment needs a different name" in res.stderr
    assert reg.read_bytes() == before
    show = babysit("prereg", "show", "frozen", "--registry", str(reg), cwd=tmp_path)
    assert show.returncode == 1 and "TAMPERED" in show.stdout
    registered = show.stdout.split("AS REGISTERED")[1]
    assert '"max": 0.1' in registered and '"max": 0.2' not in registered


def test_a_fixture_the_instrument_does_not_reproduce_fails_register_with_both_numbers(tmp_path: Path) -> None:
    reg = tmp_path / "babysit.toml"
    fixture_log(tmp_path)
    spec = tiny_run(tmp_path, "fixture_bad", steps=10, extra=PREREG_FIXTURE.format(delta=0.07))
    res = babysit("register", str(spec), "--accelerated", "--registry", str(reg), cwd=tmp_path)
    assert res.returncode == 1
    assert "0.07" in res.stderr and "0.05" in res.stderr
    assert not reg.exists()


def test_sigterm_stops_the_daemon_not_the_run_and_status_reports_it(tmp_path: Path) -> None:
    spec = tiny_run(tmp_path, "keeps_running", steps=100000)
    assert babysit("register", str(spec), "--accelerated", "--registry", str(tmp_path / "babysit.toml"),
                   cwd=tmp_path).returncode == 0
    daemon = Daemon(tmp_path)
    store = store_of(tmp_path)
    wait_for(lambda: (store.run_state("keeps_running")[1].get("step") or 0) >= 5, 90, "progress")
    daemon.proc.send_signal(signal.SIGTERM)
    assert daemon.wait(timeout=30) == 0
    (attempt,) = store.attempts("keeps_running")
    assert pid_alive(attempt.pid), "stopping the daemon never stops the run"
    res = babysit("status", "keeps_running", "--json", "--registry", str(tmp_path / "babysit.toml"), cwd=tmp_path)
    row = json.loads(res.stdout)
    assert (row["run"], row["status"], row["attempt"]) == ("keeps_running", "running", 1)
    table = babysit("status", "--registry", str(tmp_path / "babysit.toml"), cwd=tmp_path)
    assert table.returncode == 0 and "keeps_running" in table.stdout
    unknown = babysit("status", "keeps_runing", "--registry", str(tmp_path / "babysit.toml"), cwd=tmp_path)
    assert unknown.returncode == 2 and "did you mean 'keeps_running'" in unknown.stderr
    import os
    os.killpg(attempt.pid, signal.SIGKILL)
    time.sleep(0.2)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_demo_babysits_to_a_final_verdict(tmp_path: Path) -> None:
    try:
        res = babysit("demo", "--dir", str(tmp_path / "ws"), cwd=tmp_path, timeout=800)
    finally:  # a demo cut short leaves its trainers running (runs outlive daemons): not in a test
        kill_runs(tmp_path / "ws")
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    verdict = json.loads((tmp_path / "ws" / ".babysit" / "verdicts" / "drift_disc.json").read_text())
    assert verdict["status"] == "FINAL" and verdict["read_step"] == 1000
    assert verdict["label"] == "AMBIGUOUS-BY-INSTRUMENT"  # the raw rule says SAME-DRIFT, the ×2.5 one AMBIGUOUS
    assert [r["label"] for r in verdict["rules"]] == ["SAME-DRIFT", "AMBIGUOUS"]
    (amendment,) = verdict["amendments"]
    assert 250 <= amendment["data_seen_through_step"] < 500, "declared before the data it touches"
    assert (tmp_path / "ws" / ".babysit" / "verdicts" / "drift_disc.png").stat().st_size > 10_000
    for text in ("diverged", "retrying", "FINAL", "amendment 1 recorded"):
        assert text in res.stdout
