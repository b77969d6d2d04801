"""A poll before the first record names where the trainer puts its records: for a stdout source its output,
asking whether it prints the lines the source reads (before: "no record in …/.babysit/runs/r/records.jsonl
yet — is the trainer writing there?", a file babysit itself writes); for a JSONL log, the log. The
supervisor in process with the tests' clock (tests/fakes.py); its store real."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from babysit.core.render import render
from babysit.core.spec.run_toml import load_spec
from babysit.db.store import Store
from babysit.probes.gpu import FileGpuProbe
from babysit.run.context import DaemonContext
from babysit.run.supervisor import RunSupervisor
from tests.fakes import FakeClock, FakeExecutor, FakeHostProbe, ManualTimers
from tests.support import run_toml, stdout_source


def run_spec(**tables: Any) -> str:
    """A run whose polls come every (accelerated) minute and whose stall guard stops it at 20 s."""
    return run_toml("r", ["python", "train.py", "--steps", "1000"], gpus=[], poll=(1, 1), **tables,
                    guards={"exclusive_gpu": False, "min_free_host_ram_gib": 1, "stall_minutes": 20})


def _late_poll(tmp_path: Path, spec: str) -> str:
    """The poll's words 12 s after the launch, past half the (accelerated) stall limit, with no record yet."""
    (tmp_path / "r.toml").write_text(spec)
    (tmp_path / "gpus.json").write_text(json.dumps({"gpus": []}))
    clock, host = FakeClock(), FakeHostProbe()
    store = Store.in_dir(tmp_path / ".babysit")
    try:
        ctx = DaemonContext(store=store, state_dir=tmp_path / ".babysit",
                            gpu_probe=FileGpuProbe(tmp_path / "gpus.json"),
                            executors={"local": FakeExecutor(clock, host)}, scale=1.0, clock=clock,
                            host_probe=host, timers=ManualTimers(clock))
        sup = RunSupervisor(ctx, load_spec(tmp_path / "r.toml"), None)
        sup.start()
        clock.advance(12.0)
        assert sup.polls.now_alone("on-demand")
        return render("poll", {"snapshot": store.polls("r", 1)[0].snapshot.to_dict()}).text
    finally:
        store.close()


def test_a_stdout_run_s_poll_asks_about_the_trainer_s_output_not_babysit_s_own_file(tmp_path: Path) -> None:
    text = _late_poll(tmp_path, run_spec(source=stdout_source(r"iter (?P<step>\d+): loss (?P<loss>[0-9.]+)")))
    assert "records.jsonl" not in text, text  # babysit's own copy: nothing the trainer could write to
    assert ("no record in the trainer's output (stdout and stderr) yet, 12s after launch — is it printing lines "
            "the run's [source] patterns match? (the stall guard stops the run at 20s)") in text, text


def test_a_jsonl_run_s_poll_still_names_its_log_and_asks_if_the_trainer_writes_there(tmp_path: Path) -> None:
    text = _late_poll(tmp_path, run_spec(log="log.jsonl"))
    assert f"no record in {tmp_path / 'log.jsonl'} yet, 12s after launch — is the trainer writing there?" in text, text
