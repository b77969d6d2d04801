"""Local stand-ins for the daemon's collaborators, for driving a supervisor or a daemon in process.

A fake clock (declared hours pass in microseconds), timers that run when the test says so, a host
probe that reports what the test set, and an executor whose "processes" are records the test ends.
The store, the spec, the log and the GPU probe (a FileGpuProbe) stay real.
"""

from __future__ import annotations

import itertools
import signal
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from babysit.core.readings import HostReading
from babysit.core.spec.run_toml import RunSpec
from babysit.db.store import Attempt
from babysit.executors import ExitInfo, Launched
from babysit.probes.gpu import GpuProbe

GIB = 2**30


class FakeClock:
    def __init__(self, start: float = 1_800_000_000.0) -> None:
        self.now = start
        self._mono = 1000.0

    def time(self) -> float:
        return self.now

    def monotonic(self) -> float:
        return self._mono + self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class ManualTimers:
    """Timers that fire only in `run_due()`, at the fake clock's time, in time order."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self._lock = threading.Lock()
        self.pending: dict[str, tuple[float, Callable[[], None]]] = {}
        self.fired: list[str] = []

    def call_at(self, key: str, when: float, fn: Callable[[], None]) -> None:
        with self._lock:
            self.pending[key] = (when, fn)

    def cancel(self, key: str) -> None:
        with self._lock:
            self.pending.pop(key, None)

    def when(self, key: str) -> float | None:
        with self._lock:
            entry = self.pending.get(key)
        return None if entry is None else entry[0]

    def run_due(self) -> list[str]:
        """Run every call due by now (including ones the calls themselves make due); their keys."""
        ran = []
        while True:
            with self._lock:
                due = sorted((w, k) for k, (w, _) in self.pending.items() if w <= self.clock.time())
                if not due:
                    return ran
                key = due[0][1]
                _, fn = self.pending.pop(key)
            fn()
            ran.append(key)
            self.fired.append(key)

    def advance(self, seconds: float, step: float = 1.0) -> list[str]:
        """Move the clock on in steps, running what falls due at each."""
        ran = []
        end = self.clock.now + seconds
        while self.clock.now < end:
            self.clock.advance(min(step, end - self.clock.now))
            ran += self.run_due()
        return ran


@dataclass
class FakeHostProbe:
    """The host as the test sets it: free RAM, and which pids each root's tree holds."""

    available_ram_bytes: int = 64 * GIB
    total_ram_bytes: int = 128 * GIB
    trees: dict[int, frozenset[int]] = field(default_factory=dict)
    reads: int = 0
    failing: Exception | None = None  # raised by every read while set (/proc unreadable)

    def read(self, root_pid: int | None, started: float | None = None) -> HostReading:
        self.reads += 1
        if self.failing is not None:
            raise self.failing
        pids = self.trees.get(root_pid, frozenset({root_pid})) if root_pid is not None else frozenset()
        if not pids:
            return HostReading(self.available_ram_bytes, self.total_ram_bytes, None, None, frozenset())
        return HostReading(self.available_ram_bytes, self.total_ram_bytes, 2 * GIB * len(pids), 100.0, pids)


@dataclass
class FakeProcess:
    pid: int
    started_at: float
    exit_code: int | None = None
    signal: int | None = None
    ended_at: float | None = None
    signals: list[int] = field(default_factory=list)
    obeys_stop: bool = True  # a stop signal ends it (as a trainer that checkpoints and exits)

    @property
    def ended(self) -> bool:
        return self.ended_at is not None


class FakeExecutor:
    """Attempts as in-memory processes. Exits are polled (no descriptor), so the fake clock decides when
    they are seen: the supervisor asks `exit_info` every `exit_poll_seconds`."""

    name = "local"
    allocates_gpus = False
    runs_here = True
    exit_poll_seconds = 1.0

    def __init__(self, clock: FakeClock, host: FakeHostProbe | None = None) -> None:
        self.clock = clock
        self.host = host
        self.procs: dict[int, FakeProcess] = {}  # attempt id -> process
        self.by_attempt: dict[tuple[str, int], FakeProcess] = {}
        self.launches: list[tuple[str, int, list[str], dict[str, str]]] = []
        self.kills: list[int] = []
        self._pids = itertools.count(700_001)

    def charged_gpus(self, spec: RunSpec) -> int:
        return len(spec.gpus)

    def node_rows(self, attempt: Attempt) -> tuple:
        return ()

    def remote_stacks(self, attempt: Attempt) -> dict[str, str] | None:
        return None

    def straggler(self, attempt: Attempt) -> str | None:
        return None

    # -- the test's side
    def process(self, run: str, n: int) -> FakeProcess:
        return self.by_attempt[(run, n)]

    def end(self, run: str, n: int, exit_code: int | None = 0, sig: int | None = None) -> None:
        proc = self.process(run, n)
        proc.exit_code, proc.signal, proc.ended_at = exit_code, sig, self.clock.time()

    # -- the executor protocol
    def launch(self, attempt: Attempt, argv: list[str], env: dict[str, str], workdir: str) -> Launched:
        proc = FakeProcess(next(self._pids), self.clock.time())
        self.procs[attempt.id] = self.by_attempt[(attempt.run, attempt.n)] = proc
        self.launches.append((attempt.run, attempt.n, list(argv), dict(env)))
        if self.host is not None:
            self.host.trees[proc.pid] = frozenset({proc.pid, proc.pid + 100_000})
        return Launched(started_at=proc.started_at, pid=proc.pid, pid_create_time=proc.started_at)

    def find(self, attempt: Attempt) -> Launched | None:
        proc = self.procs.get(attempt.id)
        return None if proc is None else Launched(proc.started_at, proc.pid, proc.started_at)

    def exit_info(self, attempt: Attempt) -> ExitInfo | None:
        proc = self.procs.get(attempt.id)
        if proc is None or not proc.ended:
            return None
        return ExitInfo(proc.exit_code, proc.signal, proc.ended_at, "")

    def wait(self, attempt: Attempt, timeout: float | None) -> bool:
        proc = self.procs.get(attempt.id)
        return proc is None or proc.ended

    def stop(self, attempt: Attempt, sig: int) -> None:
        proc = self.procs[attempt.id]
        proc.signals.append(int(sig))
        if proc.obeys_stop and not proc.ended:
            proc.exit_code, proc.ended_at = 10, self.clock.time()  # checkpointed and exited

    def kill(self, attempt: Attempt) -> None:
        proc = self.procs[attempt.id]
        self.kills.append(attempt.n)
        if not proc.ended:
            proc.signal, proc.ended_at = int(signal.SIGKILL), self.clock.time()

    def root_pid(self, attempt: Attempt) -> int | None:
        proc = self.procs.get(attempt.id)
        return None if proc is None or proc.ended else proc.pid

    def root(self, attempt: Attempt) -> tuple[int, float | None] | None:
        pid = self.root_pid(attempt)
        return None if pid is None else (pid, None)

    def status_note(self, attempt: Attempt) -> str | None:
        return None

    def own_pids(self, attempt: Attempt) -> frozenset[int]:
        proc = self.procs.get(attempt.id)
        return frozenset() if proc is None else frozenset({proc.pid})

    def launch_env(self, gpus: Sequence[int]) -> dict[str, str]:
        return {"CUDA_VISIBLE_DEVICES": ",".join(str(g) for g in gpus)}

    def exit_fd(self, attempt: Attempt) -> int | None:
        return None

    def start_time(self, attempt: Attempt) -> float | None:
        return attempt.started_at

    def requeues(self, attempt: Attempt) -> tuple[dict[str, object], ...]:
        return ()  # nothing requeues a process in place

    def gpu_probe(self, attempt: Attempt, default: GpuProbe) -> GpuProbe:
        return default

    def quarantine_nodes(self, attempt: Attempt, nodes: Sequence[str], reason: str) -> tuple[str, ...]:
        return ()
