"""Simulated GPUs for CI, tests and demos: a JSON file that a test rewrites to "start a foreign process"
(BABYSIT_GPU_PROBE=file:PATH)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from babysit.core.readings import GpuReading, GpuView
from babysit.probes.gpu_probe import GUARD_WINDOW, gpu_process


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
        processes=tuple(gpu_process(int(p["pid"]), _opt_int(p.get("used_memory_bytes")), p.get("name"))
                        for p in (procs or [])),
        faults=tuple(str(f) for f in g.get("faults", [])),
        processes_known=procs is not None,
    )


def _opt_int(value: Any) -> int | None:
    return None if value is None else int(value)
