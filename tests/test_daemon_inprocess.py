"""The daemon driven in process: its registry, store and GPU file are real; its clock, executor, host probe
and timers are the tests' (tests/fakes.py). A control request is acted on when it arrives, not by a tick;
a guard round observes each run once."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest

from babysit.daemon import Daemon
from babysit.notify import ConsoleChannel
from babysit.probes.gpu import FileGpuProbe
from babysit.store import Store
from tests.fakes import FakeClock, FakeExecutor, FakeHostProbe, ManualTimers

RUNS = ("a", "b", "c")


@pytest.fixture
def daemon(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    (tmp_path / "gpus.json").write_text(json.dumps({"gpus": [{"index": 0, "util_pct": 90, "processes": []}]}))
    lines = ["[daemon]", 'state_dir = ".babysit"', ""]
    for name in RUNS:
        (tmp_path / f"{name}.toml").write_text(f'[run]\nname = "{name}"\ncommand = ["train"]\nlog = "{name}.jsonl"\n'
                                               "gpus = [0]\n[guards]\nmin_free_host_ram_gib = 1\n")
        lines += ["[[runs]]", f'name = "{name}"', f'spec = "{name}.toml"', 'registered_at = "2026-01-01T00:00:00Z"', ""]
    (tmp_path / "babysit.toml").write_text("\n".join(lines))
    clock = FakeClock()
    host = FakeHostProbe()
    executor = FakeExecutor(clock, host)
    timers = ManualTimers(clock)
    state = tmp_path / ".babysit"
    d = Daemon(tmp_path / "babysit.toml", gpu_probe=FileGpuProbe(tmp_path / "gpus.json"),
               channel=ConsoleChannel(state, None), clock=clock, host_probe=host, executors={"local": executor},
               timers=timers)
    d.reconcile_registry()
    d.handle_requests()  # the first look, as start() takes it
    yield d, clock, executor, host, timers
    d.exits.close()
    d.store.close()


def test_every_registered_run_is_launched_through_the_injected_executor(daemon) -> None:
    _, _, executor, _, timers = daemon
    assert sorted(run for run, *_ in executor.launches) == list(RUNS)
    assert all(timers.when(f"poll:{run}") is not None for run in RUNS)


def test_an_abort_from_another_process_is_acted_on_when_it_arrives(daemon) -> None:
    d, _, executor, _, _ = daemon
    assert d.handle_requests() is False  # nothing written by anyone else: no query at all
    asker = Store.in_dir(d.state_dir)  # the CLI or the bot: another connection
    try:
        request = asker.request("b", "abort", "test", 0.0)
        assert d.handle_requests() is True
        assert executor.process("b", 1).signals == [signal.SIGTERM]
        assert executor.process("a", 1).signals == [] and executor.process("c", 1).signals == []
        assert asker.request_result(request) == "stopping"
    finally:
        asker.close()


def test_a_guard_round_observes_each_running_run_once(daemon) -> None:
    d, clock, _, host, _ = daemon
    clock.advance(60)
    reads = host.reads
    d.guards()
    assert host.reads == reads + len(RUNS)


def test_an_exit_seen_by_the_guard_rounds_backstop_ends_its_run_alone(daemon) -> None:
    d, _, executor, _, _ = daemon
    executor.end("a", 1, exit_code=0)
    d.guards()  # the exit-check timer was never fired: the guard round's backstop sees the exit
    assert d.store.run_state("a")[0] == "finished"
    assert {d.store.run_state(run)[0] for run in ("b", "c")} == {"running"}
