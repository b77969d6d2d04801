"""What every GPU probe is (NVML's, the file-fed one for tests, the null one): `sample()` on a timer,
`read(indices, window)` at each guard check or poll, giving one `GpuView`. A reading's utilization covers
the samples since the previous read of that GPU *in the same window*: the guards read GUARD_WINDOW, and a
run's polls `poll_window(run)`, which its prelaunch read opens, so a poll averages its whole interval
however often the guards read."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from babysit.core.readings import GpuProcess, GpuView
from babysit.probes.host import process_state

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


def gpu_process(pid: int, used: int | None, name: str | None = None) -> GpuProcess:
    """A holder as this host sees it: a name, and whether the pid exists here and has exited."""
    seen, zombie = process_state(int(pid))
    memory = None if used is None else int(used)
    if seen is None:
        return GpuProcess(int(pid), name or "? (no such pid here: exited, or another PID namespace)", memory,
                          visible=False)
    return GpuProcess(int(pid), name or seen, memory, zombie=zombie)
