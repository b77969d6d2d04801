"""`babysit relaunch RUN`: a run that failed on a typo'd command runs again once run.toml is fixed, with a
real daemon (woken at once when it is up, at `babysit up` when it is not) and a real trainer."""

from __future__ import annotations

import json
import signal
import subprocess
from pathlib import Path

from tests.scenarios.conftest import PY, babysit, kill_runs, store_of
from tests.support import wait_for

# A daemon whose guard round is an hour away and that never exits when idle: only the wake can make it
# take the relaunch of a run that is over.
HOURLY = """
import sys
from pathlib import Path
from babysit.service.daemon import Daemon
from babysit.channels.notify import ConsoleChannel
from babysit.probes.gpu import open_gpu_probe
from babysit.runtime import registry
reg = Path(sys.argv[1])
state = registry.load(reg).state_dir
d = Daemon(reg, gpu_probe=open_gpu_probe("none"), channel=ConsoleChannel(state, sys.stdout), accelerated=True,
           tick_seconds=3600)
d.guard_seconds = 3600
d.run()
"""

PREREG = """
[prereg]
metric = "train_loss"
baseline_step = 2
read_step = 4
[[prereg.bands]]
label = "HEALTHY"
max = 100
"""
FAKE = Path(__file__).resolve().parents[1] / "reliability" / "fake_trainer.py"  # torch-free: seconds a run


def typo_then_fixed(root: Path, extra: str = "") -> tuple[Path, str, str]:
    """A run.toml whose command has a typo'd flag (the trainer's argparse exits 2), and its fixed text."""
    spec = root / "again.toml"
    command = [PY, str(FAKE), "outputs/again/log.jsonl", "--steps", "6", "--sleep", "0.05"]
    fixed = f"""[run]
name = "again"
command = {json.dumps(command)}
log = "outputs/{{name}}/log.jsonl"

[guards]
min_free_host_ram_gib = 0.1
stop_grace_seconds = 5

[poll]
first_after_minutes = 60
every_minutes = 60
{extra}"""
    spec.write_text(fixed.replace('"--steps"', '"--stpes"'))
    return spec, spec.read_text(), fixed


def cli(root: Path, *args: str) -> subprocess.CompletedProcess:
    return babysit(*args, "--registry", str(root / "babysit.toml"), cwd=root)


def test_a_failed_run_is_relaunched_with_its_fixed_command_by_a_running_daemon_at_once(workspace: Path) -> None:
    spec, _, fixed = typo_then_fixed(workspace, PREREG)
    assert cli(workspace, "register", str(spec), "--accelerated").returncode == 0
    store = store_of(workspace)
    daemon = subprocess.Popen([PY, "-c", HOURLY, str(workspace / "babysit.toml")], cwd=workspace,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for("attempt 1 to fail on the typo", lambda: store.run_state("again")[0] == "failed", 60)
        (first,) = store.attempts("again")
        assert first.outcome == "crashed" and first.exit_code == 2

        reregistered = cli(workspace, "register", str(spec), "--accelerated")  # what users tried first
        assert reregistered.returncode == 0 and store.run_state("again")[0] == "failed", "register launches nothing"

        spec.write_text(fixed)
        res = cli(workspace, "relaunch", "again", "--accelerated", "--wait", "30")
        assert res.returncode == 0, res.stdout + res.stderr
        lines = res.stdout.splitlines()
        assert lines[0].startswith("  run.command: [") and " → [" in lines[0], "the fixed field, listed"
        assert lines[1].startswith("relaunching again after attempt 1: run.toml re-read (1 field(s) changed")
        assert lines[-1] == "relaunch again: launched attempt 2", "taken at once: the daemon's round is an hour away"
        wait_for("the relaunched attempt to finish", lambda: store.run_state("again")[0] == "finished", 90)
    finally:
        daemon.send_signal(signal.SIGTERM)
        daemon.communicate(timeout=30)
        kill_runs(workspace)
    one, two = store.attempts("again")
    assert (one.n, one.outcome, two.n, two.outcome) == (1, "crashed", 2, "completed"), "the history is kept"
    assert "--steps" in two.argv and "--stpes" not in two.argv
    _, facts = store.run_state("again")
    assert facts["relaunched"]["after"] == 1 and facts["relaunched"]["by"].startswith("cli:")
    assert store.incidents("again")[0].kind == "crashed", "attempt 1's crash stays on record"
    assert store.final_verdict("again") is not None, "the relaunched attempt reads the verdict"
    launch = [json.loads(line) for line in (workspace / ".babysit" / "channel.jsonl").read_text().splitlines()]
    assert any("relaunched by cli:" in json.dumps(m) for m in launch), "the launch post says it is a relaunch"

    again = cli(workspace, "relaunch", "again", "--accelerated")
    assert again.returncode == 2 and "has a FINAL verdict" in again.stderr and "new name" in again.stderr


def test_a_relaunch_queued_without_a_daemon_runs_at_babysit_up(workspace: Path) -> None:
    spec, _, fixed = typo_then_fixed(workspace)
    assert cli(workspace, "register", str(spec), "--accelerated").returncode == 0
    up = cli(workspace, "up", "--accelerated", "--exit-when-idle", "--no-view")
    assert up.returncode == 0
    store = store_of(workspace)
    assert store.run_state("again")[0] == "failed"
    spec.write_text(fixed)
    res = cli(workspace, "relaunch", "again", "--accelerated", "--wait", "0.5")
    assert res.returncode == 0 and "queued (request" in res.stdout, res.stdout + res.stderr
    assert store.run_state("again")[0] == "failed", "nothing ran it yet"
    up = cli(workspace, "up", "--accelerated", "--exit-when-idle", "--no-view")
    assert up.returncode == 0, up.stderr
    assert [(a.n, a.outcome) for a in store.attempts("again")] == [(1, "crashed"), (2, "completed")]
    assert store.run_state("again")[0] == "finished"


def test_relaunch_refuses_a_running_run_a_changed_prereg_and_a_spent_cap(workspace: Path) -> None:
    spec, _, fixed = typo_then_fixed(workspace, PREREG)
    res = cli(workspace, "relaunch", "again")
    assert res.returncode == 2 and "no run named 'again'" in res.stderr
    assert cli(workspace, "register", str(spec), "--accelerated").returncode == 0
    res = cli(workspace, "relaunch", "again")
    assert res.returncode == 2 and "has not been launched yet" in res.stderr and "babysit up" in res.stderr
    assert cli(workspace, "up", "--accelerated", "--exit-when-idle", "--no-view").returncode == 0

    spec.write_text(fixed.replace("max = 100", "max = 50"))
    res = cli(workspace, "relaunch", "again", "--accelerated")
    assert res.returncode == 2, res.stdout
    assert "prereg: changed since again was registered" in res.stderr and "a changed [prereg] is a different " \
        "experiment" in res.stderr and "new name" in res.stderr

    store = store_of(workspace)
    (first,) = store.attempts("again")
    with store.tx() as db:  # as if attempt 1 had held 2 GPUs for an hour
        db.execute("UPDATE attempts SET gpus=2, started_at=ended_at-1800 WHERE id=?", (first.id,))
    spec.write_text(fixed.replace("[guards]", "[guards]\ngpu_hours_cap = 1.0"))
    res = cli(workspace, "relaunch", "again", "--accelerated")
    assert res.returncode == 2
    assert "guards.gpu_hours_cap: again's attempts have used 1.00 of its 1 GPU-hours; the cap covers every " \
           "attempt of the run, those before a relaunch included" in res.stderr
    assert "HINT: raise guards.gpu_hours_cap" in res.stderr
    assert store.run_state("again")[0] == "failed" and len(store.attempts("again")) == 1
