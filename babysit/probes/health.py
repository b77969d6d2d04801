"""GPU health through NVML: the calls that never block the guard round, the event thread, the batch read.

Three pieces, used by `NvmlGpuProbe` (babysit/probes/nvml_probe.py):

- `NvmlCaller` runs NVML work on one worker thread and waits for it with a timeout. A call that does
  not return in time is itself a signal (`unresponsive`, NVIDIA/DCGM#313 saw calls block > 45 s on a
  degrading GPU): the caller returns at the deadline, and while the stuck call has not returned every
  later call answers "unresponsive" at once instead of queueing behind it. The utilization sampling
  runs ON that worker, between jobs (`every`): a sample handed to it from a thread of its own cost three
  wake-ups (the sampler's timer, the worker, the sampler again for the result), two thirds of a GPU
  daemon's on the H200 (121 a minute with 4 runs; bench/README.md, Daemon overhead); here it is one.
- `EventWatcher`: one thread for all GPUs waiting on the NVML event set (Xid critical errors,
  double-bit ECC, single-bit ECC storm, GPU unavailable, GPU recovery action, row remapping failure),
  so an event reaches the run within a second (`on_signal` wakes its guard).
- `read_fields`: every guard round's batch read of one GPU: one `nvmlDeviceGetFieldValues` (volatile
  single/double-bit ECC, remapped rows pending/failure, PCIe replays, NVLink CRC/replay/recovery
  errors, the driver's recovery action), the clock-event reasons and the temperature against its
  slowdown threshold (read once). Counters are judged against the first value seen, so a count the
  GPU had before babysit looked is never news. The batch goes through one ctypes array prepared a GPU,
  and a round in which no field changed is one tuple compared (babysit/probes/nvml_fields.py).
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import structlog

from babysit.core.gpu.health import TEMPERATURE_MARGIN_C
from babysit.core.readings import GpuSignal
from babysit.probes.nvml_fields import FIELD_VALUES, FieldBatch

log = structlog.get_logger("babysit.probes.health")

CALL_TIMEOUT_S = 2.0  # one guard round's NVML work for a run's GPUs, at most
INIT_TIMEOUT_S = 60.0  # nvmlInit and the first handles: seconds on a box of many GPUs
# The event thread's wait. NVML returns at once when an event arrives, so this bounds only how often the
# thread wakes with none: 500 ms was 120 wake-ups a minute, most of the daemon's on the H200 (229/min).
EVENT_WAIT_MS = 5000
STOP_JOIN_S = 0.2  # close() waits this long for the thread; one still in its wait is left to end by itself
WATCHER_STALE_S = 15.0  # an event wait that has not come back for this long: NVML is blocked

# event type bits (pynvml.nvmlEventType*), with the signal each becomes
EVENT_KINDS = (("nvmlEventTypeXidCriticalError", "xid"), ("nvmlEventTypeDoubleBitEccError", "ecc-dbe"),
               ("nvmlEventTypeSingleBitEccErrorStorm", "ecc-sbe-storm"),
               ("nvmlEventTypeGpuUnavailableError", "unavailable"),
               ("nvmlEventTypeGpuRecoveryAction", "recovery-action"),
               ("nvmlEventTypeDramRetirementFailure", "remap-failure"))

# field id names (pynvml.NVML_FI_DEV_*), read in one nvmlDeviceGetFieldValues call
FIELDS = {"sbe": "NVML_FI_DEV_ECC_SBE_VOL_TOTAL", "dbe": "NVML_FI_DEV_ECC_DBE_VOL_TOTAL",
          "remap_pending": "NVML_FI_DEV_REMAPPED_PENDING", "remap_failure": "NVML_FI_DEV_REMAPPED_FAILURE",
          "pcie_replay": "NVML_FI_DEV_PCIE_REPLAY_COUNTER",
          "nvlink_crc_flit": "NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL",
          "nvlink_crc_data": "NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL",
          "nvlink_replay": "NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL",
          "nvlink_recovery": "NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL",
          "recovery_action": "NVML_FI_DEV_GET_GPU_RECOVERY_ACTION"}
NVLINK = ("nvlink_crc_flit", "nvlink_crc_data", "nvlink_replay", "nvlink_recovery")
# Fields that cost a firmware round trip each and only ever warn: read once a minute, not every round.
# On the H200 the PCIe replay counter alone costs ~170 µs (GSP), every other field ~3 µs (bench/README.md).
SLOW_FIELDS = ("pcie_replay",)
SLOW_FIELD_S = 60.0
THROTTLE_MASK = 0x8 | 0x20 | 0x40 | 0x80  # HW slowdown, SW thermal, HW thermal, HW power brake


class Unresponsive(Exception):
    """NVML work did not return within its timeout (or an earlier call is still stuck)."""

    def __init__(self, gpu: int | None, seconds: float) -> None:
        super().__init__(f"NVML did not answer within {seconds:g} s")
        self.gpu = gpu
        self.seconds = seconds


class _Done:
    """A job's completion, set once by the worker: one raw lock the worker releases. A threading.Event is
    a Condition over a lock, and its wait allocates a waiter lock and runs Python bookkeeping on both
    sides; this is one C-level acquire with a timeout (the handoff was ~30 µs of a poll's GPU read on the
    H200, for a 0.9-µs NVML call: bench/README.md)."""

    __slots__ = ("_lock", "_set")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._lock.acquire()
        self._set = False

    def set(self) -> None:
        self._set = True
        self._lock.release()

    def is_set(self) -> bool:
        return self._set

    def wait(self, timeout: float) -> bool:
        """True once set, False when `timeout` s pass first; every wait after the set returns at once."""
        if self._set:
            return True
        if self._lock.acquire(timeout=timeout):
            self._lock.release()  # later waiters (a stuck job's re-check) pass too
            return True
        return self._set


@dataclass
class _Job:
    fn: Callable[[], Any]
    done: _Done = field(default_factory=_Done)
    result: Any = None
    error: BaseException | None = None
    started: float = 0.0


class NvmlCaller:
    """NVML work on one worker thread, waited for with a timeout (see the module docstring).

    `current_gpu` is set by the work itself before each per-GPU call, so a timeout names the GPU whose
    call blocked."""

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[_Job] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._stuck: _Job | None = None
        self.current_gpu: int | None = None
        self.stuck_gpu: int | None = None
        self._every: tuple[float, Callable[[], None]] | None = None  # the worker's own periodic work

    def call(self, fn: Callable[[], Any], timeout: float = CALL_TIMEOUT_S) -> Any:
        stuck = self._stuck
        if stuck is not None:
            if not stuck.done.is_set():
                raise Unresponsive(self.stuck_gpu, time.monotonic() - stuck.started)
            self._stuck, self.stuck_gpu = None, None
        self._ensure_worker()
        job = _Job(fn, started=time.monotonic())
        self._jobs.put(job)
        if not job.done.wait(timeout):
            self._stuck, self.stuck_gpu = job, self.current_gpu
            raise Unresponsive(self.current_gpu, timeout)
        if job.error is not None:
            raise job.error
        return job.result

    @property
    def stuck(self) -> bool:
        return self._stuck is not None and not self._stuck.done.is_set()

    def every(self, interval: float | None, fn: Callable[[], None] | None = None) -> None:
        """Run `fn` on the worker itself every `interval` s, between jobs; `every(None)` stops it.

        The schedule does not drift (`next += interval`) and skips the catch-up after a sleep of the
        machine, as babysit.service.sampler.Sampler's; a job queued while `fn` runs waits for it (NVML work is one
        call at a time anyway), so an `fn` that blocks in NVML is seen as the next call's timeout."""
        self._every = None if interval is None or fn is None else (float(interval), fn)
        if self._every is None and (self._thread is None or not self._thread.is_alive()):
            return  # nothing to stop: no worker started for it
        self._ensure_worker()
        self._jobs.put(_Job(_nothing))  # the worker takes up the new schedule now, not at its old date

    @property
    def periodic(self) -> bool:
        return self._every is not None

    def _ensure_worker(self) -> None:
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._work, name="babysit-nvml", daemon=True)
            self._thread.start()

    def _work(self) -> None:
        every: tuple[float, Callable[[], None]] | None = None
        next_at = 0.0
        while True:
            wanted = self._every
            if wanted is not every:  # started, stopped or changed: the first run one interval from now
                every, next_at = wanted, time.monotonic() + (wanted[0] if wanted else 0.0)
            try:
                job = self._jobs.get(timeout=None if every is None else max(0.0, next_at - time.monotonic()))
            except queue.Empty:  # the periodic work is due
                if every is not None and self._every is every:
                    self.current_gpu = None
                    try:
                        every[1]()
                    except Exception:  # a probe bug never stops sampling: the next interval tries again
                        log.exception("NVML periodic work failed")
                    next_at += every[0]
                    if time.monotonic() - next_at > 10 * every[0]:
                        next_at = time.monotonic()  # the machine slept: no burst of catch-up runs
                continue
            self.current_gpu = None  # set by the job's per-GPU calls (never at the put: a sample may be in flight)
            try:
                job.result = job.fn()
            except BaseException as exc:  # handed to the caller, who decides
                job.error = exc
            finally:
                job.done.set()


def _nothing() -> None:
    """The job that only wakes the worker (a changed schedule)."""


class WorkerSampler:
    """A probe's utilization sampling on its NvmlCaller's worker (see the module docstring), with the
    start/stop/running of babysit.service.sampler.Sampler, which the daemon starts while a run has GPUs."""

    def __init__(self, caller: NvmlCaller, sample: Callable[[], None], interval: float,
                 needed: Callable[[], bool] = lambda: True) -> None:
        self._caller = caller
        self.sample = sample
        self.interval = interval
        self._needed = needed  # False: every watched GPU has GPM, nothing to sample (probes/gpm.py)

    @property
    def running(self) -> bool:
        return self._caller.periodic

    def start(self) -> None:
        """Sample from now on, or stop when there is nothing to sample (called again at each sync)."""
        if not self._needed():
            self.stop()
        elif not self._caller.periodic:
            self._caller.every(self.interval, self.sample)

    def stop(self) -> None:
        if self._caller.periodic:
            self._caller.every(None)


@dataclass
class FieldState:
    """What one GPU's batch read remembers: the counters' first values, the slowdown threshold, the two
    prepared batches (every round's fields; those plus SLOW_FIELDS) and the last answer, so a round in
    which no field changed and none signalled is one tuple compared (nvml_fields)."""

    base: dict[str, float] = field(default_factory=dict)
    slowdown_c: float | None = None
    threshold_read: bool = False
    field_ids: list[int] | None = None  # None: not built yet; []: nvmlDeviceGetFieldValues unsupported
    names: list[str] = field(default_factory=list)
    values: dict[str, float] = field(default_factory=dict)  # the latest raw values (the bench prints them)
    unsupported: list[str] = field(default_factory=list)  # fields this GPU answered NOT_SUPPORTED: never asked again
    slow_every_s: float = SLOW_FIELD_S
    slow_read_at: float | None = None  # monotonic time SLOW_FIELDS were last read
    batches: tuple[FieldBatch, FieldBatch] | None = None  # (every round's, with SLOW_FIELDS); None: to build
    not_supported: dict[int, None] = field(default_factory=dict)  # `on` of the calls: NOT_SUPPORTED is None
    asked: FieldBatch | None = None  # the batch of the last round, its answer, and what the fields made of it
    answer: tuple[int, ...] | None = None
    field_values: dict[str, float] = field(default_factory=dict)
    fields_signalled: bool = False


def field_ids(nv: Any, state: FieldState) -> list[int]:
    if state.field_ids is None:
        pairs = [(name, getattr(nv, const, None)) for name, const in FIELDS.items()]
        pairs = [(n, c) for n, c in pairs if isinstance(c, int)]
        state.names = [n for n, _ in pairs]
        state.field_ids = [c for _, c in pairs]
    return state.field_ids


def field_batches(nv: Any, state: FieldState) -> tuple[FieldBatch, FieldBatch]:
    """The state's (every round's, with SLOW_FIELDS) batches, built once and again after a field is dropped."""
    if state.batches is None:
        ids = field_ids(nv, state)  # builds state.names too
        pairs = list(zip(state.names, ids, strict=False))
        fast = [(n, i) for n, i in pairs if n not in SLOW_FIELDS]
        state.batches = (FieldBatch(nv, [n for n, _ in fast], [i for _, i in fast]),
                         FieldBatch(nv, [n for n, _ in pairs], [i for _, i in pairs]))
        state.not_supported = {nv.NVML_ERROR_NOT_SUPPORTED: None}
    return state.batches


def field_value(nv: Any, fv: Any) -> float | None:
    """One nvmlFieldValue_t's value, or None when the GPU does not have that field."""
    if int(getattr(fv, "nvmlReturn", 0)) != 0:
        return None
    attr = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}.get(
        int(getattr(fv, "valueType", 3)), "ullVal")
    return float(getattr(fv.value, attr))


def read_fields(call: Callable[..., Any], nv: Any, h: Any, state: FieldState, now: float) -> list[GpuSignal]:
    """The batch read of one GPU (see the module docstring); `call(fn_name, *args, on=...)` is the probe's
    NVML wrapper (errors recorded, a default returned). Returns the signals the values show.

    A round that asks the same batch as the last one and gets the same answer, where the last one signalled
    nothing from the fields, keeps the last round's field values: the same answer judged against the same
    first values gives the same nothing (a first value is only ever set once)."""
    batches = state.batches or field_batches(nv, state)
    mono = time.monotonic()
    slow_due = state.slow_read_at is None or mono - state.slow_read_at >= state.slow_every_s
    if slow_due:
        state.slow_read_at = mono
    batch = batches[1] if slow_due else batches[0]
    on = state.not_supported
    got = None
    if batch.ids:
        if batch.fetch is not None:
            got = call(batch.fetch, h, default=None, on=on)
        else:
            got = call(FIELD_VALUES, h, list(batch.ids), default=None, on=on)
    answer = None if got is None else batch.answer(got)
    if answer is not None and answer == state.answer and batch is state.asked and not state.fields_signalled:
        values = state.field_values
        signals: list[GpuSignal] = []
    else:
        values = {n: v for n, v in state.values.items() if n in SLOW_FIELDS and not slow_due}
        if got is not None:
            _decode(nv, got, batch, state, values)
        signals = _field_signals(values, state, now)
        state.field_values, state.fields_signalled = values, bool(signals)
    state.asked, state.answer = batch, answer
    state.values = dict(values)
    reasons = call("nvmlDeviceGetCurrentClocksEventReasons", h, default=None, on=on)
    if reasons is not None:
        state.values["clock_event_reasons"] = float(reasons)
        if int(reasons) & THROTTLE_MASK:
            signals.append(GpuSignal("throttle", value=float(int(reasons) & THROTTLE_MASK), at=now,
                                     text=f"clock events 0x{int(reasons):x}"))
    if not state.threshold_read:
        state.threshold_read = True
        limit = call("nvmlDeviceGetTemperatureThreshold", h, getattr(nv, "NVML_TEMPERATURE_THRESHOLD_SLOWDOWN", 1),
                     default=None, on=on)
        state.slowdown_c = None if limit is None else float(limit)
    temp = call("nvmlDeviceGetTemperature", h, getattr(nv, "NVML_TEMPERATURE_GPU", 0), default=None, on=on)
    if temp is not None:
        state.values["temperature_c"] = float(temp)
        if state.slowdown_c is not None:
            state.values["slowdown_c"] = state.slowdown_c
            margin = state.slowdown_c - float(temp)
            if margin <= TEMPERATURE_MARGIN_C:
                signals.append(GpuSignal("temperature", value=margin, at=now,
                                         text=f"{float(temp):g} °C, {margin:g} °C below slowdown"))
    return signals


def _decode(nv: Any, got: Any, batch: FieldBatch, state: FieldState, values: dict[str, float]) -> None:
    """The answer's values into `values`; a field the GPU answered NOT_SUPPORTED is dropped for good."""
    unsupported = []
    for name, fv in zip(batch.names, got, strict=False):
        value = field_value(nv, fv)
        if value is not None:
            values[name] = value
        elif int(getattr(fv, "nvmlReturn", 0)) == nv.NVML_ERROR_NOT_SUPPORTED:
            unsupported.append(name)
    if unsupported:  # a GPU without NVLink never grows it: not asked again (each field costs a call)
        keep = [(n, i) for n, i in zip(state.names, field_ids(nv, state), strict=False) if n not in unsupported]
        state.names, state.field_ids = [n for n, _ in keep], [i for _, i in keep]
        state.unsupported = [*state.unsupported, *unsupported]
        state.batches = None  # built again without them


def _field_signals(values: dict[str, float], state: FieldState, now: float) -> list[GpuSignal]:
    """What the fields' values show, the counters judged against their first values."""
    signals: list[GpuSignal] = []
    for name in ("sbe", "dbe", "pcie_replay", *NVLINK):
        if name in values:
            state.base.setdefault(name, values[name])
    rose = {n: values[n] - state.base[n] for n in values if n in state.base and values[n] > state.base[n]}
    if "dbe" in rose:
        signals.append(GpuSignal("ecc-uncorrectable", value=values["dbe"], at=now,
                                 text=f"ecc uncorrectable volatile {int(values['dbe'])}"))
    if values.get("remap_failure"):
        signals.append(GpuSignal("remap-failure", value=values["remap_failure"], at=now, text="remapping failure"))
    if values.get("remap_pending"):
        signals.append(GpuSignal("remap-pending", value=values["remap_pending"], at=now, text="remapped rows pending"))
    if values.get("recovery_action"):
        code = int(values["recovery_action"])
        signals.append(GpuSignal("recovery-action", code=code, at=now, text=f"recovery action {code}"))
    if "sbe" in rose:
        signals.append(GpuSignal("ecc-sbe", value=rose["sbe"], at=now, text=f"single-bit ECC +{int(rose['sbe'])}"))
    if "pcie_replay" in rose:
        signals.append(GpuSignal("pcie-replay", value=rose["pcie_replay"], at=now,
                                 text=f"PCIe replays +{int(rose['pcie_replay'])}"))
    nvlink = sum(rose.get(n, 0.0) for n in NVLINK)
    if nvlink:
        signals.append(GpuSignal("nvlink-errors", value=nvlink, at=now, text=f"NVLink errors +{int(nvlink)}"))
    return signals


def event_mask(nv: Any) -> int:
    """Every event type babysit waits on that this pynvml knows."""
    mask = 0
    for const, _ in EVENT_KINDS:
        mask |= int(getattr(nv, const, 0) or 0)
    return mask


def event_signals(nv: Any, event_type: int, event_data: int, now: float) -> list[GpuSignal]:
    """The signals one NVML event payload carries (one event may set several type bits)."""
    out = []
    for const, kind in EVENT_KINDS:
        bit = int(getattr(nv, const, 0) or 0)
        if bit and event_type & bit:
            if kind == "xid":
                out.append(GpuSignal("xid", code=int(event_data), at=now, text=f"xid {int(event_data)}"))
            elif kind == "recovery-action":
                out.append(GpuSignal(kind, code=int(event_data), at=now, text=f"recovery action {int(event_data)}"))
            else:
                out.append(GpuSignal(kind, at=now, text={"ecc-dbe": "ecc double-bit"}.get(kind, kind)))
    return out


class EventWatcher:
    """One thread waiting on the NVML event set for every GPU (see the module docstring).

    `deliver(index, signals)` is called on this thread for each event; `heartbeat` is the monotonic time
    the last wait came back, so a wait that blocks is seen (`stale`)."""

    def __init__(self, nv: Any, event_set: Any, deliver: Callable[[int, list[GpuSignal]], None],
                 clock: Callable[[], float] = time.time) -> None:
        self._nv = nv
        self._set = event_set
        self._deliver = deliver
        self._clock = clock
        self._stop = threading.Event()
        self.heartbeat = time.monotonic()
        self.errors: list[str] = []
        self._thread = threading.Thread(target=self._loop, name="babysit-nvml-events", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> bool:
        """Ask the thread to end; True once it has. One still inside nvmlEventSetWait ends by itself when
        the wait returns (within EVENT_WAIT_MS): the caller must then leave the event set alone."""
        self._stop.set()
        self._thread.join(timeout=STOP_JOIN_S)
        return not self._thread.is_alive()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def stale(self) -> bool:
        return self.alive and time.monotonic() - self.heartbeat > WATCHER_STALE_S

    def _loop(self) -> None:
        nv = self._nv
        while not self._stop.is_set():
            began = time.monotonic()
            try:
                data = nv.nvmlEventSetWait(self._set, EVENT_WAIT_MS)
            except nv.NVMLError as exc:
                self.heartbeat = time.monotonic()
                if exc.value != nv.NVML_ERROR_TIMEOUT:
                    self.errors = [*self.errors[-9:], f"nvmlEventSetWait: {exc}"]
                    if exc.value == getattr(nv, "NVML_ERROR_UNINITIALIZED", 1):
                        return  # NVML shut down under it: the probe closed
                # a wait that came back early (a driver that does not block) must not spin
                self._stop.wait(max(0.0, EVENT_WAIT_MS / 1000 - (time.monotonic() - began)))
                continue
            except Exception as exc:  # a broken binding: say it, stop watching
                self.errors = [*self.errors[-9:], f"nvmlEventSetWait: {type(exc).__name__}: {exc}"]
                return
            self.heartbeat = time.monotonic()
            try:
                index = int(nv.nvmlDeviceGetIndex(data.device))
            except Exception as exc:  # an event of a GPU that cannot be named
                self.errors = [*self.errors[-9:], f"nvmlDeviceGetIndex: {exc}"]
                continue
            signals = event_signals(nv, int(data.eventType), int(data.eventData), self._clock())
            if signals:
                self._deliver(index, signals)
