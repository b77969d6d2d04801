"""GPU probe: utilization, memory, compute processes and faults, through NVML or an injected file.

Every pynvml call goes through one wrapper (`NvmlGpuProbe._nvml`) that returns a default and records
the error, so a driver hiccup becomes a reading with `errors` and a None, never an exception in the
daemon. A machine without a driver gives `GpuView(available=False, reason=...)`, and the reason ends
with the fix: "not measured" must never read as "fine".

Utilization is a *window average*: the daemon calls `sample()` every `[daemon].gpu_sample_seconds` (2 s
unless set) and `read(indices, window)`
at each guard check or poll; `util_pct` (and `util_min_pct`) cover every sample since the previous read
of that GPU *in the same window*. Windows are independent: a run's polls read `poll:<run>`, which its
prelaunch read opens, so a poll averages its whole interval however often the guards read. By default
each sample is nvmlDeviceGetUtilizationRates (~1 µs on an H200; itself an average over the driver's
last sampling period). NVML's own sample buffer (nvmlDeviceGetSamples) would miss nothing between calls,
but it measured ~2 ms a call on the H200, 2000x the cost, and holds only the last 14 s
(bench/gpu_util_window.py).

A poll window (`poll_window(run)`) on a GPU with GPM (GPU Performance Monitoring: Hopper and later) is
measured instead from the GPU's own activity counters, one snapshot at each end of the window
(nvmlGpmSampleGet; nvmlGpmMetricsGet's GRAPHICS_UTIL, the same "any kernel running" share as the rate):
exact over the whole window, where samples are an estimate, and with no timer between (the sampler
leaves such GPUs alone, `samples_needed`). On the H200 over 10-60 s windows of a 4-s-on/4-s-off load it
read 51.7 % where a 1-s sampler read 51.3 and the driver's 200-ms samples 52-57; a snapshot costs ~46 µs
and the metrics ~0.9 ms, once a poll (bench/README.md, section 11). Other windows (the guards', which
decide on no utilization; the fleet report's) keep the rate, read when they read.

GPU indices are NVML indices (nvidia-smi order, i.e. PCI bus order): the executor should export
CUDA_DEVICE_ORDER=PCI_BUS_ID so CUDA numbers the run's GPUs the same way.

Long on purpose: the NVML probe (sampling windows, health events, the per-call wrapper), its file-fed twin
for tests and CI, and the null probe give one `GpuView`; kept together so the three cannot drift apart.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from babysit.core import gpuhealth
from babysit.core.errors import BadInput
from babysit.core.readings import GpuProcess, GpuReading, GpuSignal, GpuView
from babysit.probes import health
from babysit.probes.host import process_state

HISTORY = 512  # health signals kept for the exit's classification (signals_since)
NO_DRIVER_FIX = "install the NVIDIA driver and nvidia-ml-py matching it (`nvidia-smi` must work)"



GUARD_WINDOW = "guard"
POLL_WINDOW = "poll:"  # the prefix of a run's poll window: GPM-measured where the GPU has GPM


def poll_window(run: str) -> str:
    """The window a run's polls average over, opened by its prelaunch read (run/run_launch.py)."""
    return f"{POLL_WINDOW}{run}"


class GpuProbe(Protocol):
    def sample(self) -> None: ...
    def read(self, indices: Sequence[int], window: str = GUARD_WINDOW) -> GpuView: ...
    def close_window(self, window: str) -> None:
        """Forget a reader's window (a run that ended), so samples stop feeding it."""
    def close(self) -> None: ...


@dataclass
class _Window:
    """One reader's running utilization sum for one GPU since that reader's last read."""

    total: float = 0.0
    count: int = 0
    low: float = float("inf")

    def add(self, value: float) -> None:
        self.total += value
        self.count += 1
        self.low = min(self.low, value)


class NvmlGpuProbe:
    """The real probe. Thread-safe: sample() may run on a timer thread while read() runs elsewhere.

    `library` is the pynvml module (imported lazily when None); tests inject a stand-in with the same
    functions to exercise the sampling and fault logic on machines without a GPU.

    Health (babysit/probes/health.py): with `events_thread` (the default for the real pynvml) one thread
    waits on the NVML event set and hands each event to the subscribers (`subscribe`) within a second;
    without it, read() drains the set. Every read() runs its NVML calls on a worker with a timeout
    (`call_timeout_s`): a GPU whose call blocks is read as `unresponsive`, never a blocked guard round.
    """

    def __init__(self, *, library: Any = None, events_thread: bool | None = None,
                 call_timeout_s: float = health.CALL_TIMEOUT_S, clock: Callable[[], float] = time.time,
                 slow_field_seconds: float = health.SLOW_FIELD_S, health_events: bool = True) -> None:
        self._lock = threading.Lock()
        self._events_thread = (library is None) if events_thread is None else events_thread
        # False: a probe that reads who holds the GPUs (a fleet's GPU report, /babysit gpus) and waits for
        # no Xid/ECC event: no event set, no event thread, none of its wake-ups (the guards' probe has them)
        self._health_events = health_events
        self._call_timeout = call_timeout_s
        self._slow_field_s = slow_field_seconds  # the costly warn-only fields' cadence (health.SLOW_FIELDS)
        self._clock = clock
        self._caller = health.NvmlCaller()
        self._watcher: health.EventWatcher | None = None
        self._fields: dict[int, health.FieldState] = {}
        self._calls: dict[int, Callable[..., Any]] = {}  # gpu -> its wrapper for the health batch (_call_for)
        self._sig_lock = threading.Lock()  # the event thread adds, read() takes
        self._pending: dict[int, list[GpuSignal]] = {}
        self._history: deque[tuple[int, str, GpuSignal]] = deque(maxlen=HISTORY)
        self._listeners: list[Callable[[int, tuple[GpuSignal, ...]], None]] = []
        self._registered: dict[int, int] = {}  # gpu -> the event mask registered on it
        self._nv: Any = library
        self._ok = False
        self._reason: str | None = "NVML not initialised yet"
        self._count = 0
        self._handles: dict[int, Any] = {}
        self._sampled: set[int] = set()  # GPUs whose rate was read at least once (util_source)
        self._windows: dict[int, dict[str, _Window]] = {}  # gpu -> window name -> running sum
        self._events: Any = None
        self._ecc_base: dict[int, int] = {}
        self._lost: set[int] = set()
        self._errors: dict[int | None, list[str]] = {}
        self._watched: set[int] = set()  # GPUs read() was asked about: the only ones sample() samples
        self._ident: dict[int, tuple[str, str]] = {}  # name and UUID never change: asked once
        self._gpm: dict[int, bool] = {}  # gpu -> its poll windows are measured by GPM counters
        self._marks: dict[int, dict[str, tuple[Any, float]]] = {}  # gpu -> poll window -> (GPM snapshot, at)
        self._unfreed: list[Any] = []  # GPM snapshots of closed windows, freed on the worker's next read

    # -- the one wrapper ------------------------------------------------------------------------

    def _nvml(self, fn: str | Any, *args: Any, default: Any = None, gpu: int | None = None,
              on: Mapping[int, Any] | None = None) -> Any:
        """Call pynvml.<fn>(*args); on failure return `default` (or on[code]) and record the error.

        Codes listed in `on` are expected answers (NOT_FOUND: no new samples, TIMEOUT: no event),
        not errors. GPU_IS_LOST marks the GPU lost, which becomes the fault "device lost".
        """
        nv = self._nv
        if not isinstance(fn, str):  # a helper of this module that calls NVML itself
            call, fn = fn, fn.__name__
        else:
            call = getattr(nv, fn, None) or _missing(fn)
        self._caller.current_gpu = gpu  # a timeout names the GPU whose call blocked
        try:
            return call(*args)
        except nv.NVMLError as exc:
            code = exc.value
            if on is not None and code in on:
                return on[code]
            if code == nv.NVML_ERROR_GPU_IS_LOST and gpu is not None:
                self._lost.add(gpu)
            self._errors.setdefault(gpu, []).append(f"{fn}: {exc}")
            return default
        except (AttributeError, OSError, TypeError, ValueError) as exc:  # pynvml too old, symbol missing
            self._errors.setdefault(gpu, []).append(f"{fn}: {type(exc).__name__}: {exc}")
            return default

    # -- lifecycle ------------------------------------------------------------------------------

    def _ensure_init(self) -> bool:
        if self._ok:
            return True
        if self._nv is None:
            try:
                import pynvml
            except ImportError:
                self._reason = "nvidia-ml-py is not installed — pip install nvidia-ml-py"
                return False
            self._nv = pynvml
        nv = self._nv
        failed = object()
        self._errors.clear()
        if self._nvml("nvmlInit", default=failed) is failed:
            self._reason = _init_reason(nv, self._errors.get(None, ["?"])[-1])
            return False
        count = self._nvml("nvmlDeviceGetCount", default=None)
        if not count:
            seen = "; ".join(self._errors.get(None, ["device count 0"]))
            self._reason = f"NVML sees no GPU ({seen}) — check `nvidia-smi`; declare gpus = [] for a CPU run"
            self._nvml("nvmlShutdown")
            return False
        self._ok, self._reason, self._count = True, None, int(count)
        self._events = self._nvml("nvmlEventSetCreate", default=None) if self._health_events else None
        for i in range(self._count):
            self._handle(i)
        self._errors.clear()
        if self._events is not None and self._events_thread and self._watcher is None:
            self._watcher = health.EventWatcher(nv, self._events, self._deliver, self._clock)
            self._watcher.start()
        return True

    def _handle(self, i: int) -> Any:
        h = self._handles.get(i)
        if h is None and i not in self._lost:
            h = self._nvml("nvmlDeviceGetHandleByIndex", i, default=None, gpu=i)
            if h is not None:
                self._handles[i] = h
                self._register_events(i, h)
                self._gpm[i] = self._gpm_supported(i, h)
                nv = self._nv
                if hasattr(nv, "nvmlDeviceGetFieldValues"):  # the batch read's first values are the base
                    self._fields[i] = health.FieldState(slow_every_s=self._slow_field_s)
                    health.read_fields(self._call_for(i), nv, h, self._fields[i], self._clock())
                else:
                    base = self._nvml("nvmlDeviceGetTotalEccErrors", h, nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
                                      nv.NVML_VOLATILE_ECC, default=None, gpu=i,
                                      on={nv.NVML_ERROR_NOT_SUPPORTED: None})
                    if base is not None:
                        self._ecc_base[i] = int(base)
        return h

    def _gpm_supported(self, i: int, h: Any) -> bool:
        nv = self._nv
        if not hasattr(nv, "nvmlGpmQueryDeviceSupport"):
            return False
        support = self._nvml("nvmlGpmQueryDeviceSupport", h, default=None, gpu=i,
                             on={nv.NVML_ERROR_NOT_SUPPORTED: None})
        return bool(support is not None and support.isSupportedDevice)

    def samples_needed(self) -> bool:
        """Whether the periodic sampler has work: a watched GPU without GPM (or none read yet)."""
        watched = tuple(self._watched)
        return not watched or not all(self._gpm.get(i, False) for i in watched)

    def _call_for(self, i: int) -> Callable[..., Any]:
        """GPU `i`'s NVML wrapper for the health batch (made once a GPU: every read passes it)."""
        call = self._calls.get(i)
        if call is None:
            def call(fn: str | Callable[..., Any], *args: Any, default: Any = None,
                     on: Mapping[int, Any] | None = None) -> Any:
                return self._nvml(fn, *args, default=default, gpu=i, on=on)
            self._calls[i] = call
        return call

    def _register_events(self, i: int, h: Any) -> None:
        nv = self._nv
        if self._events is None:
            return
        wanted = health.event_mask(nv)
        supported = self._nvml("nvmlDeviceGetSupportedEventTypes", h, default=0, gpu=i,
                               on={nv.NVML_ERROR_NOT_SUPPORTED: 0})
        mask = int(supported) & wanted
        if mask:
            failed = object()
            got = self._nvml("nvmlDeviceRegisterEvents", h, mask, self._events, default=failed, gpu=i,
                             on={nv.NVML_ERROR_NOT_SUPPORTED: failed})
            if got is not failed:
                self._registered[i] = mask

    def registered_events(self, index: int) -> int:
        """The NVML event mask registered on GPU `index` (0: none: the GPU supports none of them)."""
        return self._registered.get(index, 0)

    def subscribe(self, listener: Callable[[int, tuple[GpuSignal, ...]], None]) -> None:
        """`listener(index, signals)` on the event thread for every NVML event (the daemon wakes the runs
        on that GPU). It must return quickly and never raise."""
        self._listeners.append(listener)

    def signals_since(self, indices: Sequence[int], since: float) -> list[tuple[int, str, GpuSignal]]:
        """Every health signal seen on `indices` at or after `since` (wall time): (gpu, uuid, signal)."""
        wanted = set(indices)
        with self._sig_lock:
            return [(i, u, s) for i, u, s in self._history if i in wanted and (s.at or 0.0) >= since]

    def health_values(self, index: int) -> dict[str, float]:
        """The newest raw values of GPU `index`'s batch read (the bench and the GPU tests print them)."""
        state = self._fields.get(index)
        return dict(state.values) if state is not None else {}

    def _deliver(self, index: int, signals: list[GpuSignal]) -> None:
        uuid = self._ident.get(index, ("?", "?"))[1]
        with self._sig_lock:
            self._pending.setdefault(index, []).extend(signals)
            for sig in signals:
                self._history.append((index, uuid, sig))
        for listener in list(self._listeners):
            try:
                listener(index, tuple(signals))
            except Exception:  # a listener's bug must not end the event thread
                pass

    def _note(self, index: int, signals: Sequence[GpuSignal]) -> None:
        """Signals a read found (fields, a lost GPU): kept for signals_since, not delivered again."""
        if signals:
            uuid = self._ident.get(index, ("?", "?"))[1]
            with self._sig_lock:
                for sig in signals:
                    self._history.append((index, uuid, sig))

    def close(self) -> None:
        with self._lock:
            self._caller.every(None)  # no sample after this
            waiting = False  # the event thread still in its NVML wait: the set and NVML stay (exit frees them)
            if self._watcher is not None:
                waiting = not self._watcher.stop()
                self._watcher = None
            if self._ok and not self._caller.stuck and not waiting:
                def shut() -> None:  # on the worker: after a sample in flight there, never beside it
                    self._free_marks([m for marks in self._marks.values() for m, _ in marks.values()])
                    if self._events is not None:
                        self._nvml("nvmlEventSetFree", self._events)
                    self._nvml("nvmlShutdown")
                    self._ok = False
                with contextlib.suppress(health.Unresponsive):  # blocked: NVML stays up, the exit frees it
                    self._caller.call(shut, self._call_timeout)
            self._ok, self._events, self._handles, self._marks = False, None, {}, {}

    def util_source(self, index: int) -> str | None:
        """How GPU `index`'s utilization is sampled: "gpm" (its poll windows from GPM counters, the
        others from rates), "rates", or None (not yet)."""
        if self._gpm.get(index):
            return "gpm"
        return "rates" if index in self._sampled else None

    # -- sampling -------------------------------------------------------------------------------

    def sample(self) -> None:
        with self._lock:
            if not self._ok or self._caller.stuck:
                return  # never initialise here: sample() must stay cheap; read() initialises
            try:
                self._caller.call(self._sample_watched, self._call_timeout)
            except health.Unresponsive:
                return  # the next read() says so, on the GPU that blocked

    def own_sampler(self, interval: float) -> health.WorkerSampler:
        """The daemon's sampler for this probe: every `interval` s on the NVML worker itself, one wake-up
        a sample (babysit.service.sampler.Sampler on a thread of its own handed each sample to the worker: three).

        Not under the probe's lock: it runs on the worker, where every NVML call and every change to the
        samples' state is made, one job at a time (close_window's, the one change made elsewhere, is a
        single dict pop; `_add` iterates a snapshot). A sample that blocks in NVML holds no lock: the next
        read() times out on it and says `unresponsive`, as for a read that blocks."""
        return health.WorkerSampler(self._caller, self._sample_unmetered, interval, needed=self.samples_needed)

    def _sample_watched(self) -> None:
        if not self._ok:
            return  # closed, or not initialised yet: read() initialises
        for i in sorted(self._watched):  # not every GPU of the box: the ones runs use
            self._sample_gpu(i)

    def _sample_unmetered(self) -> None:
        """The periodic sample: the watched GPUs without GPM (GPM measures a GPU's poll windows; its other
        windows take the rate when they read)."""
        if not self._ok:
            return
        for i in sorted(self._watched):
            if not self._gpm.get(i):
                self._sample_gpu(i)

    def _sample_gpu(self, i: int) -> None:
        h = self._handle(i)
        if h is None:
            return
        self._sampled.add(i)
        rates = self._nvml("nvmlDeviceGetUtilizationRates", h, default=None, gpu=i)
        if rates is not None:
            self._add(i, float(rates.gpu))

    def _add(self, i: int, value: float) -> None:
        for window in tuple(self._windows.setdefault(i, {}).values()):  # close_window may pop one meanwhile
            window.add(value)

    def _drain_events(self) -> None:
        """Without the event thread: the events queued since the last read, taken now."""
        nv = self._nv
        if self._events is None or self._watcher is not None:
            return
        for _ in range(256):
            data = self._nvml("nvmlEventSetWait", self._events, 0, default=None, on={nv.NVML_ERROR_TIMEOUT: None})
            if data is None:
                return
            index = self._nvml("nvmlDeviceGetIndex", data.device, default=None)
            if index is None:
                continue
            signals = health.event_signals(nv, int(data.eventType), int(data.eventData), self._clock())
            if signals:
                self._deliver(int(index), signals)

    # -- reading --------------------------------------------------------------------------------

    def read(self, indices: Sequence[int], window: str = GUARD_WINDOW) -> GpuView:
        with self._lock:
            timeout = self._call_timeout if self._ok else max(self._call_timeout, health.INIT_TIMEOUT_S)
            try:
                return self._caller.call(lambda: self._read_now(indices, window), timeout)
            except health.Unresponsive as exc:
                return self._unresponsive_view(indices, exc)

    def _read_now(self, indices: Sequence[int], window: str) -> GpuView:
        if not self._ensure_init():
            return GpuView(False, self._reason, ())
        wanted = [i for i in (indices or range(self._count)) if 0 <= i < self._count]
        self._watched.update(wanted)
        if self._unfreed:
            self._free_marks(self._unfreed)
            self._unfreed = []
        for i in wanted:
            self._sample_gpu(i)  # close the window with the newest samples
        self._drain_events()
        readings = tuple(self._read_gpu(i, window) for i in wanted)
        self._errors.pop(None, None)
        watcher = self._watcher
        if watcher is not None and watcher.stale():  # the event wait itself blocks: events are not seen
            said = (f"the NVML event wait has not returned for {time.monotonic() - watcher.heartbeat:.0f} s: "
                    "Xid and ECC events are not being seen")
            readings = tuple(dataclasses.replace(r, errors=(*r.errors, said)) for r in readings)
        return GpuView(True, None, readings)

    def _unresponsive_view(self, indices: Sequence[int], exc: health.Unresponsive) -> GpuView:
        """NVML blocked: the GPU whose call blocked is `unresponsive` (a machine-side signal); the others
        of the read are not measured this round (NVML is busy with the blocked call)."""
        if not self._ok:
            return GpuView(False, f"NVML did not answer within {exc.seconds:g} s while initialising — check "
                                  "`nvidia-smi` (a hung GPU or driver)", ())
        wanted = [i for i in (indices or range(self._count)) if 0 <= i < self._count]
        blocked = exc.gpu if exc.gpu is not None else None
        now = self._clock()
        out = []
        for i in wanted:
            name, uuid = self._ident.get(i, ("?", "?"))
            if blocked is None or i == blocked:
                sig = GpuSignal("unresponsive", value=round(exc.seconds, 3), at=now,
                                text=f"unresponsive: an NVML call did not return within {exc.seconds:g} s")
                self._note(i, [sig])
                out.append(GpuReading(i, name, uuid, None, 0, None, None, (), (sig.text,), processes_known=False,
                                      errors=(str(exc),), signals=(sig,)))
            else:
                out.append(GpuReading(i, name, uuid, None, 0, None, None, (), (), processes_known=False,
                                      errors=(f"not read: NVML is blocked on GPU {blocked}",)))
        return GpuView(True, None, tuple(out))

    def _read_gpu(self, i: int, window: str) -> GpuReading:
        nv = self._nv
        h = self._handle(i)
        signals: list[GpuSignal] = []
        if i in self._pending:  # one the event thread adds after this look is the next read's, as after the pop
            with self._sig_lock:
                signals = self._pending.pop(i, [])
        found: list[GpuSignal] = []
        windows = self._windows.setdefault(i, {})
        acc = windows.get(window) or _Window()
        windows[window] = _Window()  # this reader's next window starts now
        util = acc.total / acc.count if acc.count else None
        low = acc.low if acc.count else None
        samples = acc.count
        seconds = None
        if h is not None and self._gpm.get(i) and window.startswith(POLL_WINDOW):
            util, seconds = self._gpm_window(i, h, window)
            low, samples = None, 0
        name = uuid = "?"
        used = total = None
        procs: tuple[GpuProcess, ...] = ()
        known = False
        if h is not None:
            name, uuid = self._ident.get(i) or (
                _text(self._nvml("nvmlDeviceGetName", h, default="?", gpu=i)),
                _text(self._nvml("nvmlDeviceGetUUID", h, default="?", gpu=i)))
            if name != "?" and uuid != "?":
                self._ident[i] = (name, uuid)
            mem = self._nvml("nvmlDeviceGetMemoryInfo", h, default=None, gpu=i)
            if mem is not None:
                used, total = int(mem.used), int(mem.total)
            listed = self._nvml("nvmlDeviceGetComputeRunningProcesses", h, default=None, gpu=i)
            if listed is not None:
                known = True
                procs = tuple(_process(p.pid, p.usedGpuMemory) for p in listed)
            state = self._fields.get(i)
            if state is not None:
                found.extend(health.read_fields(self._call_for(i), nv, h, state, self._clock()))
            else:
                ecc = self._nvml("nvmlDeviceGetTotalEccErrors", h, nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
                                 nv.NVML_VOLATILE_ECC, default=None, gpu=i, on={nv.NVML_ERROR_NOT_SUPPORTED: None})
                if ecc is not None and int(ecc) > self._ecc_base.get(i, 0):
                    found.append(GpuSignal("ecc-uncorrectable", value=float(ecc), at=self._clock(),
                                           text=f"ecc uncorrectable volatile {int(ecc)}"))
        if i in self._lost:
            found.append(GpuSignal("lost", at=self._clock(), text="device lost"))
            util, low, samples, seconds = None, None, 0, None
        if found:
            self._note(i, [s for s in found if gpuhealth.assess(s).machine])
            signals.extend(found)
        # the fault texts (status, /babysit gpus) name what is not a mere warning
        faults = tuple(dict.fromkeys(s.text for s in signals if gpuhealth.assess(s).side != "warn")) if signals else ()
        errors = tuple(self._errors.pop(i)) if i in self._errors else ()
        return GpuReading(i, name, uuid, util, samples, used, total, procs, faults,
                          processes_known=known, errors=errors, util_min_pct=low, signals=tuple(signals),
                          util_seconds=seconds)

    def _gpm_window(self, i: int, h: Any, window: str) -> tuple[float | None, float | None]:
        """GPU `i`'s GRAPHICS_UTIL over `window` since its last read, from two GPM snapshots, and the
        seconds between them; (None, None) for the read that opens the window or a failed call (recorded)."""
        nv = self._nv
        failed = object()
        fresh = self._nvml("nvmlGpmSampleAlloc", default=None, gpu=i)
        if fresh is None:
            return None, None
        if self._nvml("nvmlGpmSampleGet", h, fresh, default=failed, gpu=i) is failed:
            self._free_marks([fresh])
            return None, None
        now = time.monotonic()
        marks = self._marks.setdefault(i, {})
        previous = marks.get(window)
        marks[window] = (fresh, now)
        if previous is None:
            return None, None
        first, at = previous
        util = self._nvml(gpm_graphics_util, nv, first, fresh, default=None, gpu=i)
        self._free_marks([first])
        return util, (now - at if util is not None else None)

    def _free_marks(self, snapshots: Sequence[Any]) -> None:
        for snapshot in snapshots:
            self._nvml("nvmlGpmSampleFree", snapshot)

    def close_window(self, window: str) -> None:
        """Forget a reader's window (a run that ended), so samples stop feeding it."""
        with self._lock:
            for windows in self._windows.values():
                windows.pop(window, None)
            for marks in self._marks.values():  # its GPM snapshot: freed on the worker (every NVML call is)
                mark = marks.pop(window, None)
                if mark is not None:
                    self._unfreed.append(mark[0])


def gpm_graphics_util(nv: Any, first: Any, second: Any) -> float:
    """nvmlGpmMetricsGet's GRAPHICS_UTIL between two snapshots: the share of the time between them
    that any kernel ran (what nvmlDeviceGetUtilizationRates' `gpu` estimates over its last period)."""
    got = nv.c_nvmlGpmMetricsGet_t()
    got.version = nv.NVML_GPM_METRICS_GET_VERSION
    got.numMetrics = 1
    got.sample1, got.sample2 = first, second
    got.metrics[0].metricId = nv.NVML_GPM_METRIC_GRAPHICS_UTIL
    nv.nvmlGpmMetricsGet(got)
    metric = got.metrics[0]
    if metric.nvmlReturn != nv.NVML_SUCCESS:
        raise nv.NVMLError(metric.nvmlReturn)
    value = float(metric.value)
    if not -0.5 <= value <= 100.5:  # counters read across a reset: no measurement, never a wrong one
        raise ValueError(f"GPM GRAPHICS_UTIL {value:g} is not a percentage")
    return min(100.0, max(0.0, value))


class FileGpuProbe:
    """Injected GPUs for CI, tests and demos, described by a JSON file re-read on every read().

    A test "starts a foreign process" by rewriting the file. Schema (every key but `index` optional)::

        {"available": true,                      # false simulates a machine without a driver
         "reason": "…",                          # shown when available is false
         "gpus": [{"index": 0, "name": "Simulated H200", "uuid": "GPU-sim-0",
                   "util_pct": 97, "util_samples": 10,
                   "memory_used_bytes": 1000, "memory_total_bytes": 150000000000,
                   "processes": [{"pid": 4242, "name": "policy_server", "used_memory_bytes": 1000}],
                   "faults": ["xid 79"]}]}

    `"processes": null` simulates a GPU whose process list could not be read. A missing or invalid
    file is a view with available=False and a reason, never an exception.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._parsed: tuple[tuple[int, int, int, int], Any] | None = None  # (the file's stat, its JSON)
        self._readings: tuple[Any, tuple[GpuReading, ...]] | None = None  # (that JSON, its GPUs): none holds a pid

    def sample(self) -> None:
        return None

    def close_window(self, window: str) -> None:
        return None

    def close(self) -> None:
        return None

    def _data(self) -> Any:
        """The file's JSON, parsed again only when the file changed (a guard round reads it once per run)."""
        st = self.path.stat()
        key = (st.st_mtime_ns, st.st_ctime_ns, st.st_size, st.st_ino)
        if self._parsed is None or self._parsed[0] != key:
            self._parsed = (key, json.loads(self.path.read_text(encoding="utf-8")))
        return self._parsed[1]

    def _gpus(self, data: Any) -> tuple[GpuReading, ...]:
        """The file's GPUs as readings, made again only when the file changed — unless a GPU lists
        processes: their pids are looked up on this host at every read (exited? a zombie?)."""
        if self._readings is not None and self._readings[0] is data:
            return self._readings[1]
        raw = data.get("gpus", [])
        gpus = tuple(_file_gpu(g) for g in raw)
        if not any(g.get("processes") for g in raw):  # every run's check reads it: a guard round, a poll round
            self._readings = (data, gpus)
        return gpus

    def read(self, indices: Sequence[int], window: str = GUARD_WINDOW) -> GpuView:
        fix = f"fix the simulated GPU file {self.path} or change BABYSIT_GPU_PROBE"
        try:
            data = self._data()
            if not data.get("available", True):
                return GpuView(False, str(data.get("reason") or f"simulated: no GPU visible — {fix}"), ())
            gpus = self._gpus(data)
        except (OSError, ValueError, TypeError, KeyError, AttributeError) as exc:
            return GpuView(False, f"cannot read simulated GPUs ({type(exc).__name__}: {exc}) — {fix}", ())
        if indices:
            gpus = tuple(g for g in gpus if g.index in set(indices))
        return GpuView(True, None, gpus)


class NullGpuProbe:
    """BABYSIT_GPU_PROBE=none: GPUs are never read; a run that asks for GPUs is refused, not waved through."""

    def sample(self) -> None:
        return None

    def close_window(self, window: str) -> None:
        return None

    def close(self) -> None:
        return None

    def read(self, indices: Sequence[int], window: str = GUARD_WINDOW) -> GpuView:
        return GpuView(False, "GPU probing is off (BABYSIT_GPU_PROBE=none) — unset it to use NVML, "
                              "or declare gpus = [] for a CPU run", ())


GPU_PROBE_ENV = "BABYSIT_GPU_PROBE"


def open_gpu_probe(spec: str | None = None, *, health_events: bool = True) -> GpuProbe:
    """The one place the GPU probe is chosen: `spec` (a --gpu-probe flag), else $BABYSIT_GPU_PROBE, else
    NVML. "nvml" | "file:PATH" (simulated GPUs, for tests) | "none". Without `health_events`, an NVML probe
    that only reads (no event thread)."""
    text = (spec or os.environ.get(GPU_PROBE_ENV) or "nvml").strip()
    if text == "nvml":
        return NvmlGpuProbe(health_events=health_events)
    if text == "none":
        return NullGpuProbe()
    if text.startswith("file:") and len(text) > 5:
        return FileGpuProbe(text[5:])
    raise BadInput(f"BABYSIT_GPU_PROBE: expected \"nvml\", \"none\" or \"file:PATH\", got {text!r}",
                   hint="unset BABYSIT_GPU_PROBE to use NVML")


# -- helpers ------------------------------------------------------------------------------------


def _init_reason(nv: Any, error: str) -> str:
    lowered = error.lower()
    if "library not found" in lowered:
        return (f"no NVIDIA driver here (libnvidia-ml.so.1 not found) — {NO_DRIVER_FIX}, "
                "or declare gpus = [] for a CPU run")
    if "driver not loaded" in lowered:
        return "the NVIDIA kernel driver is not loaded — load it or reboot after installing it (`nvidia-smi` must work)"
    if "mismatch" in lowered:
        return ("NVML and the kernel driver differ in version — "
                "reboot (or reload the nvidia module) after the driver upgrade")
    if "permission" in lowered:
        return "no permission to open /dev/nvidia* — run babysit as a user allowed to use the GPUs"
    return f"NVML failed to initialise ({error}) — {NO_DRIVER_FIX}"


def _missing(fn: str) -> Any:
    def call(*_: Any) -> Any:
        raise AttributeError(f"pynvml has no {fn} (nvidia-ml-py too old?)")
    return call


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _process(pid: int, used: int | None, name: str | None = None) -> GpuProcess:
    """A holder as this host sees it: a name, and whether the pid exists here and has exited."""
    seen, zombie = process_state(int(pid))
    memory = None if used is None else int(used)
    if seen is None:
        return GpuProcess(int(pid), name or "? (no such pid here: exited, or another PID namespace)", memory,
                          visible=False)
    return GpuProcess(int(pid), name or seen, memory, zombie=zombie)


def _file_gpu(g: Mapping[str, Any]) -> GpuReading:
    index = int(g["index"])
    util = g.get("util_pct")
    procs = g.get("processes", [])
    return GpuReading(
        index=index,
        name=str(g.get("name", "Simulated GPU")),
        uuid=str(g.get("uuid", f"GPU-sim-{index}")),
        util_pct=None if util is None else float(util),
        util_samples=int(g.get("util_samples", 0 if util is None else 1)),
        util_min_pct=None if g.get("util_min_pct", util) is None else float(g.get("util_min_pct", util)),
        memory_used_bytes=_opt_int(g.get("memory_used_bytes")),
        memory_total_bytes=_opt_int(g.get("memory_total_bytes")),
        # the simulated list's pids are looked up on this host like NVML's (exited? zombie?)
        processes=tuple(_process(int(p["pid"]), _opt_int(p.get("used_memory_bytes")), p.get("name"))
                        for p in (procs or [])),
        faults=tuple(str(f) for f in g.get("faults", [])),
        processes_known=procs is not None,
    )


def _opt_int(value: Any) -> int | None:
    return None if value is None else int(value)


__all__ = ["FileGpuProbe", "GpuProbe", "GpuProcess", "GpuReading", "GpuView", "NullGpuProbe",
           "NvmlGpuProbe", "open_gpu_probe"]
