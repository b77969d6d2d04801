"""The NVML GPU probe: utilization, memory, compute processes and faults of the box's GPUs.

Every pynvml call goes through one wrapper (`NvmlGpuProbe._nvml`) that returns a default and records
the error, so a driver hiccup becomes a reading with `errors` and a None, never an exception in the
daemon. A machine without a driver gives `GpuView(available=False, reason=...)`, and the reason ends
with the fix: "not measured" must never read as "fine".

Utilization is a window average (babysit/probes/gpu_probe.py): the daemon calls `sample()` every
`[daemon].gpu_sample_seconds` (2 s unless set), each sample one nvmlDeviceGetUtilizationRates (~1 µs on an
H200; itself an average over the driver's last sampling period). NVML's own sample buffer
(nvmlDeviceGetSamples) would miss nothing between calls, but it measured ~2 ms a call on the H200, 2000x
the cost, and holds only the last 14 s (bench/gpu_util_window.py). A poll window on a GPU with GPM is
measured from the GPU's own counters instead (babysit/probes/gpm.py); other windows (the guards', which
decide on no utilization; the fleet report's) keep the rate, read when they read.

Health (Xid and ECC events, the batch of health fields, a call that blocks): babysit/probes/health.py.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from babysit.core.gpu import health as gpuhealth
from babysit.core.readings import GpuProcess, GpuReading, GpuSignal, GpuView
from babysit.probes import health
from babysit.probes.gpm import GpmWindows
from babysit.probes.gpu_probe import GUARD_WINDOW, POLL_WINDOW, gpu_process

HISTORY = 512  # health signals kept for the exit's classification (signals_since)
NO_DRIVER_FIX = "install the NVIDIA driver and nvidia-ml-py matching it (`nvidia-smi` must work)"


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
        self._gpm = GpmWindows(self._nvml)  # the GPUs whose poll windows GPM counters measure

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
                self._gpm.learn(self._nv, i, h)
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

    def samples_needed(self) -> bool:
        """Whether the periodic sampler has work: a watched GPU without GPM (or none read yet)."""
        watched = tuple(self._watched)
        return not watched or not all(self._gpm.has(i) for i in watched)

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
                    self._gpm.free_all()
                    if self._events is not None:
                        self._nvml("nvmlEventSetFree", self._events)
                    self._nvml("nvmlShutdown")
                    self._ok = False
                with contextlib.suppress(health.Unresponsive):  # blocked: NVML stays up, the exit frees it
                    self._caller.call(shut, self._call_timeout)
            self._ok, self._events, self._handles = False, None, {}
            self._gpm.forget()

    def util_source(self, index: int) -> str | None:
        """How GPU `index`'s utilization is sampled: "gpm" (its poll windows from GPM counters, the
        others from rates), "rates", or None (not yet)."""
        if self._gpm.has(index):
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
            if not self._gpm.has(i):
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
        self._gpm.free_closed()
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
        if h is not None and self._gpm.has(i) and window.startswith(POLL_WINDOW):
            util, seconds = self._gpm.measure(self._nv, i, h, window)
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
                procs = tuple(gpu_process(p.pid, p.usedGpuMemory) for p in listed)
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

    def close_window(self, window: str) -> None:
        """Forget a reader's window (a run that ended), so samples stop feeding it."""
        with self._lock:
            for windows in self._windows.values():
                windows.pop(window, None)
            self._gpm.close_window(window)


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
