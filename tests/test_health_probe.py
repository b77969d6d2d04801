"""The GPU health watcher (babysit/probes/health.py through NvmlGpuProbe) over an NVML stand-in at the
pynvml boundary: the stand-in raises the real `pynvml.NVMLError` codes, hands out real
`c_nvmlEventData_t` payloads from a blocking nvmlEventSetWait and real `c_nvmlFieldValue_t` arrays, and
can block a call the way a degrading GPU does. Everything above it (the event thread, the timed calls,
the batch read, the judgement, the daemon's wake) is babysit's real code."""

from __future__ import annotations

import os
import threading
import time
from types import SimpleNamespace

import pytest

from babysit.core.gpu import health as gpuhealth
from babysit.probes.gpu import NvmlGpuProbe
from babysit.service.sampler import sampler_for

pynvml = pytest.importorskip("pynvml")
from tests.nvml_standin import GIB, CFieldsStandIn, StandIn  # noqa: E402 - pynvml first: skipped without it


@pytest.fixture
def nv():
    return StandIn()


@pytest.fixture
def probe(nv):
    p = NvmlGpuProbe(library=nv, events_thread=True, call_timeout_s=0.5, slow_field_seconds=0.0)
    yield p
    if nv.block is not None:
        nv.block.set()
    p.close()


def kinds(reading) -> list[str]:
    return [s.kind for s in reading.signals]


def test_every_event_type_is_registered_before_a_launch_reads(nv, probe) -> None:
    probe.read([0])
    wanted = (pynvml.nvmlEventTypeXidCriticalError | pynvml.nvmlEventTypeDoubleBitEccError
              | pynvml.nvmlEventTypeSingleBitEccErrorStorm | pynvml.nvmlEventTypeGpuUnavailableError
              | pynvml.nvmlEventTypeGpuRecoveryAction | pynvml.nvmlEventTypeDramRetirementFailure)
    assert nv.registered == {0: wanted, 1: wanted} and probe.registered_events(1) == wanted


def test_an_xid_event_reaches_the_subscriber_within_a_second_and_the_next_read(nv, probe) -> None:
    probe.read([0, 1])
    got: list = []
    seen = threading.Event()
    probe.subscribe(lambda i, sigs: (got.append((i, sigs)), seen.set()))
    t0 = time.monotonic()
    nv.post(1, pynvml.nvmlEventTypeXidCriticalError, 79)
    assert seen.wait(1.0), "no event within a second"
    assert time.monotonic() - t0 < 1.0
    (index, (sig,)), = got
    assert (index, sig.kind, sig.code) == (1, "xid", 79)
    view = probe.read([0, 1])
    assert kinds(view.gpu(1)) == ["xid"] and view.gpu(1).faults == ("xid 79",) and not view.gpu(0).signals
    assert [(i, u, s.code) for i, u, s in probe.signals_since([1], 0.0)] == [(1, "GPU-1", 79)]
    assert probe.read([1]).gpu(1).signals == ()  # reported once


def test_each_event_payload_becomes_its_signal(nv, probe) -> None:
    probe.read([0])
    seen = threading.Event()
    got: list = []
    probe.subscribe(lambda i, sigs: (got.extend(sigs), len(got) >= 5 and seen.set()))
    nv.post(0, pynvml.nvmlEventTypeDoubleBitEccError)
    nv.post(0, pynvml.nvmlEventTypeSingleBitEccErrorStorm)
    nv.post(0, pynvml.nvmlEventTypeGpuUnavailableError)
    nv.post(0, pynvml.nvmlEventTypeGpuRecoveryAction, pynvml.NVML_GPU_RECOVERY_ACTION_NODE_REBOOT)
    nv.post(0, pynvml.nvmlEventTypeDramRetirementFailure)
    assert seen.wait(2.0)
    assert [s.kind for s in got] == ["ecc-dbe", "ecc-sbe-storm", "unavailable", "recovery-action", "remap-failure"]
    sides = [(gpuhealth.assess(s).side, gpuhealth.assess(s).stop) for s in got]
    assert sides == [("machine", True), ("warn", False), ("machine", True), ("machine", True), ("machine", True)]
    assert gpuhealth.assess(got[3]).action == "reboot"


def test_the_batch_read_judges_counters_against_their_first_value(nv, probe) -> None:
    f = nv.fields[0]
    f.update({pynvml.NVML_FI_DEV_ECC_DBE_VOL_TOTAL: 2, pynvml.NVML_FI_DEV_ECC_SBE_VOL_TOTAL: 7,
              pynvml.NVML_FI_DEV_PCIE_REPLAY_COUNTER: 100, pynvml.NVML_FI_DEV_REMAPPED_PENDING: 0,
              pynvml.NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL: 0, pynvml.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION: 0})
    first = probe.read([0]).gpu(0)
    assert first.signals == ()  # counts the GPU had before babysit looked are no news
    f[pynvml.NVML_FI_DEV_ECC_SBE_VOL_TOTAL] = 9
    f[pynvml.NVML_FI_DEV_PCIE_REPLAY_COUNTER] = 130
    f[pynvml.NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL] = 4
    nv.reasons[0] = pynvml.nvmlClocksEventReasonHwThermalSlowdown | pynvml.nvmlClocksEventReasonGpuIdle
    nv.temp[0] = 84
    warned = probe.read([0]).gpu(0)
    assert kinds(warned) == ["ecc-sbe", "pcie-replay", "nvlink-errors", "throttle", "temperature"]
    assert [s.value for s in warned.signals] == [2, 30, 4, 0x40, 3]
    assert warned.faults == ()  # warnings are not faults
    f[pynvml.NVML_FI_DEV_ECC_DBE_VOL_TOTAL] = 3
    f[pynvml.NVML_FI_DEV_REMAPPED_PENDING] = 1
    f[pynvml.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION] = pynvml.NVML_GPU_RECOVERY_ACTION_GPU_RESET
    bad = probe.read([0]).gpu(0)
    assert kinds(bad)[:3] == ["ecc-uncorrectable", "remap-pending", "recovery-action"]
    assert bad.faults[:3] == ("ecc uncorrectable volatile 3", "remapped rows pending", "recovery action 1")
    assert probe.health_values(0)["temperature_c"] == 84 and probe.health_values(0)["slowdown_c"] == 87


def test_gpu_is_lost_is_gpu_lost(nv, probe) -> None:
    probe.read([0, 1])
    nv.lost.add(1)
    view = probe.read([0, 1])
    assert "lost" in kinds(view.gpu(1)) and view.gpu(1).faults == ("device lost",)
    assert gpuhealth.assess(view.gpu(1).signals[-1]).stop


def test_a_blocking_nvml_call_is_gpu_unresponsive_and_never_blocks_the_next_round(nv, probe) -> None:
    probe.read([0, 1])
    nv.block, nv.block_gpu = threading.Event(), 1
    t0 = time.monotonic()
    view = probe.read([0, 1])
    assert time.monotonic() - t0 < 1.5  # the 0.5 s timeout, not the blocked call
    assert kinds(view.gpu(1)) == ["unresponsive"] and gpuhealth.assess(view.gpu(1).signals[0]).machine
    assert view.gpu(0).signals == () and view.gpu(0).processes_known is False  # not measured this round
    t1 = time.monotonic()
    again = probe.read([0])  # the stuck call still has not returned: answered at once, not queued behind it
    assert time.monotonic() - t1 < 0.2 and again.gpu(0).errors == ("not read: NVML is blocked on GPU 1",)
    probe.sample()  # the sampler too returns at once
    nv.block.set()
    deadline = time.monotonic() + 10  # the stuck call returns on its own thread: a loaded box may take a while
    while (healthy := probe.read([0, 1])).gpu(1).signals and time.monotonic() < deadline:
        time.sleep(0.05)
    assert healthy.gpu(1).signals == () and healthy.gpu(1).processes_known


def test_the_event_thread_waits_rather_than_spinning(nv, probe) -> None:
    probe.read([0])
    before = nv.waits
    time.sleep(1.2)
    assert nv.waits - before <= 4  # ~500 ms waits


def test_a_field_the_gpu_does_not_have_is_not_asked_for_again(nv, probe) -> None:
    nv.fields[0].update({pynvml.NVML_FI_DEV_ECC_DBE_VOL_TOTAL: 0})  # no NVLink, no remapping here
    asked: list[list[int]] = []
    real = nv.nvmlDeviceGetFieldValues
    nv.nvmlDeviceGetFieldValues = lambda h, ids: (asked.append(list(ids)), real(h, ids))[1]
    probe.read([0])
    probe.read([0])
    assert len(asked[0]) == 10 and asked[-1] == [pynvml.NVML_FI_DEV_ECC_DBE_VOL_TOTAL]
    assert "nvlink_crc_flit" in probe._fields[0].unsupported


def test_the_costly_warn_only_fields_are_read_once_a_minute(nv) -> None:
    p = NvmlGpuProbe(library=nv, events_thread=False)  # the default cadence
    try:
        nv.fields[0].update({pynvml.NVML_FI_DEV_ECC_DBE_VOL_TOTAL: 0, pynvml.NVML_FI_DEV_PCIE_REPLAY_COUNTER: 5})
        asked: list[list[int]] = []
        real = nv.nvmlDeviceGetFieldValues
        nv.nvmlDeviceGetFieldValues = lambda h, ids: (asked.append(list(ids)), real(h, ids))[1]
        p.read([0])
        p.read([0])
        assert pynvml.NVML_FI_DEV_PCIE_REPLAY_COUNTER in asked[0]
        assert asked[-1] == [pynvml.NVML_FI_DEV_ECC_DBE_VOL_TOTAL]  # not this round: its value is kept
        assert p.health_values(0)["pcie_replay"] == 5
        p._fields[0].slow_read_at = -1e9  # a minute later
        nv.fields[0][pynvml.NVML_FI_DEV_PCIE_REPLAY_COUNTER] = 9
        assert [s.kind for s in p.read([0]).gpu(0).signals] == ["pcie-replay"]
    finally:
        p.close()


F = SimpleNamespace(sbe=pynvml.NVML_FI_DEV_ECC_SBE_VOL_TOTAL, dbe=pynvml.NVML_FI_DEV_ECC_DBE_VOL_TOTAL,
                    pcie=pynvml.NVML_FI_DEV_PCIE_REPLAY_COUNTER, pending=pynvml.NVML_FI_DEV_REMAPPED_PENDING,
                    crc=pynvml.NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL,
                    action=pynvml.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION)


def said(reading) -> tuple:
    """Everything a reading says of the GPU's health (the signals' times aside: each probe has its own clock)."""
    return (tuple((s.kind, s.code, s.value, s.text) for s in reading.signals), reading.faults, reading.errors)


def health_rounds(nv, slow_field_seconds: float = 0.0) -> tuple[list[tuple], list[dict], NvmlGpuProbe]:
    """One GPU's reads through a sequence of field changes, steady rounds between them: what each said."""
    f = nv.fields[0]
    steps = [
        {F.dbe: 2, F.sbe: 7, F.pcie: 100, F.pending: 0, F.crc: 0, F.action: 0},  # before babysit looked
        {},  # steady
        {F.sbe: 9, F.pcie: 130, F.crc: 4, "reasons": pynvml.nvmlClocksEventReasonHwThermalSlowdown, "temp": 84},
        {},  # the same again: said again (a count above its first value)
        {F.dbe: 3, F.pending: 1, F.action: pynvml.NVML_GPU_RECOVERY_ACTION_GPU_RESET},
        {},
        {F.dbe: 2, F.sbe: 7, F.pcie: 100, F.pending: 0, F.crc: 0, F.action: 0, "reasons": 0, "temp": 40},
        {},  # steady, healthy: the round that compares one tuple
        {},
        {"reasons": None},  # steady fields, no clock reasons this round: none kept from the last
        {F.dbe: 5, "reasons": 0},  # after steady rounds: still seen
    ]
    probe = NvmlGpuProbe(library=nv, events_thread=False, slow_field_seconds=slow_field_seconds)
    out, values = [], []
    for step in steps:
        for key, value in step.items():
            if key == "reasons":
                nv.reasons[0] = value
            elif key == "temp":
                nv.temp[0] = value
            else:
                f[key] = value
        out.append(said(probe.read([0]).gpu(0)))
        values.append(probe.health_values(0))
    return out, values, probe


def test_the_prepared_array_says_what_pynvmls_wrapper_says_round_after_round() -> None:
    """The field batch through one array prepared a GPU (nvml_fields.FieldBatch) against the same rounds through
    pynvml's wrapper: the same signals, faults, errors and values each round, and the C function is called
    once a read with an array that comes in as pynvml builds it (nothing left of the last answer)."""
    wrapped, prepared = StandIn(gpus=1), CFieldsStandIn(gpus=1)
    said_wrapped, values_wrapped, p1 = health_rounds(wrapped)
    said_prepared, values_prepared, p2 = health_rounds(prepared)
    try:
        assert p1._fields[0].batches[1].fetch is None  # the stand-in replaced the wrapper: it is called
        assert p2._fields[0].batches[1].fetch is not None
        assert said_prepared == said_wrapped and values_prepared == values_wrapped
        warned = ["ecc-sbe", "pcie-replay", "nvlink-errors", "throttle", "temperature"]
        bad = ["ecc-uncorrectable", "remap-pending", "recovery-action", *warned]
        assert [[k for k, *_ in signals] for signals, _, _ in said_prepared] == [
            [], [], warned, warned, bad, bad, [], [], [], [], ["ecc-uncorrectable"]]
        assert "clock_event_reasons" in values_prepared[8] and "clock_event_reasons" not in values_prepared[9]
        assert said_prepared[-1][1] == ("ecc uncorrectable volatile 5",)
        assert values_prepared[-1]["dbe"] == 5 and values_prepared[-1]["sbe"] == 7
        calls_before = len(prepared.c_asked)
        lookups_before = prepared.lookups
        for _ in range(5):
            p2.read([0])
        assert len(prepared.c_asked) == calls_before + 5 and prepared.lookups == lookups_before  # looked up once
        assert prepared.dirty == []
    finally:
        p1.close()
        p2.close()


def test_the_prepared_array_drops_a_field_the_gpu_does_not_have() -> None:
    nv = CFieldsStandIn(gpus=1)
    nv.fields[0].update({F.dbe: 0})  # no NVLink, no remapping here
    p = NvmlGpuProbe(library=nv, events_thread=False, slow_field_seconds=0.0)
    try:
        p.read([0])
        p.read([0])
        assert len(nv.c_asked[0]) == 10 and nv.c_asked[-1] == [F.dbe]
        assert "nvlink_crc_flit" in p._fields[0].unsupported
        nv.fields[0][F.crc] = 5
        p.read([0])
        assert nv.c_asked[-1] == [F.dbe]  # never asked again
    finally:
        p.close()


def test_the_prepared_array_keeps_the_costly_fields_cadence() -> None:
    nv = CFieldsStandIn(gpus=1)
    p = NvmlGpuProbe(library=nv, events_thread=False)  # the default cadence
    try:
        nv.fields[0].update({F.dbe: 0, F.pcie: 5})
        p.read([0])
        p.read([0])
        p.read([0])
        assert F.pcie in nv.c_asked[0] and nv.c_asked[-2:] == [[F.dbe], [F.dbe]]  # not these rounds: kept
        assert p.health_values(0)["pcie_replay"] == 5
        p._fields[0].slow_read_at = -1e9  # a minute later
        nv.fields[0][F.pcie] = 9
        assert [s.kind for s in p.read([0]).gpu(0).signals] == ["pcie-replay"]
        assert nv.c_asked[-1] == [F.dbe, F.pcie]
        assert [s.kind for s in p.read([0]).gpu(0).signals] == ["pcie-replay"]  # the kept value, said again
        assert nv.c_asked[-1] == [F.dbe]
    finally:
        p.close()


@pytest.mark.parametrize("code", [pynvml.NVML_ERROR_UNKNOWN, pynvml.NVML_ERROR_GPU_IS_LOST])
def test_an_nvml_error_in_the_prepared_batch_is_recorded_as_the_wrappers(code) -> None:
    wrapped, prepared = StandIn(gpus=1), CFieldsStandIn(gpus=1)
    real = wrapped.nvmlDeviceGetFieldValues
    failing = [False]

    def fields(h, ids):
        if failing[0]:
            raise pynvml.NVMLError(code)
        return real(h, ids)

    wrapped.nvmlDeviceGetFieldValues = fields
    readings = []
    for nv in (wrapped, prepared):
        nv.fields[0].update({F.dbe: 1, F.pending: 0})
        p = NvmlGpuProbe(library=nv, events_thread=False, slow_field_seconds=0.0)
        try:
            p.read([0])
            p.read([0])  # steady
            failing[0], prepared.fail_with = True, code
            nv.fields[0][F.dbe] = 4
            bad = p.read([0]).gpu(0)
            failing[0], prepared.fail_with = False, None
            readings.append((said(bad), p.health_values(0), said(p.read([0]).gpu(0))))
        finally:
            p.close()
    assert readings[0] == readings[1]
    (signals, faults, errors), values, after = readings[1]
    assert errors == (f"nvmlDeviceGetFieldValues: {pynvml.NVMLError(code)}",) and "dbe" not in values
    if code == pynvml.NVML_ERROR_GPU_IS_LOST:
        assert faults == ("device lost",)
    else:
        assert signals == () and after[0][0][:2] == ("ecc-uncorrectable", None)  # seen once it answers again


def test_without_nvmls_field_function_the_wrapper_is_called_and_its_error_recorded() -> None:
    nv = CFieldsStandIn(gpus=1, has_field_values=False)
    p = NvmlGpuProbe(library=nv, events_thread=False)
    try:
        reading = p.read([0]).gpu(0)
        assert p._fields[0].batches[0].fetch is None and nv.c_asked == []
        assert reading.errors == (f"nvmlDeviceGetFieldValues: {pynvml.NVMLError(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)}",)
        assert reading.processes_known and reading.memory_used_bytes == 3 * GIB  # the rest of the read goes on
    finally:
        p.close()


def test_an_event_wait_that_blocks_is_said_on_every_reading(nv, probe, monkeypatch) -> None:
    probe.read([0])
    monkeypatch.setattr(probe._watcher, "heartbeat", time.monotonic() - 100)
    errors = probe.read([0, 1]).gpu(1).errors
    assert any("the NVML event wait has not returned for 100 s" in e for e in errors), errors


def test_a_reading_probe_without_health_events_has_no_event_set_thread_or_wait(nv) -> None:
    """The fleet's GPU report and /babysit gpus read who holds the GPUs through a probe of their own: it
    registers no event, starts no event thread and never waits on one (before: a second event thread,
    waking every few seconds, for a probe read once a renewal)."""
    before = {t.name for t in threading.enumerate()}
    p = NvmlGpuProbe(library=nv, events_thread=True, health_events=False)
    try:
        view = p.read([])
        time.sleep(0.6)
        assert view.available and [g.index for g in view.gpus] == [0, 1]
        assert nv.registered == {} and nv.waits == 0
        assert "babysit-nvml-events" not in {t.name for t in threading.enumerate()} - before, threading.enumerate()
    finally:
        p.close()


def voluntary_switches() -> dict[int, int]:
    """Each thread of this process: its voluntary context switches (one a return from a sleep or wait)."""
    out = {}
    for tid in os.listdir("/proc/self/task"):
        with open(f"/proc/self/task/{tid}/status") as f:
            out[int(tid)] = next(int(line.split()[1]) for line in f if line.startswith("voluntary_ctxt_switches"))
    return out


def test_the_daemons_sampler_samples_on_the_nvml_worker_one_wake_up_a_sample(nv) -> None:
    # before: a "gpu-sampler" thread handed each sample to the NVML worker and waited for it: ~5 wake-ups a
    # sample (its timer, the worker, the result, the GIL), 121 a minute for a 4-run GPU daemon on the H200
    probe = NvmlGpuProbe(library=nv, events_thread=False)
    try:
        probe.read([0, 1])
        sampler = sampler_for(probe, 0.02)
        time.sleep(0.05)
        before, reads = voluntary_switches(), len(nv.util_threads)
        sampler.start()
        sampler.start()  # a second start is the same schedule
        assert sampler.running
        time.sleep(1.0)
        sampler.stop()
        after, samples = voluntary_switches(), (len(nv.util_threads) - reads) // 2  # 2 watched GPUs
        assert not sampler.running
        assert samples >= 10, samples  # ~50 at 0.02 s
        assert set(nv.util_threads[reads:]) == {"babysit-nvml"}
        assert not [t for t in threading.enumerate() if t.name == "gpu-sampler"]
        woken = sum(n - before.get(tid, 0) for tid, n in after.items())
        assert woken <= 1.5 * samples + 5, (woken, samples)  # one a sample (+ the start, the stop, this thread)
        stopped_at = len(nv.util_threads)
        time.sleep(0.1)
        assert len(nv.util_threads) == stopped_at
        view = probe.read([0])
        assert view.gpu(0).util_pct == 80 and view.gpu(0).util_samples >= samples
    finally:
        probe.close()


def test_a_sample_that_blocks_in_nvml_is_the_next_reads_unresponsive_and_stops_nothing(nv) -> None:
    probe = NvmlGpuProbe(library=nv, events_thread=False, call_timeout_s=0.5)
    sampler = sampler_for(probe, 0.02)
    try:
        probe.read([0, 1])
        nv.block_util, nv.block_gpu = threading.Event(), 1
        sampler.start()
        deadline = time.monotonic() + 5
        while nv.util_threads.count("babysit-nvml") < 2 + 1 + 1 and time.monotonic() < deadline:
            time.sleep(0.01)  # the read's two, then a sample's GPU 0 and GPU 1, where it blocks
        t0 = time.monotonic()
        view = probe.read([0, 1])
        assert time.monotonic() - t0 < 1.5  # the 0.5 s timeout, not the blocked sample
        assert kinds(view.gpu(1)) == ["unresponsive"]
        assert view.gpu(0).errors == ("not read: NVML is blocked on GPU 1",)
        t1 = time.monotonic()
        assert kinds(probe.read([1]).gpu(1)) == ["unresponsive"] and time.monotonic() - t1 < 0.2  # at once
        nv.block_util.set()
        time.sleep(0.1)
        healthy = probe.read([0, 1])
        assert healthy.gpu(1).signals == () and healthy.gpu(1).processes_known
        assert sampler.running  # sampling goes on after the GPU answers again
    finally:
        sampler.stop()
        if nv.block_util is not None:
            nv.block_util.set()
        probe.close()


def test_closing_a_sampled_probe_makes_no_nvml_call_after_its_shutdown(nv) -> None:
    calls_after: list[str] = []
    shut = threading.Event()
    real_util, real_shutdown = nv.nvmlDeviceGetUtilizationRates, nv.nvmlShutdown

    def util(h):
        if shut.is_set():
            calls_after.append("nvmlDeviceGetUtilizationRates")
        return real_util(h)

    def shutdown():
        shut.set()
        return real_shutdown()

    nv.nvmlDeviceGetUtilizationRates, nv.nvmlShutdown = util, shutdown
    probe = NvmlGpuProbe(library=nv, events_thread=False)
    probe.read([0, 1])
    sampler = sampler_for(probe, 0.001)
    sampler.start()
    time.sleep(0.1)
    probe.close()
    assert shut.is_set() and not sampler.running
    time.sleep(0.1)
    assert calls_after == []


def test_a_timed_jobs_completion_wakes_its_waiter_times_out_unset_and_stays_set() -> None:
    """The handoff's completion (health._Done, one raw lock instead of an Event's Condition): the waiter
    wakes when the worker sets it, a wait on an unset one returns False at its timeout, and once set every
    later wait (the stuck job's re-check in NvmlCaller.call) returns True at once."""
    from babysit.probes import health

    unset = health._Done()
    t0 = time.monotonic()
    assert unset.wait(0.05) is False and not unset.is_set()
    assert time.monotonic() - t0 >= 0.04
    done = health._Done()
    woke: list[bool] = []
    waiter = threading.Thread(target=lambda: woke.append(done.wait(10.0)))
    waiter.start()
    time.sleep(0.05)
    done.set()
    waiter.join(5.0)
    assert woke == [True] and done.is_set()
    assert done.wait(0.0) is True and done.wait(0.0) is True  # set once, every later wait passes
    caller = health.NvmlCaller()
    assert [caller.call(lambda i=i: i * i) for i in range(50)] == [i * i for i in range(50)]
    with pytest.raises(ZeroDivisionError):
        caller.call(lambda: 1 / 0)  # the job's error is the caller's
