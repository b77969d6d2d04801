"""Crash campaign: a real daemon babysitting real trainer processes is SIGKILLed at named crash points
(babysit/runtime/faults.py) and at random instants, then restarted; after each trial no run was launched twice,
nothing is orphaned, every message was delivered once and in order, GPU-seconds match the attempts'
own records to the second, the registry parses and the FINAL verdict is the uninterrupted run's.

CI runs one trial per crash point and one random-instant trial; the soak (`-m soak`) runs many.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from babysit.db.store import Store
from babysit.runtime import registry
from tests.reliability.harness import Daemons, check_invariants, make_workspace, run_trial

POINTS = ("after-begin-attempt", "after-launch", "after-send", "after-mark-ended", "after-begin-attempt:2",
          "after-launch:2", "after-send:7")


def test_sigkill_at_every_crash_point_in_turn_loses_and_repeats_nothing(tmp_path: Path, daemons: Daemons,
                                                                      baseline_verdict: dict) -> None:
    """Five daemons in a row, each SIGKILLed at the next crash point, then one run to idle."""
    make_workspace(tmp_path)
    chain = ("after-begin-attempt", "after-launch", "after-send:3", "after-mark-ended", "after-begin-attempt")
    trial = run_trial(tmp_path, daemons, random.Random(1), crash_at=chain, kills=0)
    violations = trial.violations + check_invariants(tmp_path, baseline_verdict)
    assert violations == [], (violations, (tmp_path / "daemon-out.txt").read_text()[-3000:])


def test_sigkill_at_random_instants_twice_in_a_row(tmp_path: Path, daemons: Daemons, baseline_verdict: dict) -> None:
    make_workspace(tmp_path)
    trial = run_trial(tmp_path, daemons, random.Random(int(time.time())), kills=2, window=(0.5, 6.0))
    violations = trial.violations + check_invariants(tmp_path, baseline_verdict)
    assert violations == [], (trial.kills, violations)


def test_a_poll_request_the_daemon_was_killed_in_is_answered_interrupted_and_not_taken_twice(
        tmp_path: Path, daemons: Daemons) -> None:
    """SIGKILL after a `/babysit poll` was taken and before its answer was written (crash point
    after-request): the next daemon answers it `interrupted …`, saying how to check, and takes no second
    on-demand poll (before: it found the request unanswered and polled again)."""
    make_workspace(tmp_path, runs=("r_prereg",))
    first = daemons.start(crash_at="after-request")
    store = Store(tmp_path / ".babysit" / "state.db")
    try:
        deadline = time.monotonic() + 60
        while not any(a.status == "running" for a in store.attempts("r_prereg")):
            assert time.monotonic() < deadline and first.poll() is None, "the run never started"
            time.sleep(0.1)
        request = store.request("r_prereg", "poll-now", "test", time.time())
        assert first.wait(30) == -signal.SIGKILL  # at the crash point: the poll taken, no answer written
        on_demand = [p.id for p in store.polls("r_prereg") if p.kind == "on-demand"]
        assert len(on_demand) == 1 and store.request_result(request) is None
        second = daemons.start()
        deadline = time.monotonic() + 60
        while store.request_result(request) is None:
            assert time.monotonic() < deadline and second.poll() is None, "the request was never answered"
            time.sleep(0.1)
        answer = store.request_result(request)
        assert answer.startswith("interrupted") and "babysit status r_prereg" in answer, answer
        assert [p.id for p in store.polls("r_prereg") if p.kind == "on-demand"] == on_demand  # taken once
    finally:
        store.close()


def test_a_register_killed_between_temp_write_and_replace_leaves_the_old_registry(tmp_path: Path) -> None:
    make_workspace(tmp_path, runs=("r_prereg",))
    before = (tmp_path / "babysit.toml").read_text()
    spec = tmp_path / "r_retry.toml"
    spec.write_text((tmp_path / "r_prereg.toml").read_text().replace('name = "r_prereg"', 'name = "r_retry"'))
    cmd = [sys.executable, "-m", "babysit", "register", str(spec), "--accelerated", "--registry",
           str(tmp_path / "babysit.toml")]
    env = {**os.environ, "BABYSIT_CRASH_AT": "registry-before-replace"}
    res = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert res.returncode == -signal.SIGKILL
    assert (tmp_path / "babysit.toml").read_text() == before  # the old file, whole
    assert registry.load(tmp_path / "babysit.toml").names == ("r_prereg",)
    assert [p.name for p in tmp_path.glob(".babysit.toml.*.tmp")], "the killed writer's temp file is left"
    env.pop("BABYSIT_CRASH_AT")
    res = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert registry.load(tmp_path / "babysit.toml").names == ("r_prereg", "r_retry")
    assert not list(tmp_path.glob(".babysit.toml.*.tmp")), "the next writer removes the stale temp file"


@pytest.mark.soak
@pytest.mark.timeout(1800)
def test_soak_crash_campaign(tmp_path: Path, baseline_verdict: dict) -> None:
    """≥ 50 trials: random instants (1-3 kills each) mixed with every crash point. Figures are written to
    $BABYSIT_SOAK_REPORT (default: soak-crash.json in the test's tmp dir) for docs/reliability.md."""
    trials_n = int(os.environ.get("BABYSIT_SOAK_TRIALS", "50"))
    rng = random.Random(int(os.environ.get("BABYSIT_SOAK_SEED", "20260817")))
    report: list[dict] = []
    for i in range(trials_n):
        root = tmp_path / f"t{i:03d}"
        make_workspace(root)
        daemons = Daemons(root)
        crash_at = POINTS[i % len(POINTS)] if i % 3 == 0 else None
        try:
            trial = run_trial(root, daemons, rng, crash_at=crash_at, kills=rng.choice((1, 1, 2, 3)))
            trial.violations += check_invariants(root, baseline_verdict)
        finally:
            daemons.cleanup()
        report.append({"trial": i, "crash_at": crash_at, "kills": trial.kills, "seconds": trial.seconds,
                       "violations": trial.violations})
        print(json.dumps(report[-1]), flush=True)
    out = Path(os.environ.get("BABYSIT_SOAK_REPORT") or tmp_path / "soak-crash.json")
    faults = sum(len(r["kills"]) for r in report)
    summary = {"trials": len(report), "faults_injected": faults,
               "violations": sum(len(r["violations"]) for r in report), "trials_detail": report}
    out.write_text(json.dumps(summary, indent=1))
    bad = [r for r in report if r["violations"]]
    assert not bad, bad
