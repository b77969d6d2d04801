"""The GPU probe, chosen in one place (`open_gpu_probe`): NVML's (babysit/probes/nvml_probe.py), simulated
GPUs from a file (gpu_file.py), or none. What a probe is and its windows: gpu_probe.py.

GPU indices are NVML indices (nvidia-smi order, i.e. PCI bus order): the executor should export
CUDA_DEVICE_ORDER=PCI_BUS_ID so CUDA numbers the run's GPUs the same way.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from babysit.core.errors import BadInput
from babysit.core.readings import GpuProcess, GpuReading, GpuView
from babysit.probes.gpu_file import FileGpuProbe
from babysit.probes.gpu_probe import GUARD_WINDOW, POLL_WINDOW, GpuProbe, poll_window
from babysit.probes.nvml_probe import NvmlGpuProbe


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


__all__ = ["GUARD_WINDOW", "POLL_WINDOW", "FileGpuProbe", "GpuProbe", "GpuProcess", "GpuReading", "GpuView",
           "NullGpuProbe", "NvmlGpuProbe", "open_gpu_probe", "poll_window"]
