"""An exception while handling one run's exit is an `internal-error` incident, and the attempt and the run
still end in a defined state: no exit handler dies leaving a run `running` forever.

The supervisor under test is real, on a real store, launching a real process through the real local
executor; only the executor's exit record is broken (injected, as the daemon injects its executors).
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

from babysit.core.spec.run_toml import load_spec
from babysit.db.store import Attempt, Store
from babysit.executors import ExitInfo
from babysit.executors.local import LocalExecutor
from babysit.probes.gpu import open_gpu_probe
from babysit.run.context import DaemonContext
from babysit.run.supervisor import RunSupervisor
from tests.support import run_toml, wait_for

FAKE_TRAINER = Path(__file__).parent / "reliability" / "fake_trainer.py"


class BrokenExitRecord(LocalExecutor):
    """The real local executor whose exit record lacks its stderr tail: a bug babysit must survive."""

    def exit_info(self, attempt: Attempt) -> ExitInfo | None:
        info = super().exit_info(attempt)
        return None if info is None else dataclasses.replace(info, stderr_tail=None)  # type: ignore[arg-type]


def supervisor(tmp_path: Path) -> RunSupervisor:
    spec_file = tmp_path / "run.toml"
    cmd = [sys.executable, str(FAKE_TRAINER), "log.jsonl", "--steps", "3", "--sleep", "0.01"]
    spec_file.write_text(run_toml("r", cmd, log="log.jsonl", retry={"max_attempts": 3, "on": ["crashed"]}))
    state = tmp_path / ".babysit"
    ctx = DaemonContext(store=Store.in_dir(state), state_dir=state, gpu_probe=open_gpu_probe("none"),
                        executors={"local": BrokenExitRecord()}, scale=1.0)
    return RunSupervisor(ctx, load_spec(spec_file), None)


def test_an_exit_that_cannot_be_classified_ends_the_attempt_and_the_run_instead_of_running_forever(
        tmp_path: Path) -> None:
    sup = supervisor(tmp_path)
    store = sup.ctx.store
    sup.start()
    # the exit watcher hands the exit to the supervisor's timers
    wait_for("the run to end", lambda: store.run_state("r")[0] in ("failed", "finished"), timeout=60, every=0.05)
    status, facts = store.run_state("r")
    assert status == "failed", "the old watcher thread died here and left the run `running` forever"
    # the broken record (stderr_tail None) fails wherever the classifier first touches it (TypeError or
    # AttributeError, as the classifier changes); the run's reason names that error
    assert "internal error after attempt 1's exit: " in facts["end_reason"]
    (attempt,) = store.attempts("r")  # crashed is in retry.on, but a babysit bug is never retried
    assert (attempt.status, attempt.outcome, attempt.exit_code) == ("ended", "crashed", 0)
    assert "exit not classified" in attempt.detail["summary"]
    (incident,) = [i for i in store.incidents("r") if i.kind == "internal-error"]
    assert incident.body["where"] == "handling attempt 1's exit"
    assert facts["end_reason"].endswith(incident.body["error"]) and "NoneType" in incident.body["error"]
    assert [m.kind for m in store.messages("r")].count("incident") == 1

    # a restarted daemon starts this run's supervisor without raising and launches nothing again
    again = RunSupervisor(sup.ctx, sup.spec, None)
    again.start()
    assert len(store.attempts("r")) == 1 and store.run_state("r")[0] == "failed"


def test_the_same_internal_error_is_one_incident_however_often_a_job_meets_it(tmp_path: Path) -> None:
    sup = supervisor(tmp_path)
    for _ in range(50):  # a tick meeting the same bug 4 times a second
        try:
            {}["missing"]
        except KeyError as exc:
            sup.internal_error("reading its log", exc)
    try:
        [][1]
    except IndexError as exc:
        sup.internal_error("reading its log", exc)
    kinds = [i.body["error"] for i in sup.ctx.store.incidents("r") if i.kind == "internal-error"]
    assert sorted(kinds) == ["IndexError: list index out of range", "KeyError: 'missing'"]
