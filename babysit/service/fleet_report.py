"""What a box of a fleet publishes with its lease renewals for the gateway's `/babysit gpus`: its GPUs,
each compute process labelled with the run it belongs to.

Its own module, and its own thread and probe, because the lease must never wait on it: an NVML call can
hang (up to a minute at its first init), and a renewal held up by one gets the box declared lost. A read
of the daemon's probe would also take the health signals its guards wait for. The renewal only takes
`latest`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import Any

import structlog

from babysit.core.gpu import report as gpureport
from babysit.probes.gpu import GpuProbe
from babysit.probes.host import process_tree
from babysit.run.supervisor import RunSupervisor

log = structlog.get_logger("babysit.service.fleet_report")


class FleetReport:
    """The box's GPU report, read again every `every_s` on a thread of its own once `start` is called."""

    def __init__(self, probe_factory: Callable[[], GpuProbe], supervisors: Mapping[str, RunSupervisor],
                 now: Callable[[], float]) -> None:
        self._probe_factory = probe_factory
        self._probe: GpuProbe | None = None
        self._supervisors = supervisors
        self._now = now
        self._stop = threading.Event()
        self.latest: dict[str, Any] = {}

    def start(self, every_s: float) -> None:
        threading.Thread(target=self._loop, args=(every_s,), name="fleet-report", daemon=True).start()

    def close(self) -> None:
        self._stop.set()

    def _loop(self, every_s: float) -> None:
        try:
            while not self._stop.is_set():
                try:
                    self.latest = self.read()
                except Exception as exc:  # a probe's bug: said in the report, tried again next time
                    log.exception("the GPU report for the fleet failed")
                    self.latest = {"report_error": f"{type(exc).__name__}: {exc}"[:300]}
                if self._stop.wait(every_s):
                    return
        finally:
            if self._probe is not None:
                self._probe.close()

    def read(self) -> dict[str, Any]:
        """The box's GPUs read now, each compute process labelled with the run whose live attempt's process
        tree it is in."""
        if self._probe is None:
            self._probe = self._probe_factory()
        probe = self._probe
        probe.sample()
        view = probe.read([], window=gpureport.WINDOW)
        owners: dict[int, str] = {}
        if any(g.processes for g in view.gpus):
            for run, supervisor in list(self._supervisors.items()):
                attempt = supervisor.attempt
                if attempt is not None and attempt.pid and supervisor.is_running():
                    owners.update(dict.fromkeys(process_tree(attempt.pid), run))
        return {"gpus": gpureport.to_json(view, owners, self._now())}
