"""A run's poll window on a GPU with GPM (GPU Performance Monitoring: Hopper and later), measured from the
GPU's own activity counters: one snapshot at each end of the window (nvmlGpmSampleGet), and
nvmlGpmMetricsGet's GRAPHICS_UTIL between them, the same "any kernel running" share as the rate. It is exact
over the whole window, where samples are an estimate, and needs no timer between (the sampler leaves such
GPUs alone). On the H200 over 10-60 s windows of a 4-s-on/4-s-off load it read 51.7 % where a 1-s sampler
read 51.3 and the driver's 200-ms samples 52-57; a snapshot costs ~46 µs and the metrics ~0.9 ms, once a
poll (bench/README.md, section 11).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any


class GpmWindows:
    """Which GPUs have GPM, and each GPM window's opening snapshot. Every call goes through the probe's NVML
    wrapper (`nvml(fn, *args, default=, gpu=, on=)`), on its worker thread."""

    def __init__(self, nvml: Callable[..., Any]) -> None:
        self._nvml = nvml
        self.supported: dict[int, bool] = {}  # gpu -> its poll windows are measured by GPM counters
        self._marks: dict[int, dict[str, tuple[Any, float]]] = {}  # gpu -> poll window -> (GPM snapshot, at)
        self._unfreed: list[Any] = []  # GPM snapshots of closed windows, freed on the worker's next read

    def learn(self, nv: Any, i: int, h: Any) -> None:
        """Ask whether GPU `i` has GPM (once, when its handle is first taken)."""
        supported = False
        if hasattr(nv, "nvmlGpmQueryDeviceSupport"):
            support = self._nvml("nvmlGpmQueryDeviceSupport", h, default=None, gpu=i,
                                 on={nv.NVML_ERROR_NOT_SUPPORTED: None})
            supported = bool(support is not None and support.isSupportedDevice)
        self.supported[i] = supported

    def has(self, i: int) -> bool:
        return self.supported.get(i, False)

    def measure(self, nv: Any, i: int, h: Any, window: str) -> tuple[float | None, float | None]:
        """GPU `i`'s GRAPHICS_UTIL over `window` since its last read, from two GPM snapshots, and the
        seconds between them; (None, None) for the read that opens the window or a failed call (recorded)."""
        failed = object()
        fresh = self._nvml("nvmlGpmSampleAlloc", default=None, gpu=i)
        if fresh is None:
            return None, None
        if self._nvml("nvmlGpmSampleGet", h, fresh, default=failed, gpu=i) is failed:
            self._free([fresh])
            return None, None
        now = time.monotonic()
        marks = self._marks.setdefault(i, {})
        previous = marks.get(window)
        marks[window] = (fresh, now)
        if previous is None:
            return None, None
        first, at = previous
        util = self._nvml(gpm_graphics_util, nv, first, fresh, default=None, gpu=i)
        self._free([first])
        return util, (now - at if util is not None else None)

    def close_window(self, window: str) -> None:
        """Forget a window; its snapshot is freed on the worker's next read (every NVML call is made there)."""
        for marks in self._marks.values():
            mark = marks.pop(window, None)
            if mark is not None:
                self._unfreed.append(mark[0])

    def free_closed(self) -> None:
        """Free the snapshots of the windows closed since the last read (on the worker)."""
        if self._unfreed:
            self._free(self._unfreed)
            self._unfreed = []

    def free_all(self) -> None:
        """Free every open window's snapshot (the probe closing, on the worker)."""
        self._free([m for marks in self._marks.values() for m, _ in marks.values()])

    def forget(self) -> None:
        self._marks = {}

    def _free(self, snapshots: Sequence[Any]) -> None:
        for snapshot in snapshots:
            self._nvml("nvmlGpmSampleFree", snapshot)


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
