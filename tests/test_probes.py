"""Probes against the real thing that exists here: real process trees (psutil), the real pynvml on a
machine without a driver, and the file-injected GPUs the daemon's tests and demo use."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import psutil
import pytest

from babysit.core.errors import BadInput
from babysit.core.guards import LiveFacts, foreign_holders, live, prelaunch
from babysit.core.spec.run_toml import GuardsSpec
from babysit.probes.gpu import FileGpuProbe, NullGpuProbe, NvmlGpuProbe, open_gpu_probe, poll_window
from babysit.probes.host import (
    available_ram_bytes,
    is_same_process,
    process_create_time,
    process_name,
    process_tree,
    read_host,
)

# parent -> child -> grandchild; the grandchild holds ~64 MiB and writes its pid to argv[1]
GRANDCHILD = "import os, sys, time; b = b'x' * (64 * 2**20); open(sys.argv[1], 'w').write(str(os.getpid())); " \
             "time.sleep(120)"
LAUNCH = "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', *sys.argv[1:]]); time.sleep(120)"


@pytest.fixture
def tree(tmp_path: Path):
    """A real three-level process tree; yields (root Popen, grandchild pid). Killed afterwards."""
    pidfile = tmp_path / "grandchild.pid"
    root = subprocess.Popen([sys.executable, "-c", LAUNCH, LAUNCH, GRANDCHILD, str(pidfile)], start_new_session=True)
    deadline = time.monotonic() + 20
    while not (pidfile.exists() and pidfile.read_text()):
        if time.monotonic() > deadline:
            root.kill()
            pytest.fail("the grandchild never started")
        time.sleep(0.05)
    grandchild = int(pidfile.read_text())
    yield root, grandchild
    try:
        os.killpg(root.pid, 9)
    except ProcessLookupError:
        pass
    root.wait(timeout=10)


def _wait_gone(pid: int, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while process_create_time(pid) is not None and time.monotonic() < deadline:
        time.sleep(0.05)


def test_process_tree_finds_the_grandchild(tree):
    root, grandchild = tree
    pids = process_tree(root.pid)
    assert root.pid in pids and grandchild in pids and len(pids) == 3
    assert os.getpid() not in pids


def test_process_tree_of_a_gone_root_is_empty(tree):
    root, _ = tree
    os.killpg(root.pid, 9)
    root.wait(timeout=10)
    assert process_tree(root.pid) == frozenset()


def test_read_host_sums_rss_over_the_tree_and_measures_cpu_on_the_second_read(tree):
    root, _ = tree
    first = read_host(root.pid)
    assert first.run_pids == process_tree(root.pid)
    assert first.run_rss_bytes is not None and first.run_rss_bytes > 64 * 2**20  # the grandchild's buffer
    assert first.run_cpu_pct is None  # a first look cannot measure a rate
    time.sleep(0.2)
    second = read_host(root.pid)
    assert second.run_cpu_pct is not None and second.run_cpu_pct >= 0
    assert 0 < second.available_ram_bytes <= second.total_ram_bytes


def test_read_host_checks_the_roots_start_in_the_one_read_of_its_stat(tree, monkeypatch):
    """A check of a run reads the root's stat once: the create time its launch recorded is compared in the
    stat line the tree walk reads anyway (the executor's own check read it a second time before); a root
    that started at another time is a recycled pid, whose tree is not the run's."""
    from babysit.probes import proctree

    root, grandchild = tree
    started = process_create_time(root.pid)
    read = proctree._read
    opened: list[str] = []
    monkeypatch.setattr(proctree, "_read", lambda path, size=4096: opened.append(path) or read(path, size))
    got = read_host(root.pid, started=started)
    assert opened.count(f"/proc/{root.pid}/stat") == 1
    assert got.run_pids == process_tree(root.pid) and grandchild in got.run_pids
    stranger = read_host(root.pid, started=started - 5.0)
    assert stranger.run_pids == frozenset() and stranger.run_rss_bytes is None and stranger.run_cpu_pct is None


def test_a_check_of_a_local_run_reads_its_roots_stat_once(tree, monkeypatch, tmp_path: Path):
    """The local executor names the root and its recorded start (`root`) without reading /proc itself."""
    from babysit.executors.local import LocalExecutor
    from babysit.probes import proctree
    from babysit.probes.host import ProcHostProbe

    root, _ = tree
    attempt = SimpleNamespace(pid=root.pid, pid_create_time=process_create_time(root.pid), attempt_dir=str(tmp_path))
    executor, probe = LocalExecutor(), ProcHostProbe()
    read = proctree._read
    opened: list[str] = []
    monkeypatch.setattr(proctree, "_read", lambda path, size=4096: opened.append(path) or read(path, size))
    pid, started = executor.root(attempt)
    got = probe.read(pid, started=started)
    assert root.pid in got.run_pids and opened.count(f"/proc/{root.pid}/stat") == 1
    assert executor.root(SimpleNamespace(pid=None, pid_create_time=None, attempt_dir=str(tmp_path))) is None
    # no recorded start: the shim's lock says whether it lives (none here)
    assert executor.root(SimpleNamespace(pid=root.pid, pid_create_time=None, attempt_dir=str(tmp_path))) is None


def test_read_host_without_a_run():
    got = read_host(None)
    assert got.run_pids == frozenset() and got.run_rss_bytes is None and got.run_cpu_pct is None
    assert 0 < available_ram_bytes() <= got.total_ram_bytes


def test_is_same_process_true_then_false_after_death(tree):
    root, grandchild = tree
    created = process_create_time(grandchild)
    assert created is not None
    assert is_same_process(grandchild, created)
    assert not is_same_process(grandchild, created - 5.0)  # a recycled pid has another create time
    os.killpg(root.pid, 9)
    root.wait(timeout=10)
    _wait_gone(grandchild)
    assert not is_same_process(grandchild, created)
    assert process_create_time(grandchild) is None


def test_process_name_of_a_real_and_a_missing_pid(tree):
    _, grandchild = tree
    assert "python" in (process_name(grandchild) or "")
    assert process_name(2**22 + 12345) is None  # above pid_max: no such process


def test_nvml_probe_without_a_driver_is_unavailable_with_a_fix_and_never_raises():
    pynvml = pytest.importorskip("pynvml")
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        pass
    else:
        pynvml.nvmlShutdown()
        pytest.skip("an NVIDIA driver is present here: see tests/gpu/")
    probe = NvmlGpuProbe()
    probe.sample()  # before any read: a no-op, not an error
    for indices in ([0], []):
        view = probe.read(indices)
        assert view.available is False and view.gpus == ()
        assert "install the NVIDIA driver" in (view.reason or "")
    probe.sample()
    probe.close()
    assert prelaunch(GuardsSpec(), [0], view)[0].incident == "gpu-unseen"


def _write(path: Path, data: object) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data))
    tmp.replace(path)


def test_file_probe_rereads_its_file_so_a_test_can_start_a_foreign_process(tmp_path: Path):
    path = tmp_path / "gpus.json"
    gpu = {"index": 0, "name": "Simulated H200", "util_pct": 97, "memory_used_bytes": 10,
           "memory_total_bytes": 150 * 2**30, "processes": [], "faults": []}
    _write(path, {"gpus": [gpu]})
    probe = open_gpu_probe(f"file:{path}")
    first = probe.read([0])
    assert first.available and first.gpu(0).util_pct == 97.0 and first.gpu(0).processes == ()
    assert prelaunch(GuardsSpec(), [0], first) == ()
    _write(path, {"gpus": [{**gpu, "processes": [{"pid": 4242, "name": "policy_server",
                                                   "used_memory_bytes": 61 * 2**30}]}]})
    second = probe.read([0])
    assert [p.pid for p in second.gpu(0).processes] == [4242]
    assert prelaunch(GuardsSpec(), [0], second)[0].incident == "gpu-held"


def test_file_probe_makes_its_readings_once_a_file_unless_a_gpu_lists_processes(tmp_path: Path):
    """Every run's guard check reads the probe (1,000 runs: bench/scale.py): an unchanged file without
    processes gives the readings made at its first read; a rewrite is seen at the next read; listed pids
    are looked up at every read (the holder that exits is seen gone without the file changing)."""
    path = tmp_path / "gpus.json"
    _write(path, {"gpus": [{"index": 0, "util_pct": 97, "processes": []}, {"index": 1, "faults": ["xid 79"]}]})
    probe = FileGpuProbe(path)
    first, again = probe.read([0, 1]), probe.read([0])
    assert again.gpu(0) is first.gpu(0) and first.gpu(1).faults == ("xid 79",)
    _write(path, {"gpus": [{"index": 0, "util_pct": 12, "processes": []}]})
    assert probe.read([0]).gpu(0).util_pct == 12.0
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        _write(path, {"gpus": [{"index": 0, "processes": [{"pid": holder.pid, "name": "policy"}]}]})
        assert [p.visible for p in probe.read([0]).gpu(0).processes] == [True]
    finally:
        holder.kill()
        holder.wait()
    gone = probe.read([0]).gpu(0).processes[0]
    assert gone.visible is False, "the pid looked up again at this read, the file unchanged"


def test_file_probe_own_tree_is_not_foreign(tree, tmp_path: Path):
    root, grandchild = tree
    path = tmp_path / "gpus.json"
    _write(path, {"gpus": [{"index": 0, "processes": [{"pid": grandchild, "name": "worker"},
                                                      {"pid": os.getpid(), "name": "pytest"}]}]})
    view = FileGpuProbe(path).read([])
    holders = foreign_holders(view, [0], process_tree(root.pid))
    assert [h.pid for h in holders] == [os.getpid()]


@pytest.mark.parametrize(("content", "reason_has"), [
    (None, "cannot read simulated GPUs"),
    ("{not json", "cannot read simulated GPUs"),
    ('{"gpus": [{"name": "no index"}]}', "cannot read simulated GPUs"),
    ('{"available": false, "reason": "simulated: driver gone"}', "simulated: driver gone"),
])
def test_file_probe_bad_or_unavailable_file_is_a_view_not_an_exception(tmp_path: Path, content, reason_has):
    path = tmp_path / "gpus.json"
    if content is not None:
        path.write_text(content)
    view = FileGpuProbe(path).read([0])
    assert view.available is False and reason_has in (view.reason or "")


def test_file_probe_filters_indices_and_marks_unlistable_processes(tmp_path: Path):
    path = tmp_path / "gpus.json"
    _write(path, {"gpus": [{"index": 0}, {"index": 1, "processes": None, "faults": ["xid 79"]}]})
    view = FileGpuProbe(path).read([1])
    assert [g.index for g in view.gpus] == [1]
    assert view.gpu(1).processes_known is False and view.gpu(1).faults == ("xid 79",)
    assert view.gpu(1).util_pct is None and view.gpu(1).util_samples == 0


@pytest.mark.parametrize(("spec", "cls"), [
    (None, NvmlGpuProbe), ("", NvmlGpuProbe), ("nvml", NvmlGpuProbe), ("none", NullGpuProbe),
    ("file:/x.json", FileGpuProbe),
])
def test_open_gpu_probe(spec, cls):
    probe = open_gpu_probe(spec)
    assert isinstance(probe, cls)
    probe.close()


@pytest.mark.parametrize("spec", ["file:", "nvidia", "FILE:/x"])
def test_open_gpu_probe_rejects_unknown_specs(spec):
    with pytest.raises(BadInput, match="BABYSIT_GPU_PROBE"):
        open_gpu_probe(spec)


def test_null_probe_refuses_gpu_runs_with_a_reason():
    view = NullGpuProbe().read([0])
    assert view.available is False and "BABYSIT_GPU_PROBE=none" in (view.reason or "")


# -- NvmlGpuProbe's own logic over an injected stand-in for the pynvml module ----------------------
# The probe is real; only the driver underneath is simulated (tests/gpu/ runs it on the real one).

GIB = 2**30


class FakeNvml:
    """The subset of pynvml the probe calls; handles are GPU indices."""

    NVML_ERROR_NOT_SUPPORTED, NVML_ERROR_NOT_FOUND, NVML_ERROR_TIMEOUT, NVML_ERROR_GPU_IS_LOST = 3, 6, 10, 15
    NVML_ERROR_UNKNOWN = 999
    NVML_GPU_UTILIZATION_SAMPLES, NVML_MEMORY_ERROR_TYPE_UNCORRECTED, NVML_VOLATILE_ECC = 1, 1, 0
    NVML_VALUE_TYPE_DOUBLE, NVML_VALUE_TYPE_UNSIGNED_INT, NVML_VALUE_TYPE_UNSIGNED_LONG = 0, 1, 2
    NVML_VALUE_TYPE_UNSIGNED_LONG_LONG, NVML_VALUE_TYPE_SIGNED_LONG_LONG, NVML_VALUE_TYPE_SIGNED_INT = 3, 4, 5
    nvmlEventTypeDoubleBitEccError, nvmlEventTypeXidCriticalError = 0x2, 0x8

    class NVMLError(Exception):
        def __init__(self, value: int) -> None:
            super().__init__(value)
            self.value = value

        def __str__(self) -> str:
            return f"NVML error {self.value}"

    def __init__(self, gpus: int = 2) -> None:
        self.count = gpus
        self.rates: dict[int, int] = {i: 0 for i in range(gpus)}
        self.lost: set[int] = set()
        self.ecc = {i: 0 for i in range(gpus)}
        self.procs: dict[int, list] = {i: [] for i in range(gpus)}
        self.events: list[SimpleNamespace] = []
        self.broken: set[str] = set()

    def _check(self, h: int, fn: str = "") -> None:
        if h in self.lost:
            raise self.NVMLError(self.NVML_ERROR_GPU_IS_LOST)
        if fn in self.broken:
            raise self.NVMLError(self.NVML_ERROR_UNKNOWN)

    def nvmlInit(self): return None
    def nvmlShutdown(self): return None
    def nvmlDeviceGetCount(self): return self.count
    def nvmlEventSetCreate(self): return "set"
    def nvmlEventSetFree(self, s): return None
    def nvmlDeviceGetSupportedEventTypes(self, h): return 0xA
    def nvmlDeviceRegisterEvents(self, h, mask, s): return None
    def nvmlDeviceGetIndex(self, device): return device
    def nvmlDeviceGetName(self, h): return b"NVIDIA H200"
    def nvmlDeviceGetUUID(self, h): return f"GPU-{h}"

    def nvmlDeviceGetHandleByIndex(self, i):
        self._check(i)
        return i

    def nvmlDeviceGetUtilizationRates(self, h):
        self._check(h)
        return SimpleNamespace(gpu=self.rates[h], memory=0)

    def nvmlDeviceGetMemoryInfo(self, h):
        self._check(h, "nvmlDeviceGetMemoryInfo")
        return SimpleNamespace(used=3 * GIB, total=141 * GIB, free=138 * GIB)

    def nvmlDeviceGetComputeRunningProcesses(self, h):
        self._check(h, "nvmlDeviceGetComputeRunningProcesses")
        return [SimpleNamespace(pid=p, usedGpuMemory=m) for p, m in self.procs[h]]

    def nvmlDeviceGetTotalEccErrors(self, h, kind, counter):
        self._check(h)
        return self.ecc[h]

    def nvmlEventSetWait(self, s, timeout_ms):
        if not self.events:
            raise self.NVMLError(self.NVML_ERROR_TIMEOUT)
        return self.events.pop(0)


@pytest.fixture
def nv():
    return FakeNvml()


@pytest.fixture
def probe(nv):
    p = NvmlGpuProbe(library=nv)
    yield p
    p.close()


def test_util_averages_the_rates_sampled_since_the_last_read(nv, probe):
    assert probe.util_source(0) is None  # not sampled yet
    probe.read([0])
    for value in (80, 100):
        nv.rates[0] = value
        probe.sample()
    nv.rates[0] = 60
    g = probe.read([0]).gpu(0)  # read() takes a last sample too
    assert (g.util_pct, g.util_samples) == (80.0, 3)
    assert probe.util_source(0) == "rates" and probe.util_source(5) is None


class GpmNvml(FakeNvml):
    """FakeNvml with GPM: each GPU has counters of busy and elapsed time that a test advances, and a
    snapshot holds them; the metric is the busy share between two snapshots, as the driver computes it."""

    NVML_SUCCESS, NVML_GPM_METRICS_GET_VERSION, NVML_GPM_METRIC_GRAPHICS_UTIL = 0, 1, 1

    class c_nvmlGpmMetricsGet_t:  # pynvml's name
        def __init__(self) -> None:
            self.version = self.numMetrics = 0
            self.sample1 = self.sample2 = None
            self.metrics = [SimpleNamespace(metricId=0, nvmlReturn=0, value=0.0)]

    def __init__(self, gpus: int = 2, gpm_gpus: frozenset[int] = frozenset({0, 1})) -> None:
        super().__init__(gpus)
        self.gpm_gpus = gpm_gpus
        self.busy = {i: 0.0 for i in range(gpus)}
        self.elapsed = {i: 0.0 for i in range(gpus)}
        self.allocated = self.freed = 0
        self.metric_return = 0
        self.metric_value: float | None = None  # set: the driver answers this whatever the counters say

    def advance(self, gpu: int, seconds: float, busy_share: float) -> None:
        self.elapsed[gpu] += seconds
        self.busy[gpu] += seconds * busy_share

    def nvmlGpmQueryDeviceSupport(self, h):
        return SimpleNamespace(isSupportedDevice=int(h in self.gpm_gpus))

    def nvmlGpmSampleAlloc(self):
        self.allocated += 1
        return SimpleNamespace(gpu=None, busy=0.0, elapsed=0.0)

    def nvmlGpmSampleGet(self, h, sample):
        self._check(h)
        sample.gpu, sample.busy, sample.elapsed = h, self.busy[h], self.elapsed[h]

    def nvmlGpmSampleFree(self, sample):
        self.freed += 1

    def nvmlGpmMetricsGet(self, got):
        first, second = got.sample1, got.sample2
        metric = got.metrics[0]
        assert (got.version, got.numMetrics, metric.metricId) == (1, 1, self.NVML_GPM_METRIC_GRAPHICS_UTIL)
        metric.nvmlReturn = self.metric_return
        span = second.elapsed - first.elapsed
        share = (second.busy - first.busy) / span if span else 0.0
        metric.value = 100.0 * share if self.metric_value is None else self.metric_value


def test_a_poll_window_on_a_gpm_gpu_is_its_counters_over_the_whole_window_not_samples():
    nv = GpmNvml()
    probe = NvmlGpuProbe(library=nv)
    window = poll_window("r1")
    opened = probe.read([0], window=window).gpu(0)  # the prelaunch read opens the window
    assert (opened.util_pct, opened.util_seconds) == (None, None)
    nv.advance(0, 240, 0.25)
    nv.rates[0] = 100  # what the rate says at the instants it is read: not the window's mean
    probe.sample()
    nv.advance(0, 60, 1.0)
    g = probe.read([0], window=window).gpu(0)
    assert g.util_pct == pytest.approx(40.0)  # (60 + 60) busy of 300 s, exactly
    assert (g.util_samples, g.util_min_pct, g.errors) == (0, None, ())
    assert g.util_seconds is not None and g.util_seconds >= 0
    assert probe.util_source(0) == "gpm"
    nv.advance(0, 100, 0.5)
    assert probe.read([0], window=window).gpu(0).util_pct == pytest.approx(50.0)  # the next window: since then
    probe.read([0])  # the guards' window opens
    guard = probe.read([0]).gpu(0)  # and keeps the rate (no guard decides on utilization)
    assert (guard.util_pct, guard.util_seconds) == (100.0, None) and guard.util_samples >= 1
    probe.close()


def test_the_periodic_sampler_has_no_work_while_every_watched_gpu_has_gpm():
    nv = GpmNvml(gpm_gpus=frozenset({0}))
    probe = NvmlGpuProbe(library=nv)
    try:
        assert probe.samples_needed()  # nothing read yet: not known
        probe.read([0], window=poll_window("r1"))
        assert not probe.samples_needed()
        sampler = probe.own_sampler(0.01)
        sampler.start()
        assert not sampler.running
        probe.read([1], window=poll_window("r2"))  # GPU 1 has no GPM: its windows need samples
        assert probe.samples_needed() and probe.util_source(1) == "rates"
        sampler.start()
        assert sampler.running
        sampler.stop()
    finally:
        probe.close()


def test_a_gpu_without_gpm_is_sampled_as_before():
    nv = GpmNvml(gpm_gpus=frozenset())
    probe = NvmlGpuProbe(library=nv)
    window = poll_window("r1")
    probe.read([0], window=window)
    nv.rates[0] = 70
    probe.sample()
    g = probe.read([0], window=window).gpu(0)
    assert (g.util_pct, g.util_samples, g.util_seconds) == (70.0, 2, None)
    assert probe.util_source(0) == "rates" and nv.allocated == 0
    probe.close()


@pytest.mark.parametrize(("answer", "value", "said"), [(999, None, "NVML error 999"),
                                                       (0, 173.0, "GPM GRAPHICS_UTIL 173 is not a percentage")])
def test_a_failed_or_impossible_gpm_metric_is_no_measurement_and_says_why(answer, value, said):
    nv = GpmNvml()
    probe = NvmlGpuProbe(library=nv)
    window = poll_window("r1")
    probe.read([0], window=window)
    nv.advance(0, 60, 0.5)
    nv.metric_return, nv.metric_value = answer, value
    g = probe.read([0], window=window).gpu(0)
    assert (g.util_pct, g.util_seconds) == (None, None)
    assert any(said in e for e in g.errors), g.errors
    nv.metric_return, nv.metric_value = 0, None
    nv.advance(0, 60, 0.75)
    assert probe.read([0], window=window).gpu(0).util_pct == pytest.approx(75.0)  # measured again from there
    probe.close()


def test_every_gpm_snapshot_is_freed_when_its_window_closes_or_the_probe_does():
    nv = GpmNvml()
    probe = NvmlGpuProbe(library=nv)
    probe.read([0], window=poll_window("r1"))
    probe.read([0], window=poll_window("r2"))
    probe.read([0], window=poll_window("r1"))  # r1's first snapshot freed, its second kept
    assert (nv.allocated, nv.freed) == (3, 1)
    probe.close_window(poll_window("r1"))
    probe.read([0])  # the worker's next read frees it (every NVML call is made there)
    assert nv.freed == 2
    probe.close()
    assert nv.freed == 3 == nv.allocated


def test_sample_before_init_does_nothing(nv):
    p = NvmlGpuProbe(library=nv)
    p.sample()
    assert p.read([0]).available


def test_device_lost_is_a_fault_that_stops_the_run_and_never_raises(nv, probe):
    probe.read([])
    nv.lost.add(1)
    probe.sample()
    view = probe.read([0, 1])
    assert view.available and view.gpu(0).faults == ()
    lost = view.gpu(1)
    assert lost.faults == ("device lost",) and lost.util_pct is None and lost.processes_known is False
    facts = LiveFacts(gpus=(1,), view=view, run_pids=frozenset(), gpu_hours_used=0, gpu_hours_projected_at_end=None,
                      seconds_since_last_record=1, process_alive=True, available_ram_bytes=None)
    assert [(a.kind, a.incident) for a in live(GuardsSpec(), facts)] == [("stop", "gpu-fault")]


def test_xid_events_are_reported_once_on_their_gpu(nv, probe):
    probe.read([])
    nv.events = [SimpleNamespace(device=1, eventType=0x8, eventData=79),
                 SimpleNamespace(device=0, eventType=0x2, eventData=0)]
    view = probe.read([0, 1])
    assert view.gpu(1).faults == ("xid 79",) and view.gpu(0).faults == ("ecc double-bit",)
    assert probe.read([0, 1]).gpu(1).faults == ()


def test_an_event_for_an_unread_gpu_waits_for_its_read(nv, probe):
    probe.read([])
    nv.events = [SimpleNamespace(device=1, eventType=0x8, eventData=48)]
    assert probe.read([0]).gpu(0).faults == ()
    assert probe.read([1]).gpu(1).faults == ("xid 48",)


def test_ecc_counter_increase_since_first_look_is_a_fault(nv, probe):
    nv.ecc[0] = 1  # already there when babysit first looked
    assert probe.read([0]).gpu(0).faults == ()
    nv.ecc[0] = 3
    assert probe.read([0]).gpu(0).faults == ("ecc uncorrectable volatile 3",)


def test_processes_named_via_psutil_and_invisible_pids_marked(nv, probe):
    nv.procs[0] = [(os.getpid(), 2 * GIB), (2**22 + 7, None)]
    g = probe.read([0]).gpu(0)
    mine, ghost = g.processes
    assert mine.pid == os.getpid() and mine.visible and "python" in mine.name.lower()
    assert mine.used_memory_bytes == 2 * GIB
    assert not ghost.visible and ghost.used_memory_bytes is None


@pytest.mark.parametrize("broken", ["nvmlDeviceGetMemoryInfo", "nvmlDeviceGetComputeRunningProcesses"])
def test_a_failing_call_is_recorded_and_defaults(nv, probe, broken):
    nv.broken.add(broken)
    g = probe.read([0]).gpu(0)
    assert any(broken in e for e in g.errors)
    if broken == "nvmlDeviceGetMemoryInfo":
        assert g.memory_used_bytes is None and g.processes_known
    else:
        assert g.processes_known is False and g.memory_total_bytes == 141 * GIB


def test_out_of_range_indices_are_left_out_for_the_guard_to_report(nv, probe):
    view = probe.read([0, 7])
    assert [g.index for g in view.gpus] == [0]
    assert view.gpu(0).name == "NVIDIA H200" and view.gpu(0).uuid == "GPU-0"


def test_a_poll_window_averages_its_whole_interval_whatever_the_guards_read(nv, probe):
    """Guard reads every few seconds must not shrink a poll's average to the last few samples."""
    probe.read([0], window="poll:r")  # the launch read opens the run's poll window
    for value in (100, 100, 10, 10, 10, 10):
        nv.rates[0] = value
        probe.sample()
        probe.read([0])  # a guard check (its own window) between every sample
    nv.rates[0] = 10
    g = probe.read([0], window="poll:r").gpu(0)
    # every sample of the interval counts: 6 timer samples, 6 taken by the guard reads, 1 by this read
    assert g.util_samples == 13 and g.util_pct == pytest.approx(490 / 13) and g.util_min_pct == 10.0
    guard = probe.read([0]).gpu(0)  # the guard's window since its last read: the poll's sample and its own
    assert guard.util_samples == 2
    probe.close_window("poll:r")
    assert probe.read([0], window="poll:r").gpu(0).util_samples == 0  # closed: a new window, not measured yet


def test_an_exited_unreaped_holder_is_marked_zombie(nv, probe):
    """NVML can still list a trainer that has exited; it is a zombie until reaped, never a holder."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    deadline = time.monotonic() + 10
    while psutil.Process(child.pid).status() != psutil.STATUS_ZOMBIE and time.monotonic() < deadline:
        time.sleep(0.02)
    try:
        nv.procs[0] = [(child.pid, GIB)]
        (proc,) = probe.read([0]).gpu(0).processes
        assert proc.zombie and proc.visible
    finally:
        child.wait()
