"""NvmlGpuProbe's own logic (window averaging, fallbacks, faults, errors) over an injected stand-in for
the pynvml module: the probe is real, only the driver underneath is simulated. The same probe runs
against the real driver in tests/gpu/."""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest

from babysit.guards import LiveFacts, live
from babysit.probes.gpu import NvmlGpuProbe
from babysit.spec import GuardsSpec

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
        self.samples: dict[int, list[tuple[int, int]]] = {i: [] for i in range(gpus)}
        self.rates: dict[int, int] = {i: 0 for i in range(gpus)}
        self.samples_supported = True
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

    def nvmlDeviceGetSamples(self, h, kind, last):
        self._check(h)
        if not self.samples_supported:
            raise self.NVMLError(self.NVML_ERROR_NOT_SUPPORTED)
        new = [(t, v) for t, v in self.samples[h] if t > last]
        if not new:
            raise self.NVMLError(self.NVML_ERROR_NOT_FOUND)
        return 1, [SimpleNamespace(timeStamp=t, sampleValue=SimpleNamespace(uiVal=v)) for t, v in new]

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


def test_util_averages_samples_since_the_last_read_skipping_older_ones(nv, probe):
    nv.samples[0] = [(1, 5), (2, 5)]  # before the probe looked: not this window's
    probe.read([0])
    nv.samples[0] += [(3, 90), (4, 100)]
    probe.sample()
    nv.samples[0] += [(5, 95)]
    g = probe.read([0]).gpu(0)
    assert (g.util_pct, g.util_samples) == (95.0, 3)
    g = probe.read([0]).gpu(0)  # no new samples: not measured, not zero
    assert (g.util_pct, g.util_samples, g.errors) == (None, 0, ())


def test_util_falls_back_to_rates_without_a_sample_buffer(nv, probe):
    nv.samples_supported = False
    probe.read([0])
    for value in (80, 100):
        nv.rates[0] = value
        probe.sample()
    nv.rates[0] = 60
    g = probe.read([0]).gpu(0)  # read() takes a last sample too
    assert (g.util_pct, g.util_samples) == (80.0, 3)


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
