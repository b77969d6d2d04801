"""Run rows from store rows and log records (pure), and the one table/line they render to."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from babysit.core.errors import BabysitError
from babysit.core.reading.log_records import LogRecord
from babysit.core.snapshot import Snapshot
from babysit.core.spec.run_toml import RunSpec, load_spec
from babysit.db.store import Attempt, Poll, Row, Store
from babysit.view.runtable import change_line, status_table
from babysit.view.runview import RegistryCache, RunRow, ShownFacts, TailCache, build_row, collect, target_step
from tests.support import run_toml

T0 = 1_800_000_000.0

SPEC = run_toml("r", ["python", "train.py", "--steps", "2000"], log="log.jsonl", gpus=[0, 1],
                guards={"gpu_hours_cap": 12.0}, retry={"max_attempts": 2},
                prereg={"question": "q", "metric": "eval_loss", "baseline_step": 500, "read_step": 1000,
                        "bands": [{"label": "HEALTHY", "max": 0.1}]})


@pytest.fixture
def spec(tmp_path: Path) -> RunSpec:
    (tmp_path / "run.toml").write_text(SPEC)
    return load_spec(tmp_path / "run.toml")


def attempt(n: int = 1, *, started_at: float = T0, ended_at: float | None = None, outcome: str | None = None,
            argv: tuple[str, ...] = ("python", "train.py", "--steps", "2000")) -> Attempt:
    return Attempt(id=n, run="r", n=n, profile=f"p{n}", argv=argv, executor="local", gpus=2, attempt_dir="/tmp",
                   status="ended" if ended_at else "running", pid=1, pid_create_time=None, job_id=None,
                   created_at=started_at, started_at=started_at, ended_at=ended_at, exit_code=None,
                   exit_signal=None, outcome=outcome, detail={})


def records(steps: range, *, t0: float, dt: float) -> tuple[LogRecord, ...]:
    return tuple(LogRecord(step=s, ts=t0 + i * dt) for i, s in enumerate(steps))


def row(spec: RunSpec | None, **kw: object) -> RunRow:
    args: dict = {"status": "running", "facts": {}, "attempts": (attempt(),), "poll": None, "incident": None,
                  "verdict": None, "now": T0, "spec": spec, "records": None}
    args.update(kw)
    args["facts"] = ShownFacts.from_dict(args["facts"])  # the run_state row's JSON, read as the Reader reads it
    return build_row("r", **args)


def test_a_running_run_with_no_poll_gets_step_pace_and_eta_from_its_log(spec: RunSpec) -> None:
    r = row(spec, records=records(range(601, 621), t0=T0 + 10, dt=0.5))
    assert (r.step, r.target_step, r.progress_from) == (620, 1000, "log")
    assert r.seconds_per_step == pytest.approx(0.5)
    assert r.eta_seconds == pytest.approx((1000 - 620) * 0.5)
    assert r.last_poll_at is None


def test_the_eta_counts_to_the_read_step_then_to_the_commands_end() -> None:
    assert target_step(1000, 2000, 620) == 1000
    assert target_step(1000, 2000, 1000) == 2000
    assert target_step(1000, None, 1500) == 1000
    assert target_step(None, 2000, 5) == 2000
    assert target_step(None, None, 5) is None


def test_a_record_that_declares_the_last_step_sets_the_target_over_the_commands_flags() -> None:
    said = (LogRecord(step=10, ts=T0, metrics={"total_steps": 5000.0}), LogRecord(step=11, ts=T0 + 1))
    r = row(None, records=said)
    assert (r.step, r.target_step) == (11, 5000), "the HF/Lightning integrations' total_steps beats --steps 2000"
    assert row(None, records=records(range(1, 3), t0=T0, dt=1.0)).target_step == 2000


def test_the_previous_attempts_records_give_no_pace_and_no_step_to_a_fresh_attempt(spec: RunSpec) -> None:
    old = records(range(1, 61), t0=T0 - 100, dt=1.0)  # attempt 1 ran at 1 s/step and diverged at 60
    second = attempt(2, started_at=T0)
    r = row(spec, attempts=(attempt(1, ended_at=T0 - 5, outcome="diverged"), second), records=old,
            facts={"step": 60})
    assert r.seconds_per_step is None and r.eta_seconds is None
    assert (r.step, r.progress_from) == (60, "daemon"), "the daemon's word, not a re-read of an old attempt's log"
    poll = Poll.of(1, "r", T0 + 3, "first", 2, Snapshot.from_dict({"step": 60, "seconds_per_step": 1.0}))
    assert row(spec, attempts=(second,), records=old, poll=poll).seconds_per_step is None, \
        "a poll's pace over both attempts is no pace of this one"
    r = row(spec, attempts=(second,), records=old + records(range(1, 4), t0=T0 + 1, dt=0.2))
    assert (r.step, r.seconds_per_step) == (3, pytest.approx(0.2))


def test_a_log_out_of_reach_falls_back_to_the_attempts_last_poll(spec: RunSpec) -> None:
    poll = Poll.of(1, "r", T0 + 300, "first", 1, Snapshot.from_dict(
        {"step": 400, "seconds_per_step": 0.7, "gpus": [{"index": 0, "util_pct": 91.0}, {"index": 1, "util_pct": 88.4}]}))
    r = row(spec, poll=poll, records=None)
    assert (r.step, r.seconds_per_step, r.progress_from) == (400, 0.7, "poll")
    assert r.gpu_util_pct == (91.0, 88.4) and r.last_poll_at == T0 + 300
    stale = Poll.of(1, "r", T0 - 300, "first", 0, Snapshot.from_dict({"step": 9, "seconds_per_step": 3.0}))
    r = row(spec, poll=stale)
    assert (r.step, r.seconds_per_step, r.gpu_util_pct) == (None, None, ()), "another attempt's poll says nothing"


def test_a_finished_run_shows_how_it_ended_not_its_stale_incident(spec: RunSpec) -> None:
    retrying = Row(id=3, run="r", at=T0 - 50, kind="retrying", body={})
    r = row(spec, status="finished", facts={"ended": "completed", "end_reason": "completed"}, incident=retrying,
            attempts=(attempt(1, ended_at=T0 - 60, outcome="diverged"), attempt(2, ended_at=T0, outcome="completed")),
            records=records(range(1, 11), t0=T0 - 40, dt=1.0))
    assert r.ended is not None and (r.ended.outcome, r.ended.at) == ("completed", T0)
    assert r.eta_seconds is None, "no ETA for a run that is over"
    text = status_table([r], T0 + 120)
    assert "ended completed 2m00s ago" in text and "retrying" not in text


def test_the_table_says_unknown_as_a_dash_and_fences_a_provisional_read(spec: RunSpec) -> None:
    verdict = Row(id=1, run="r", at=T0, kind="PROVISIONAL", body={"status": "PROVISIONAL", "label": "HEALTHY",
                                                                   "delta": 0.0123, "at_step": 500})
    r = row(spec, verdict=verdict, now=T0 + 3600.0)  # two GPUs for an hour
    header, line = status_table([r, row(None, status="pending", attempts=())], T0).splitlines()[:2]
    assert header.split()[:4] == ["RUN", "STATE", "ATTEMPT", "STEP"]
    assert "PROVISIONAL@500 HEALTHY Δ +0.0123" in line
    assert "2.00/12.0" in line, "GPU-hours against the cap"
    assert "1/2 p1" in line and " — " in line
    assert "registered" in status_table([row(None, status="pending", attempts=())], T0)


def test_a_change_line_names_only_what_is_known(spec: RunSpec) -> None:
    r = row(spec, records=records(range(601, 621), t0=T0, dt=0.5))
    text = change_line(r, T0)
    assert "r: running · attempt 1/2 p1 · step 620/1000 · 0.5 s/step · ETA 3m10s to step 1000 · GPU —, GPU-h 0/12.0" in text
    assert "incident" not in text
    broken = row(None, facts={"step": 7}, note="run.toml unreadable: run.toml: poll.bogus: …")
    assert "step 7/2000" in change_line(broken, T0) and change_line(broken, T0).endswith("poll.bogus: …"), \
        "an unreadable run.toml loses the read step, not the store's facts, and says why"


def test_collect_reads_the_store_and_the_log_and_writes_nothing(tmp_path: Path) -> None:
    (tmp_path / "run.toml").write_text(SPEC)
    (tmp_path / "babysit.toml").write_text('[[runs]]\nname = "r"\nspec = "run.toml"\n'
                                           'registered_at = "2026-01-01T00:00:00Z"\n')
    assert [r.status for r in collect(tmp_path / "babysit.toml")] == ["registered"]
    assert not (tmp_path / ".babysit").exists(), "a look never creates the state directory"
    store = Store.in_dir(tmp_path / ".babysit")
    a = store.begin_attempt("r", 1, "p1", ["python", "train.py", "--steps", "2000"], "local", 2, "/tmp", T0)
    store.mark_running(a.id, started_at=T0)
    store.set_run_state("r", "running", T0, attempt=1)
    with open(tmp_path / "log.jsonl", "w") as f:
        for i in range(40):
            f.write(json.dumps({"step": 100 + i, "ts": T0 + 5 + i * 0.25}) + "\n")
    before = (store.data_version(), (tmp_path / "log.jsonl").stat().st_size)
    (r,) = collect(tmp_path / "babysit.toml", now=T0 + 20)
    assert (r.status, r.step, r.target_step) == ("running", 139, 1000)
    assert r.seconds_per_step == pytest.approx(0.25) and r.eta_seconds == pytest.approx(861 * 0.25)
    assert (store.data_version(), (tmp_path / "log.jsonl").stat().st_size) == before
    store.close()


def test_the_registry_is_read_again_when_it_changes_and_a_half_written_one_keeps_the_last_good(
        tmp_path: Path) -> None:
    path = tmp_path / "babysit.toml"
    path.write_text('[daemon]\nstate_dir = ".babysit"\n')
    cache = RegistryCache(path)
    first = cache.get()
    assert cache.get() is first  # unchanged: not parsed again
    path.write_text('[daemon]\nstate_dir = "elsewhere"\n')
    assert cache.get().state_dir.name == "elsewhere"
    path.write_text("[daemon\n")  # an editor's half-written save
    assert cache.get().state_dir.name == "elsewhere"
    with pytest.raises(BabysitError):
        RegistryCache(path).get()  # no good one to fall back on: the error is the caller's


def test_a_log_tail_is_read_again_only_when_the_log_changes(tmp_path: Path) -> None:
    log = tmp_path / "log.jsonl"
    cache = TailCache()
    assert cache.get(log) is None
    log.write_text(json.dumps({"step": 1, "ts": T0}) + "\n")
    first = cache.get(log)
    assert [r.step for r in first] == [1] and cache.get(log) is first
    with open(log, "a") as f:
        f.write(json.dumps({"step": 2, "ts": T0 + 1}) + "\n")
    assert [r.step for r in cache.get(log)] == [1, 2]


def test_another_box_s_run_shows_its_attempt_out_of_its_max_as_a_local_run_does(tmp_path: Path) -> None:
    """ATTEMPT was `1/2 default` for a run whose run.toml is here and `1 default` for one read from the
    fleet's database alone (its run.toml on its box): its daemon now stores the max it enforces, and both
    read `1/2 default`. The run launched by a real supervisor (in process, the tests' executor)."""
    from babysit.probes.gpu import FileGpuProbe
    from babysit.run.context import DaemonContext
    from babysit.run.supervisor import RunSupervisor
    from babysit.view.runtable import cells
    from tests.fakes import FakeClock, FakeExecutor, FakeHostProbe, ManualTimers

    (tmp_path / "run.toml").write_text(SPEC)
    (tmp_path / "gpus.json").write_text(json.dumps({"gpus": [{"index": 0}, {"index": 1}]}))
    clock, host = FakeClock(), FakeHostProbe()
    store = Store.in_dir(tmp_path / ".babysit")
    try:
        ctx = DaemonContext(store=store, state_dir=tmp_path / ".babysit",
                            gpu_probe=FileGpuProbe(tmp_path / "gpus.json"),
                            executors={"local": FakeExecutor(clock, host)}, scale=1.0, clock=clock,
                            host_probe=host, timers=ManualTimers(clock))
        spec = load_spec(tmp_path / "run.toml")
        RunSupervisor(ctx, spec, None).start()
        status, facts = store.run_state("r")
        shown = {where: cells(build_row("r", status=status, facts=ShownFacts.from_dict(facts),
                                        attempts=store.attempts("r"), poll=None, incident=None, verdict=None,
                                        now=clock.now, spec=s, records=None), clock.now)["ATTEMPT"]
                 for where, s in (("here", spec), ("another box", None))}
    finally:
        store.close()
    assert shown == {"here": "1/2 default", "another box": "1/2 default"}, shown  # before: "1 default" there
