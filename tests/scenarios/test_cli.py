"""The CLI as a user runs it: register, status, the daemon's signals (the demo: test_demo.py)."""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import io
import json
import signal
import time
from datetime import datetime, timezone
from pathlib import Path

import pytest

from babysit.cli import build_parser, main
from tests.scenarios.conftest import Daemon, babysit, pid_alive, store_of, tiny_run
from tests.support import wait_for

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
    wait_for("progress", lambda: (store.run_state("keeps_running")[1].get("step") or 0) >= 5, 90)
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


def run_cli(*argv: str) -> tuple[int, str, str]:
    """The CLI in-process, as `babysit` runs it (faster than a subprocess for the many small cases)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(argv))
    return code, out.getvalue(), err.getvalue()


def test_version_prints_the_installed_package_version(tmp_path: Path) -> None:
    res = babysit("--version", cwd=tmp_path)
    assert res.returncode == 0 and res.stdout == f"babysit {importlib.metadata.version('babysit')}\n"


def test_every_command_says_what_it_does_in_the_help(tmp_path: Path) -> None:
    """`babysit --help` has a line for every command, and every command (and `prereg show`) a description
    and a help text for each positional argument."""
    def walk(parser: argparse.ArgumentParser, path: str) -> list[str]:
        missing = []
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for choice in action._choices_actions:
                    if not choice.help:
                        missing.append(f"{path} {choice.dest}: no line in {path} --help")
                for name, sub in action.choices.items():
                    if not sub.description:
                        missing.append(f"{path} {name}: no description")
                    missing += walk(sub, f"{path} {name}")
            elif not action.option_strings and not action.help:
                missing.append(f"{path} {action.metavar or action.dest}: positional without help")
        return missing

    assert walk(build_parser(), "babysit") == []
    listing = babysit("--help", cwd=tmp_path).stdout
    assert "--version" in listing and "--registry PATH" in listing


def test_the_global_registry_option_goes_before_or_after_the_command(tmp_path: Path) -> None:
    reg = tmp_path / "elsewhere" / "babysit.toml"
    reg.parent.mkdir()
    spec = tiny_run(tmp_path, "global_opt", steps=10)
    assert run_cli("--registry", str(reg), "register", str(spec), "--accelerated")[0] == 0
    for argv in (("--registry", str(reg), "status"), ("status", "--registry", str(reg))):
        code, out, _ = run_cli(*argv)
        assert code == 0 and "global_opt" in out, argv
    code, out, _ = run_cli("--registry", str(reg), "prereg", "show", "global_opt")
    assert code == 0 and "run:            global_opt" in out
    code, out, _ = run_cli("--registry", str(tmp_path / "none.toml"), "status", "--registry", str(reg))
    assert code == 0 and "global_opt" in out, "the command's own --registry wins"
    code, _, err = run_cli("--registry", str(reg), "demo")
    assert code == 2 and err.startswith("ERROR: --registry: `babysit demo` does not read a registry\nHINT: ")


def test_re_registering_an_edited_spec_lists_each_changed_field(tmp_path: Path) -> None:
    reg = tmp_path / "babysit.toml"
    spec = tiny_run(tmp_path, "edited", steps=10)
    assert run_cli("register", str(spec), "--accelerated", "--registry", str(reg))[0] == 0
    spec.write_text(spec.read_text().replace("stop_grace_seconds = 20", "stop_grace_seconds = 30")
                    .replace("[poll]", "[retry]\nmax_attempts = 5\n\n[poll]"))
    code, out, err = run_cli("register", str(spec), "--accelerated", "--registry", str(reg))
    assert code == 0 and err == ""
    lines = out.splitlines()
    assert lines[0] == f"changed: edited in {reg}: 2 field(s) since the last register; no [prereg]: babysat " \
                       "without a verdict"
    assert lines[1:3] == ["  guards.stop_grace_seconds: 20 → 30", "  retry.max_attempts: (absent) → 5"]
    assert lines[3].startswith("  these apply when a daemon next reads run.toml, at its next start (`babysit up`)")
    code, out, _ = run_cli("register", str(spec), "--accelerated", "--registry", str(reg))
    assert code == 0 and out.startswith("unchanged: edited"), "the new spec is the one kept"


@pytest.mark.parametrize(("command", "attempts", "log", "warning"), [
    ('["python", "-m", "trainer", "--log", "outputs/{name}/train_log.jsonl"]', "", "outputs/{name}/train_log.jsonl",
     None),
    ('["python", "-m", "trainer", "--log=outputs/{name}/log.jsonl"]', "", "outputs/{name}/train_log.jsonl",
     "run.log: babysit reads outputs/w/train_log.jsonl, but the command passes --log outputs/w/log.jsonl: babysit "
     "would see no step and no eval, and stop the run as stalled; make them the same path"),
    ('["python", "-m", "trainer", "--log", "outputs/{name}/train_log.jsonl"]',
     '[[attempts]]\nprofile = "a"\nargs = ["--log-path", "/tmp/x.jsonl"]\n', "outputs/{name}/train_log.jsonl",
     "run.log: babysit reads outputs/w/train_log.jsonl, but attempt 1 passes --log-path /tmp/x.jsonl"),
    ('["python", "-m", "trainer"]', "", "logs/{name}/train.jsonl",
     "run.log: its directory logs/w does not exist yet and the command names neither it nor the log: babysit "
     "creates it at launch and passes the log's path as $BABYSIT_LOG; make sure the trainer writes there"),
])
def test_register_warns_when_the_trainer_looks_set_to_write_its_log_elsewhere(
        tmp_path: Path, command: str, attempts: str, log: str, warning: str | None) -> None:
    spec = tmp_path / "w.toml"
    spec.write_text(f'[run]\nname = "w"\ncommand = {command}\nlog = "{log}"\n{attempts}')
    code, out, err = run_cli("register", str(spec), "--registry", str(tmp_path / "babysit.toml"))
    assert code == 0 and out.startswith("added: w"), "a warning, never a refusal"
    if warning is None:
        assert err == ""
    else:
        assert err.startswith(f"WARNING: {spec}: {warning}"), err


def finished_after_a_retry(root: Path, name: str) -> float:
    """What a daemon records for a run whose attempt 1 diverged (a `retrying` incident) and attempt 2
    completed; returns when it ended."""
    store = store_of(root)
    t = time.time() - 600
    first = store.begin_attempt(name, 1, "a", ["x"], "local", 0, str(root), t)
    store.mark_running(first.id, started_at=t)
    store.mark_ended(first.id, ended_at=t + 60, outcome="diverged")
    store.add_incident(name, 1, t + 60, "diverged", {})
    store.add_incident(name, 2, t + 61, "retrying", {})
    second = store.begin_attempt(name, 2, "b", ["x"], "local", 0, str(root), t + 61)
    store.mark_running(second.id, started_at=t + 62)
    store.mark_ended(second.id, ended_at=t + 300, outcome="completed")
    store.set_run_state(name, "finished", t + 300, ended="completed", end_reason="attempt 2 completed")
    store.close()
    return t + 300


def test_status_of_a_finished_run_shows_how_it_ended_not_a_stale_incident(tmp_path: Path) -> None:
    reg = tmp_path / "babysit.toml"
    assert run_cli("register", str(tiny_run(tmp_path, "over", steps=10)), "--accelerated",
                   "--registry", str(reg))[0] == 0
    finished_after_a_retry(tmp_path, "over")
    code, out, _ = run_cli("status", "--registry", str(reg))
    (line,) = [x for x in out.splitlines() if x.startswith("over ")]
    assert code == 0 and "ended completed 5m00s ago" in line and "retrying" not in line
    row = json.loads(run_cli("status", "over", "--json", "--registry", str(reg))[1])
    assert row["ended"]["outcome"] == "completed" and row["status"] == "finished"


def test_abort_of_a_run_that_already_ended_answers_at_once_from_the_store(tmp_path: Path) -> None:
    from babysit.runtime.registry import utc_timestamp

    reg = tmp_path / "babysit.toml"
    assert run_cli("register", str(tiny_run(tmp_path, "done", steps=10)), "--accelerated",
                   "--registry", str(reg))[0] == 0
    ended_at = finished_after_a_retry(tmp_path, "done")
    started = time.monotonic()
    res = babysit("abort", "done", "--registry", str(reg), cwd=tmp_path)
    assert time.monotonic() - started < 5, "no 10-second wait for a daemon that has nothing to do"
    when = utc_timestamp(datetime.fromtimestamp(ended_at, timezone.utc))
    assert res.returncode == 0 and res.stdout == f"done already finished (completed at {when}, attempt 2); " \
                                                 "nothing to abort\n"
    store = store_of(tmp_path)
    assert store.pending_requests() == [], "nothing queued for a daemon to find later"
    store.close()
    code, _, err = run_cli("abort", "nope", "--registry", str(reg))
    assert code == 2 and "no run named 'nope'" in err and "registered: done" in err


def test_a_value_not_known_is_spelt_the_same_in_the_cli_card_and_the_slack_card(tmp_path: Path) -> None:
    """No `train Δ ?` in Slack beside `n/a` in the console: one spelling, "—"."""
    from babysit.core.render import verdict_card

    fixture_log(tmp_path)
    spec = tiny_run(tmp_path, "spelt", steps=10, extra=PREREG_FIXTURE.format(delta=0.05))  # no train_metric
    code, out, _ = run_cli("verdict", str(spec), "--log", str(tmp_path / "fixture.jsonl"),
                           "--chart", str(tmp_path / "c.png"))
    assert code == 0 and "corroboration (not a gate): train Δ —, monotone rise yes" in out
    body = {"run": "spelt", "status": "FINAL", "label": "HEALTHY", "metric": "eval_chunk_mae", "baseline": 1.0,
            "baseline_step": 2, "read": 1.05, "at_step": 4, "delta": 0.05, "rules": [],
            "corroboration": {"train_delta": None, "monotone_rise": None}}
    card = verdict_card(body).text
    assert "train Δ —, monotone rise —" in card
    for text in (card, json.dumps(verdict_card(body).blocks, ensure_ascii=False)):
        assert "n/a" not in text and "Δ ?" not in text and "None" not in text
