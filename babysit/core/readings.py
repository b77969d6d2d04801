"""What the probes read, as frozen values: a GPU view and a host reading.

The probes (babysit/probes/) produce these; the guards and the poll snapshot decide on them. They
live in the core so that the decisions never import a probe.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GpuProcess:
    pid: int
    name: str
    used_memory_bytes: int | None
    visible: bool = True  # False: no such pid here — exited since NVML listed it, or another PID namespace
    zombie: bool = False  # it has exited and waits to be reaped: never a holder


@dataclass(frozen=True)
class GpuSignal:
    """One health signal of one GPU, as the probe saw it; babysit/core/gpu/health.py says what it means.

    kind: xid | ecc-dbe | ecc-uncorrectable | ecc-sbe | ecc-sbe-storm | remap-pending | remap-failure |
    recovery-action | unavailable | lost | unresponsive | pcie-replay | nvlink-errors | throttle |
    temperature (docs/guards.md, GPU health). `code`: the Xid or the recovery action; `value`: the count,
    the reasons mask or the degrees below the slowdown threshold; `at`: the wall time it was seen."""

    kind: str
    code: int | None = None
    value: float | None = None
    at: float | None = None
    text: str = ""


@dataclass(frozen=True)
class GpuReading:
    index: int
    name: str
    uuid: str
    util_pct: float | None  # mean over the window's samples since its last read(); None: not measured
    util_samples: int
    memory_used_bytes: int | None
    memory_total_bytes: int | None
    processes: tuple[GpuProcess, ...]
    faults: tuple[str, ...]  # "xid 79", "ecc uncorrectable volatile 2", "device lost"
    processes_known: bool = True  # False: listing failed; `processes == ()` then means "not measured"
    errors: tuple[str, ...] = ()  # NVML calls that failed for this GPU during this reading
    util_min_pct: float | None = None  # the lowest sample of the window
    signals: tuple[GpuSignal, ...] = ()  # health signals seen since the last read (NVML); () from a file probe
    util_seconds: float | None = None  # GPM: the seconds the window's counters span (util_samples 0, no min)
    node: str | None = None  # the node it is on, for a job across nodes (its probe sidecar's); None: one box


@dataclass(frozen=True)
class GpuView:
    """The run's GPUs as one probe saw them. A job across nodes has every node's GPUs here, each reading
    naming its node and numbered as the run's `gpus` on that node: index 0 appears once a node."""

    available: bool
    reason: str | None
    gpus: tuple[GpuReading, ...] = ()
    pending: bool = False  # not read yet, and not late: a job's probe sidecars starting (`reason` says so)

    def gpu(self, index: int) -> GpuReading | None:
        """The GPU with this index (on a view across nodes: the first node's; `on(node)` picks one)."""
        for reading in self.gpus:
            if reading.index == index:
                return reading
        return None

    @property
    def nodes(self) -> tuple[str, ...]:
        """The nodes its readings name, in order; () for one box's view."""
        return tuple(dict.fromkeys(g.node for g in self.gpus if g.node is not None))

    def on(self, node: str) -> GpuView:
        """One node's part of a view across nodes."""
        return GpuView(self.available, self.reason, tuple(g for g in self.gpus if g.node == node))

    def by_node(self) -> tuple[tuple[str | None, GpuView], ...]:
        """(node, that node's view) for each node; one (None, self) for one box's view."""
        nodes = self.nodes
        return tuple((n, self.on(n)) for n in nodes) if nodes else ((None, self),)


@dataclass(frozen=True)
class HostReading:
    """One look at the host. `run_*` are None when there is no run or it could not be read.

    run_rss_bytes sums RSS over the tree, so pages shared by forked dataloader workers are counted
    once per process: an upper bound, which is the safe side for a memory-pressure warning.
    run_cpu_pct sums psutil's per-process CPU percent (100 = one core) since the previous read_host
    of the same processes; None on the first read, because a first look cannot measure a rate.
    """

    available_ram_bytes: int
    total_ram_bytes: int
    run_rss_bytes: int | None
    run_cpu_pct: float | None
    run_pids: frozenset[int]
