"""An NVML stand-in at the pynvml boundary, for the probe's tests and the benches on machines without a GPU:
pynvml's names the probe uses, raising the real `pynvml.NVMLError` codes, handing out real
`c_nvmlEventData_t` payloads from a blocking nvmlEventSetWait and real `c_nvmlFieldValue_t` arrays, and
able to block a call the way a degrading GPU does. It imports pynvml and nothing of babysit, so a bench can
stand it under an older babysit (--before) too."""

from __future__ import annotations

import ctypes
import threading
import types
from types import SimpleNamespace

import pynvml

GIB = 2**30


def handle(i: int):
    return ctypes.cast(ctypes.c_void_p(0x1000 + i), pynvml.c_nvmlDevice_t)


def index_of(h) -> int:
    return ctypes.cast(h, ctypes.c_void_p).value - 0x1000


class StandIn:
    """pynvml's names the probe uses; NVMLError and every constant are pynvml's own."""

    def __init__(self, gpus: int = 2) -> None:
        self._real = pynvml
        self.count = gpus
        self.events: list = []
        self.cv = threading.Condition()
        self.fields = {i: {} for i in range(gpus)}  # gpu -> field id -> value (absent: NOT_SUPPORTED)
        self.reasons = {i: 0 for i in range(gpus)}
        self.temp = {i: 40 for i in range(gpus)}
        self.lost: set[int] = set()
        self.block: threading.Event | None = None  # set: nvmlDeviceGetMemoryInfo blocks until it is set
        self.block_gpu: int | None = None
        self.registered: dict[int, int] = {}
        self.waits = 0
        self.util_threads: list[str] = []  # the thread of each utilization read
        self.block_util: threading.Event | None = None  # set: nvmlDeviceGetUtilizationRates blocks on block_gpu

    def __getattr__(self, name):  # constants, structs, NVMLError: pynvml's
        return getattr(self._real, name)

    def _check(self, h) -> int:
        i = index_of(h)
        if i in self.lost:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
        return i

    def post(self, gpu: int, event_type: int, data: int = 0) -> None:
        ev = pynvml.c_nvmlEventData_t()
        ev.device, ev.eventType, ev.eventData = handle(gpu), event_type, data
        with self.cv:
            self.events.append(ev)
            self.cv.notify_all()

    def nvmlInit(self): return None
    def nvmlShutdown(self): return None
    def nvmlDeviceGetCount(self): return self.count
    def nvmlEventSetCreate(self): return "set"
    def nvmlEventSetFree(self, s): return None
    def nvmlDeviceGetHandleByIndex(self, i): return handle(i)
    def nvmlDeviceGetIndex(self, h): return index_of(h)
    def nvmlDeviceGetName(self, h): return b"NVIDIA H200"
    def nvmlDeviceGetUUID(self, h): return f"GPU-{index_of(h)}"
    def nvmlDeviceGetSupportedEventTypes(self, h): return pynvml.nvmlEventTypeAll

    def nvmlDeviceRegisterEvents(self, h, mask, s):
        self.registered[index_of(h)] = mask

    def nvmlEventSetWait(self, s, timeout_ms):
        with self.cv:
            self.waits += 1
            if not self.events:
                self.cv.wait(timeout_ms / 1000)
            if not self.events:
                raise pynvml.NVMLError(pynvml.NVML_ERROR_TIMEOUT)
            return self.events.pop(0)

    def nvmlDeviceGetUtilizationRates(self, h):
        i = self._check(h)
        self.util_threads.append(threading.current_thread().name)
        if self.block_util is not None and i == self.block_gpu:
            self.block_util.wait()
        return SimpleNamespace(gpu=80, memory=0)

    def nvmlDeviceGetMemoryInfo(self, h):
        i = self._check(h)
        if self.block is not None and i == self.block_gpu:
            self.block.wait()
        return SimpleNamespace(used=3 * GIB, total=141 * GIB, free=138 * GIB)

    def nvmlDeviceGetComputeRunningProcesses(self, h):
        self._check(h)
        return []

    def nvmlDeviceGetFieldValues(self, h, ids):
        i = self._check(h)
        out = (pynvml.c_nvmlFieldValue_t * len(ids))()
        for k, fid in enumerate(ids):
            out[k].fieldId = fid
            if fid in self.fields[i]:
                out[k].nvmlReturn, out[k].valueType = pynvml.NVML_SUCCESS, pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
                out[k].value.ullVal = self.fields[i][fid]
            else:
                out[k].nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED
        return out

    def nvmlDeviceGetTotalEccErrors(self, h, kind, counter):  # the probe's read without field values
        return self.fields[self._check(h)].get(pynvml.NVML_FI_DEV_ECC_DBE_VOL_TOTAL, 0)

    def nvmlDeviceGetCurrentClocksEventReasons(self, h):
        reasons = self.reasons[self._check(h)]
        if reasons is None:  # None: this round the GPU does not say
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return reasons

    def nvmlDeviceGetTemperatureThreshold(self, h, which):
        assert which == pynvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN
        return 87

    def nvmlDeviceGetTemperature(self, h, sensor):
        return self.temp[self._check(h)]


# NVML's C prototype: nvmlReturn_t nvmlDeviceGetFieldValues(nvmlDevice_t, int valuesCount, nvmlFieldValue_t *values)
FIELD_VALUES_C = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_int32, ctypes.POINTER(pynvml.c_nvmlFieldValue_t))


class CFieldsStandIn(StandIn):
    """The stand-in whose nvmlDeviceGetFieldValues is pynvml's own wrapper code over a C-callable stand-in for
    NVML's C function, in a stand-in for the loaded library (`nvmlLib`) where pynvml's lookup finds it, as it
    finds the real one: the probe's prepared array (babysit/probes/nvml_fields.py) calls that same C function
    from that library, through ctypes' own argument passing. The C function answers from `fields` like StandIn's, and records what it
    was asked and whether the array came in as pynvml builds it (ids set, every answer member zero)."""

    def __init__(self, gpus: int = 2, *, has_field_values: bool = True) -> None:
        super().__init__(gpus)
        self.c_asked: list[list[int]] = []  # the field ids of each call of the C function
        self.dirty: list[int] = []  # field ids that came in with an answer already in them
        self.lookups = 0  # pynvml's wrapper looks the function up at every call; the prepared array once
        self.fail_with: int | None = None  # an NVML return code for the whole call
        self._callback = FIELD_VALUES_C(self._field_values_c)  # kept alive as long as the pointer
        fn = ctypes.CFUNCTYPE(ctypes.c_int)(ctypes.cast(self._callback, ctypes.c_void_p).value)
        fn.argtypes = None  # no prototype, as pynvml's CDLL functions: ctypes converts each argument by its type

        stand_in = self

        class Library:  # the loaded NVML (a ctypes CDLL in pynvml): its C functions by name
            def __getattr__(self, name: str):
                stand_in.lookups += 1
                if name != "nvmlDeviceGetFieldValues" or not has_field_values:
                    raise AttributeError(name)
                return fn

        self.nvmlLib = Library()

        def lookup(name: str):  # pynvml's _nvmlGetFunctionPointer over that library
            try:
                return getattr(self.nvmlLib, name)
            except AttributeError:
                raise pynvml.NVMLError(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND) from None

        self.nvmlDeviceGetFieldValues = types.FunctionType(
            pynvml.nvmlDeviceGetFieldValues.__code__,
            {**vars(pynvml), "_nvmlGetFunctionPointer": lookup, "nvmlLib": self.nvmlLib}, "nvmlDeviceGetFieldValues")

    def _field_values_c(self, device, count, values) -> int:
        i = (device or 0) - 0x1000
        if i in self.lost:
            return pynvml.NVML_ERROR_GPU_IS_LOST
        if self.fail_with is not None:
            return self.fail_with
        self.c_asked.append([values[k].fieldId for k in range(count)])
        for k in range(count):
            fv = values[k]
            if fv.nvmlReturn or fv.valueType or fv.value.ullVal or fv.timestamp:
                self.dirty.append(fv.fieldId)
            fv.timestamp, fv.latencyUsec = 1_000_000 + len(self.c_asked), 3  # a new time at every call
            if fv.fieldId in self.fields[i]:
                fv.nvmlReturn, fv.valueType = pynvml.NVML_SUCCESS, pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
                fv.value.ullVal = self.fields[i][fv.fieldId]
            else:
                fv.nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED
        return pynvml.NVML_SUCCESS
