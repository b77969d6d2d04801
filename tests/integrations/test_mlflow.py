"""`[source] kind = "mlflow"`: a script that logs with MLflow (the real mlflow, its default SQLite store) and
nothing else is read through MLflow's own store classes, read-only, values bit-equal to what it logged, at
its steps and times; only the runs babysit tagged for this run (`$MLFLOW_RUN_CONTEXT`); and babysat end to
end by the daemon: a FINAL verdict on MLflow's values, a NaN loss stopped while it runs."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from babysit.core.spec.source import parse_source
from babysit.core.spec.tomlfile import Table
from babysit.sources import mlflowstore
from tests.conftest import once_per_session, shared_dir
from tests.integrations.mlflow_plain import expected
from tests.scenarios.conftest import Daemon, kill_runs, store_of
from tests.support import register, run_toml

pytest.importorskip("mlflow")
ROOT = Path(__file__).resolve().parents[2]
ENV = {k: v for k, v in os.environ.items() if k not in ("BABYSIT_LOG", "RANK", "MLFLOW_TRACKING_URI",
                                                         "MLFLOW_RUN_CONTEXT")}
ENV.update({"PYTHONPATH": str(ROOT), "BABYSIT_GPU_PROBE": "none"})


def source(workdir: Path, **raw: object):
    return parse_source(Table({"kind": "mlflow", **raw}, "run.toml", "source"), workdir=workdir, name="r", log=None)


def mlflow_script(workdir: Path, *args: str, tags: str | None, **extra: str) -> subprocess.Popen:
    env = {**ENV, **extra}
    if tags is not None:
        env[mlflowstore.ENV] = tags
    return subprocess.Popen([sys.executable, "-m", "tests.integrations.mlflow_plain", *args], cwd=workdir, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def finish(*procs: subprocess.Popen) -> None:
    for proc in procs:
        _, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err


@pytest.fixture(scope="session")
def store(tmp_path_factory):
    """One store (mlflow.db, MLflow's default) that five real MLflow scripts logged to: babysit run "r"
    (NaN from step 30), the user's own run, another babysit run's, and run "p"'s two attempts; and run "fs"
    to a file store (fs/mlruns/, MLflow 2's default; MLflow 3 writes one when told to). The first
    creates the store (its tables: the slow part, ~15 s of a quiet box), the others then log at once.
    Built once a session, whichever xdist worker asks first (the tests only read it): as a module fixture
    it was built again each time a worker came back to this file after another's tests (`--dist
    worksteal`), ~25 CPU-s each time."""
    workdir, started = once_per_session(tmp_path_factory, "mlflow-store", lambda: _logged_store(tmp_path_factory))
    return Path(workdir), started


def _logged_store(tmp_path_factory) -> tuple[str, float]:
    workdir = Path(tempfile.mkdtemp(prefix="store-", dir=shared_dir(tmp_path_factory, "mlflow")))  # fresh on a retry
    fs = workdir / "fs"  # its own folder: MLflow 3 falls back to the file store where ./mlruns exists
    fs.mkdir()
    started = time.time()
    finish(mlflow_script(workdir, "--steps", "40", "--nan-at", "30", tags=mlflowstore.run_context("r", 1, None)))
    finish(mlflow_script(workdir, "--steps", "10", tags=None),  # the user's own run in the same store: not ours
           mlflow_script(workdir, "--steps", "10", "--every", "10",  # another babysit run's, its tags over the user's
                         tags=mlflowstore.run_context("other", 1, json.dumps({"team": "x"}))),
           mlflow_script(workdir, "--steps", "30", "--every", "1", tags=mlflowstore.run_context("p", 1, None)),
           mlflow_script(workdir, "--steps", "10", "--every", "1", tags=mlflowstore.run_context("p", 2, None)),
           mlflow_script(fs, "--steps", "20", tags=mlflowstore.run_context("fs", 1, None),  # a file store
                         MLFLOW_TRACKING_URI="file:mlruns", MLFLOW_ALLOW_FILE_STORE="true"))
    return str(workdir), started


def test_mlflow_metrics_are_read_bit_equal_from_its_store_and_only_this_runs(store):
    workdir, started = store
    src = source(workdir)
    assert src.path == workdir / "mlflow.db"  # MLflow 3's default store, in the trainer's working directory
    db = src.path.read_bytes()
    before = sorted(p.name for p in workdir.iterdir())
    got = mlflowstore.MlflowReader(src, "r").read({})
    assert got.problems == ()
    by_step = {i.step: i for i in got.items}
    assert sorted(by_step) == list(range(5, 41, 5))
    for step, item in by_step.items():
        want = expected(step)
        loss = item.metrics["train_loss"]
        assert (math.isnan(loss) and step >= 30) or loss == want["train_loss"]  # bit-equal
        assert item.metrics["lr"] == want["lr"]
        assert ("eval_loss" in item.metrics) == (step % 20 == 0)
        assert started <= item.ts <= time.time()  # MLflow's own timestamp, the trainer's clock
    assert by_step[20].metrics["eval_loss"] == expected(20)["eval_loss"]  # one step's calls are one record
    assert got.lines == 8 * 2 + 2
    again = mlflowstore.MlflowReader(src, "r").read(got.state)
    assert again.items == () and again.lines == 0  # read on from where it stopped: nothing twice
    assert src.path.read_bytes() == db and sorted(p.name for p in workdir.iterdir()) == before  # never a write


def test_every_point_is_read_once_in_pages_across_two_attempts(store, monkeypatch):
    workdir, _ = store
    monkeypatch.setattr(mlflowstore, "PAGE", 7)
    reader = mlflowstore.MlflowReader(source(workdir), "p")
    state: dict = {}
    seen: list[tuple[int, str, float]] = []
    for _ in range(20):
        got = reader.read(state)
        assert got.problems == ()
        state = got.state
        seen += [(i.step, k, v) for i in got.items for k, v in i.metrics.items()]
        if not got.more:
            break
    assert not got.more and len(state["offsets"]) == 2  # one entry per MLflow run (attempt)
    first = [(s, k) for s in range(1, 31) for k in ("train_loss", "lr")] + [(s, "eval_loss") for s in range(4, 29, 4)]
    second = [(s, k) for s in range(1, 11) for k in ("train_loss", "lr")] + [(4, "eval_loss"), (8, "eval_loss")]
    assert sorted((s, k) for s, k, _ in seen) == sorted(first + second)  # every point once, none twice
    assert all(v == expected(s)[k] for s, k, v in seen)


def test_a_file_store_is_read_the_same_way(store, monkeypatch):
    workdir, _ = store
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 keeps its file store behind this switch
    got = mlflowstore.MlflowReader(source(workdir, path="fs/mlruns"), "fs").read({})
    assert got.problems == ()
    assert [(i.step, dict(i.metrics)) for i in got.items] == [
        (s, {k: v for k, v in expected(s).items() if k != "eval_loss" or s % 20 == 0}) for s in (5, 10, 15, 20)]
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE")
    refused = mlflowstore.MlflowReader(source(workdir, path="fs/mlruns"), "fs").read({})
    assert "MLFLOW_ALLOW_FILE_STORE" in refused.problems[0]  # MLflow's own refusal, said with its way out


def test_a_store_not_made_yet_is_waited_for_and_never_created(tmp_path):
    got = mlflowstore.MlflowReader(source(tmp_path), "r").read({})
    assert (got.items, got.problems, got.more) == ((), (), False)
    assert list(tmp_path.iterdir()) == []  # MLflow would create mlflow.db and its tables: babysit must not


def test_a_file_that_is_no_mlflow_store_is_said(tmp_path):
    (tmp_path / "mlflow.db").write_text("not a database")
    got = mlflowstore.MlflowReader(source(tmp_path), "r").read({})
    assert got.items == () and "mlflow.db" in got.problems[0] and "DatabaseError" in got.problems[0]
    assert (tmp_path / "mlflow.db").read_text() == "not a database"


def test_the_attempt_environment_tags_mlflow_runs_over_the_users_own_context():
    tags = json.loads(mlflowstore.run_context("r", 3, json.dumps({"team": "vision", "babysit.run": "x"})))
    assert tags == {"team": "vision", "babysit.run": "r", "babysit.attempt": "3"}
    assert json.loads(mlflowstore.run_context("r", 1, "not json")) == {"babysit.run": "r", "babysit.attempt": "1"}


def mlflow_run(name: str, args: list[str], steps: int) -> str:
    """A run of the plain MLflow script, read from its own mlflow.db (its workdir: two fresh stores made at once
    in one file would race), to a verdict on eval_loss."""
    return run_toml(name, [sys.executable, "-m", "tests.integrations.mlflow_plain", *args],
                    run={"workdir": name, "total_steps": steps}, env={"PYTHONPATH": str(ROOT)}, source={"kind": "mlflow"},
                    guards={"min_free_host_ram_gib": 0.1, "stop_grace_seconds": 5, "stall_minutes": 90},
                    retry={"max_attempts": 1},
                    prereg={"question": f"Does eval_loss fall between steps 20 and {steps}?", "metric": "eval_loss",
                            "baseline_step": 20, "read_step": steps, "bands": [{"label": "LOWER", "max": 0}],
                            "otherwise": {"label": "NOT-LOWER"}})


@pytest.mark.slow
def test_the_daemon_babysits_an_mlflow_script_to_a_final_verdict_and_stops_its_nan_live(tmp_path):
    for name, args in (("ml", ["--steps", "80", "--sleep", "0.02"]),
                       ("mlnan", ["--steps", "100000", "--nan-at", "60", "--sleep", "0.02"])):
        (tmp_path / name).mkdir()
        register(tmp_path, mlflow_run(name, args, steps=80), env=ENV)
    try:
        daemon = Daemon(tmp_path, "--exit-when-idle", "--no-view", env=ENV)
        assert daemon.wait(timeout=400) == 0, daemon.output()
    finally:
        kill_runs(tmp_path)
    store = store_of(tmp_path)
    (done,) = store.attempts("ml")
    assert (done.outcome, done.exit_code) == ("completed", 0), done.detail
    verdict = json.loads((tmp_path / ".babysit" / "verdicts" / "ml.json").read_text())
    assert (verdict["status"], verdict["at_step"], verdict["label"]) == ("FINAL", 80, "LOWER"), verdict
    exact = expected(80)["eval_loss"] - expected(20)["eval_loss"]
    assert abs(verdict["delta"] - exact) < 1e-4, (verdict, exact)  # MLflow's values, rounded to the precision
    (nan,) = store.attempts("mlnan")
    assert nan.outcome == "diverged", nan.detail
    records = [json.loads(x) for x in (tmp_path / ".babysit" / "runs" / "mlnan" / "records.jsonl").read_text()
               .splitlines()]
    assert records and max(r["step"] for r in records) < 100000  # stopped while it ran
    assert [r["train_loss"] for r in records if r["step"] == 5] == [expected(5)["train_loss"]]
    assert (tmp_path / "ml" / "mlflow.db").is_file() and (tmp_path / "mlnan" / "mlflow.db").is_file()


def test_a_store_unchanged_since_the_last_read_is_not_queried(store):
    workdir, _ = store
    reader = mlflowstore.MlflowReader(source(workdir), "r")
    got = reader.read({})
    assert got.items and got.state["sig"]  # the store was last written seconds ago: settled

    class Untouchable:
        def __getattr__(self, name: str) -> None:
            raise AssertionError(f"the store was queried ({name}) though nothing changed")

    reader._store = Untouchable()
    again = reader.read(got.state)
    assert (again.items, again.problems) == ((), ())
    os.utime(workdir / "mlflow.db")  # a commit: the file's mtime moves
    changed = reader.read(got.state)
    assert "queried" in changed.problems[0]  # read again (here: refused by the stand-in, and said)
