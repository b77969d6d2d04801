"""GPU faults through the supervisor, in process: the machine's fault stops the run, is classified
gpu-fault, quarantines the GPU by UUID and is retried on a healthy GPU (gpus = "any N", spare_gpus), or
the run waits for the GPU and says so; the trainer's own Xid is the trainer's, and nothing is quarantined.

Real parts: the store, the spec, the supervisor, the guards and classification, a FileGpuProbe whose
file the test rewrites; the executor and clock are the fakes of tests/fakes.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from babysit.core.render import render
from babysit.core.spec.run_toml import load_spec
from babysit.db.store import Store
from babysit.probes.gpu import FileGpuProbe
from babysit.run.context import DaemonContext
from babysit.run.supervisor import RunSupervisor
from tests.fakes import FakeClock, FakeExecutor, FakeHostProbe, ManualTimers
from tests.support import run_toml


class Rig:
    def __init__(self, tmp_path: Path, gpus: list[int] | str, spare_gpus: list[int] | None = None) -> None:
        self.root = tmp_path
        self.clock = FakeClock()
        self.timers = ManualTimers(self.clock)
        self.executor = FakeExecutor(self.clock, FakeHostProbe())
        self.gpu_file = tmp_path / "gpus.json"
        self.faults: dict[int, list[str]] = {0: [], 1: [], 2: []}
        self.write_gpus()
        spec = tmp_path / "r.toml"
        spec.write_text(run_toml("r", ["python", "train.py"], log="log.jsonl",
                                 run={"gpus": gpus, **({"spare_gpus": spare_gpus} if spare_gpus else {})},
                                 retry={"on": ["gpu-fault", "oom"], "gpu_fault_max": 2, "max_attempts": 2}))
        state = tmp_path / ".babysit"
        self.store = Store.in_dir(state)
        self.ctx = DaemonContext(store=self.store, state_dir=state, gpu_probe=FileGpuProbe(self.gpu_file),
                                 executors={"local": self.executor}, scale=60.0, clock=self.clock,
                                 host_probe=FakeHostProbe(), timers=self.timers)
        self.sup = RunSupervisor(self.ctx, load_spec(spec), None)

    def write_gpus(self) -> None:
        self.gpu_file.write_text(json.dumps({"gpus": [
            {"index": i, "uuid": f"GPU-sim-{i}", "util_pct": 90, "processes": [], "faults": self.faults[i]}
            for i in range(3)]}))

    def fault(self, gpu: int, *faults: str) -> None:
        self.faults[gpu] = list(faults)
        self.write_gpus()

    def visible(self, n: int) -> str:
        return self.executor.launches[n - 1][3]["CUDA_VISIBLE_DEVICES"]

    def kinds(self) -> list[str]:
        return [i.kind for i in self.store.incidents("r")]


@pytest.fixture
def rig(tmp_path: Path):
    made: list[Rig] = []

    def make(gpus: list[int] | str, spare_gpus: list[int] | None = None) -> Rig:
        made.append(Rig(tmp_path, gpus, spare_gpus))
        return made[-1]

    yield make
    for r in made:
        r.store.close()


def test_a_machine_xid_stops_quarantines_and_the_retry_runs_on_a_healthy_gpu_of_the_box(rig) -> None:
    r = rig("any 1")
    r.sup.start()
    assert r.visible(1) == "0"
    r.fault(0, "xid 79")  # GPU 0 fell off the bus mid-run
    r.sup.guard()
    assert r.executor.process("r", 1).signals  # stopped at once, gracefully
    r.timers.advance(2)
    a1 = r.store.attempt("r", 1)
    assert a1.outcome == "gpu-fault"
    (ev,) = a1.detail["gpu_evidence"]
    assert (ev["gpu"], ev["uuid"], ev["xid"], ev["side"], ev["action"]) == (0, "GPU-sim-0", 79, "machine", "reboot")
    assert list(r.store.quarantined_gpus()) == ["GPU-sim-0"]
    assert len(r.executor.launches) == 2 and r.visible(2) == "1"  # the retry: on GPU 1, not the broken one
    assert r.store.attempt("r", 2).detail["gpus"] == [1]
    stop = next(m for m in r.store.messages("r") if m.kind == "incident" and m.payload["incident"] == "gpu-fault")
    text = stop.payload["message"]
    assert "GPU 0" in text and "Xid 79 (GPU has fallen off the bus)" in text and "reboot the machine" in text
    assert stop.payload["detail"]["evidence"][0]["meaning"] == "the GPU is no longer reachable on the PCIe bus"
    shown = render("incident", stop.payload).text  # what Slack (and the console) shows
    assert ("GPU evidence:\n  GPU 0 GPU-sim-0: Xid 79 (GPU has fallen off the bus) — the GPU is no longer reachable "
            "on the PCIe bus; the machine: reboot the machine") in shown
    assert "gpu-quarantined" in r.kinds()


def test_a_run_tied_to_its_gpu_waits_for_the_quarantined_gpu_and_launches_once_it_is_released(rig) -> None:
    r = rig([0])
    r.sup.start()
    r.fault(0, "ecc double-bit")
    r.sup.guard()
    r.timers.advance(2)
    assert r.store.attempt("r", 1).outcome == "gpu-fault"
    assert len(r.executor.launches) == 1 and r.sup.status == "waiting-gpu"
    waiting = [m.payload["message"] for m in r.store.messages("r") if m.kind == "incident"
               and m.payload["incident"] == "gpu-quarantined" and "waits" in m.payload["message"]]
    assert waiting == ['attempt 2 waits: GPU 0 quarantined (`babysit gpu release` lifts it once the GPU is reset); '
                       'declare gpus = "any N" or spare_gpus to run on another']
    r.timers.advance(61)
    assert len(r.executor.launches) == 1  # still quarantined: still waiting, said once
    assert r.kinds().count("gpu-quarantined") == 2  # quarantined, then waiting; not once a minute
    r.fault(0)  # reset: the fault is gone
    assert r.store.release_gpu("GPU-sim-0")
    r.timers.advance(61)
    assert len(r.executor.launches) == 2 and r.visible(2) == "0" and r.sup.status == "running"


def test_a_spare_gpu_stands_in_for_a_quarantined_one_in_order(rig) -> None:
    r = rig([0, 1], spare_gpus=[2])
    r.sup.start()
    assert r.visible(1) == "0,1"
    r.fault(1, "xid 95")
    r.sup.guard()
    r.timers.advance(2)
    assert list(r.store.quarantined_gpus()) == ["GPU-sim-1"]
    assert r.visible(2) == "0,2"


def test_the_trainers_own_xid_is_the_trainers_bug_and_nothing_is_quarantined(rig) -> None:
    r = rig("any 1")
    r.sup.start()
    r.fault(0, "xid 31")  # an illegal memory access in the trainer's kernel
    r.sup.guard()
    assert not r.executor.process("r", 1).signals  # no stop: the trainer's CUDA error ends it
    r.executor.end("r", 1, exit_code=1)
    r.timers.advance(2)
    a1 = r.store.attempt("r", 1)
    assert a1.outcome == "crashed"
    assert "the trainer's own GPU error: Xid 31 (GPU memory page fault) on GPU 0" in a1.detail["summary"]
    assert r.store.quarantined_gpus() == {}
    assert len(r.executor.launches) == 1  # crashed is not in retry.on
    assert "gpu-app-error" in r.kinds() and "gpu-fault" not in r.kinds()


def test_gpu_fault_retries_have_their_own_budget(rig) -> None:
    r = rig("any 1")
    r.sup.start()
    for n, gpu in ((1, 0), (2, 1)):  # max_attempts = 2, yet two machine faults each get their retry
        r.fault(gpu, "xid 48")
        r.sup.guard()
        r.timers.advance(2)
        assert r.store.attempt("r", n).outcome == "gpu-fault"
    assert r.visible(3) == "2" and len(r.executor.launches) == 3
    r.fault(2, "xid 48")
    r.sup.guard()
    r.timers.advance(2)
    assert len(r.executor.launches) == 3 and r.sup.status == "failed"
    assert "no gpu-fault retries left (retry.gpu_fault_max = 2)" in r.store.run_state("r")[1]["end_reason"]


def test_the_gpu_command_quarantines_lists_and_releases_by_uuid_or_index(tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    def babysit(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "babysit", *args, "--registry", str(tmp_path / "babysit.toml")],
                              cwd=tmp_path, capture_output=True, text=True, timeout=60,
                              env={**os.environ, "BABYSIT_GPU_PROBE": f"file:{gpus}"})

    gpus = tmp_path / "gpus.json"
    gpus.write_text(json.dumps({"gpus": [{"index": i, "uuid": f"GPU-sim-{i}"} for i in range(2)]}))
    (tmp_path / "r.toml").write_text('[run]\nname = "r"\ncommand = ["python", "-c", "pass"]\nlog = "l.jsonl"\n')
    assert babysit("register", "r.toml").returncode == 0
    got = babysit("gpu", "quarantine", "1", "--reason", "Xid 79 seen by hand")
    assert got.returncode == 0 and got.stdout.startswith("GPU GPU-sim-1 (index 1) quarantined"), got.stderr
    listed = babysit("gpu", "list").stdout
    assert listed.startswith("GPU 1 GPU-sim-1: quarantined ") and listed.rstrip().endswith("Xid 79 seen by hand")
    assert "quarantined GPUs (`babysit gpu release UUID` lifts one):\n  GPU 1 GPU-sim-1" in babysit("status").stdout
    bad = babysit("gpu", "quarantine", "7")
    assert bad.returncode == 2 and "no GPU 7 visible here (visible: 0, 1)" in bad.stderr
    assert babysit("gpu", "release", "0").returncode == 1  # not quarantined
    released = babysit("gpu", "release", "1")
    assert released.returncode == 0 and "GPU GPU-sim-1 released" in released.stdout
    assert babysit("gpu", "list").stdout.strip() == "no GPU is quarantined"


def test_the_quarantine_is_shown_by_slack_and_the_web_page() -> None:
    from babysit.core.readings import GpuReading, GpuView
    from babysit.run.gpufault import quarantine_lines
    from babysit.web.pages import runs_fragment
    from bot.gpus import gpu_lines

    q = {"GPU-sim-0": {"uuid": "GPU-sim-0", "gpu": 0, "reason": "Xid 79 (GPU has fallen off the bus) during r — "
                       "reboot the machine", "by": "babysit", "at": 1_800_000_000.0, "evidence": {}},
         "GPU-gone": {"uuid": "GPU-gone", "gpu": 3, "reason": "GPU lost", "by": "cli:ana", "at": 1_800_000_000.0,
                      "evidence": {}}}
    view = GpuView(True, None, (GpuReading(0, "NVIDIA H200", "GPU-sim-0", 0.0, 1, 0, 1, (), ()),))
    lines = gpu_lines(view, {}, q)
    assert lines[0].endswith("· QUARANTINED: Xid 79 (GPU has fallen off the bus) during r — reboot the machine "
                             "(`babysit gpu release GPU-sim-0`)")
    assert lines[-1] == "GPU 3 GPU-gone (not visible): QUARANTINED: GPU lost"
    html = runs_fragment([], 1_800_000_000.0, (), quarantine_lines(q))
    assert "quarantined GPUs" in html and "GPU 0 GPU-sim-0: quarantined 2027-01-15 08:00 UTC by babysit" in html


def test_a_run_that_logged_its_completion_before_a_gpu_fault_stop_completed_and_its_gpu_is_still_quarantined(
        rig) -> None:
    """The trainer logged `"event": "completed"` and was exiting (teardown: workers, NCCL) when GPU 0 fell
    off the bus; the stop's SIGTERM killed it. Its work was done: a gpu-fault retry would train it again
    (from its last checkpoint, or from scratch). The broken GPU is quarantined all the same."""
    r = rig("any 1")
    r.sup.start()
    r.executor.process("r", 1).obeys_stop = False
    (r.root / "log.jsonl").write_text(json.dumps({"step": 60, "ts": r.clock.now, "train_loss": 0.1}) + "\n"
                                      + json.dumps({"step": 60, "ts": r.clock.now, "event": "completed"}) + "\n")
    r.fault(0, "xid 79")
    r.sup.guard()
    assert r.executor.process("r", 1).signals, "the fault's stop was sent"
    r.executor.end("r", 1, exit_code=None, sig=15)  # SIGTERM's default action, in the trainer's teardown
    r.timers.advance(2)
    a1 = r.store.attempt("r", 1)
    assert a1.outcome == "completed", a1.detail
    assert a1.detail["summary"].startswith("completed: the trainer logged its completion at step 60 before the "
                                           "stop (stop: gpu-fault) reached it"), a1.detail["summary"]
    assert list(r.store.quarantined_gpus()) == ["GPU-sim-0"]
    assert len(r.executor.launches) == 1 and r.sup.status == "finished"
