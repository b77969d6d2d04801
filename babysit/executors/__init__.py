"""Executors start, watch and stop an attempt's processes: `local` (a subprocess tree) and `slurm`.

This package's own module holds what they share (the protocol, `Launched`, `ExitInfo`); the daemon
picks one by name (`babysit.service.roster.open_executor`), so this module imports neither back. The shim
(one process a run) is run by its file's path, not as this package's module, so it never loads this one
(nor the store and GPU probe it names): babysit/executors/shim.py.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from babysit.core.nodes import NodeRow
from babysit.core.spec.run_toml import RunSpec
from babysit.db.store import Attempt
from babysit.probes.gpu import GpuProbe


@dataclass(frozen=True)
class Launched:
    started_at: float
    pid: int | None = None  # the process-group leader (local)
    pid_create_time: float | None = None
    job_id: str | None = None  # slurm


@dataclass(frozen=True)
class ExitInfo:
    exit_code: int | None
    signal: int | None
    ended_at: float | None
    stderr_tail: str
    note: str = ""  # e.g. "killed before it could record its exit"
    state: str = ""  # the scheduler's final state (slurm), e.g. OUT_OF_MEMORY
    lost_nodes: tuple[str, ...] = ()  # nodes the scheduler lost under the job (slurm NODE_FAIL): the machine's
    time_limit: bool = False  # the scheduler warned that the job's time limit was near, and the run was stopped


class Executor(Protocol):
    """Everything the supervisor asks an executor, so it never asks which executor it has."""

    name: str
    allocates_gpus: bool  # a scheduler picks the GPUs on a node the daemon cannot see: no launch check here
    runs_here: bool  # the attempt's processes are on this machine: the host probe reads its tree
    exit_poll_seconds: float  # how often exit_info is asked for an attempt without an exit_fd

    def charged_gpus(self, spec: RunSpec) -> int:
        """GPUs an attempt holds on all its nodes together: what its GPU-hours and the cap count."""

    def node_rows(self, attempt: Attempt) -> tuple[NodeRow, ...]:
        """A remote job: one row a node for polls and the RAM floor (core/nodes.py); () for a local run."""

    def straggler(self, attempt: Attempt) -> str | None:
        """A node of a multi-node job that holds the others back, in a sentence naming it; else None."""

    def remote_stacks(self, attempt: Attempt) -> dict[str, str] | None:
        """A stalled remote job's stacks, every rank on every node (`run.stackdump`'s shape); None where
        the run's processes are on the daemon's host and it dumps them itself."""

    def launch_env(self, gpus: Sequence[int]) -> dict[str, str]:
        """Environment the trainer needs from this executor (local: CUDA_VISIBLE_DEVICES in NVML order)."""

    def exit_fd(self, attempt: Attempt) -> int | None:
        """A descriptor (the caller's to close) that turns readable when the attempt ends, so one thread
        watches every run (`babysit.runtime.exitwatch`); None: ask `exit_info` every `exit_poll_seconds`."""

    def start_time(self, attempt: Attempt) -> float | None:
        """When the attempt really started: a queued job (Slurm) says None until it leaves the queue,
        and costs no GPU-time until then; a local process started at launch."""

    def requeues(self, attempt: Attempt) -> tuple[dict[str, object], ...]:
        """The runs of the attempt's job before its scheduler requeued it in place (same job; each
        {restart, start, end, nodes}), oldest first: their GPU-time counts. () where nothing requeues."""

    def gpu_probe(self, attempt: Attempt, default: GpuProbe) -> GpuProbe:
        """Where the attempt's GPUs are read: the daemon's probe, or one beside a remote job."""

    def quarantine_nodes(self, attempt: Attempt, nodes: Sequence[str], reason: str) -> tuple[str, ...]:
        """Keep every later submission off these nodes of the attempt's job (a machine fault on their GPUs);
        returns those newly quarantined. () where the executor has no nodes to keep off (one box)."""

    def launch(self, attempt: Attempt, argv: list[str], env: dict[str, str], workdir: str) -> Launched:
        """Start the attempt; the store already says `launching`."""

    def find(self, attempt: Attempt) -> Launched | None:
        """For an attempt recorded as `launching` by a daemon that died: did it start after all?"""

    def exit_info(self, attempt: Attempt) -> ExitInfo | None:
        """None while the attempt runs; how it ended once it has."""

    def wait(self, attempt: Attempt, timeout: float | None) -> bool:
        """Block until the attempt ends (True) or the timeout passes (False)."""

    def stop(self, attempt: Attempt, sig: int) -> None:
        """Ask the run to stop: `sig` (the spec's `stop_signal`) to the run's leader ONLY — the trainer's
        main process, or the launcher (torchrun) that passes it to its ranks. Never to the whole group:
        DataLoader workers that get it die before their trainer has checkpointed."""

    def kill(self, attempt: Attempt) -> None:
        """SIGKILL every process of the attempt, leader, group and strays alike (after the grace period)."""

    def root_pid(self, attempt: Attempt) -> int | None:
        """The pid whose process tree is the run's (for probes); None where it is not visible here."""

    def root(self, attempt: Attempt) -> tuple[int, float | None] | None:
        """`root_pid` for the host probe: the pid and the create time its launch recorded, unchecked (None
        when not visible here, or known gone). The probe checks the time in the root's stat line, which it
        reads anyway, so a check of a run costs one read of it, not two (bench/README.md, poll round)."""

    def status_note(self, attempt: Attempt) -> str | None:
        """A line for polls (e.g. a pending reason); None when there is nothing to say."""

    def own_pids(self, attempt: Attempt) -> frozenset[int]:
        """Pids the attempt's processes had that the daemon may not have seen in its tree (a trainer
        that exited between two reads): never taken for foreign GPU holders. Empty where not visible."""
