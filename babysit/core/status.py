"""A run's and an attempt's statuses, named once (SkyPilot's ManagedJobStatus is the model).

They are `StrEnum`s: a member *is* its string, so the values the store keeps, the JSON the web page
serves and the words `babysit status` prints are the same as before; code compares against members,
never against string literals spread over the shell. Which statuses are terminal, live or ended is
said here and nowhere else.
"""

from __future__ import annotations

from enum import StrEnum


class RunStatus(StrEnum):
    PENDING = "pending"  # registered, no attempt decided yet (the store's default)
    RUNNING = "running"
    STOPPING = "stopping"  # a stop was requested (abort, a guard) and the attempt has not exited yet
    RETRYING = "retrying"  # an attempt ended and the next one is being launched
    FINISHED = "finished"
    FAILED = "failed"
    STOPPED = "stopped"
    REFUSED = "refused"  # a launch was refused (the GPUs are held or unseen): a restarted daemon tries again
    RELAUNCHING = "relaunching"  # `babysit relaunch` took an ended run: its next attempt is being launched
    WAITING_GPU = "waiting-gpu"  # the next attempt waits for a quarantined GPU (`babysit gpu release`)

    @property
    def terminal(self) -> bool:
        """No daemon acts on the run until something changes (a restart retries a refused launch)."""
        return self in _TERMINAL

    @property
    def ended(self) -> bool:
        """Over for good: its last attempt ended and no daemon launches it again."""
        return self in _ENDED

    @property
    def live(self) -> bool:
        """An attempt is running (or being stopped)."""
        return self in _LIVE

    @classmethod
    def of(cls, value: str) -> RunStatus:
        """The member a stored value names (`ValueError` names the value for anything else)."""
        return cls(value)


class Outcome(StrEnum):
    """How an attempt ended (core/classify.py decides it; retry.on, [[classify]] and exit codes name it)."""

    COMPLETED = "completed"
    STOPPED = "stopped"  # on request (an abort, a guard) or by a signal babysit did not send
    OOM = "oom"
    DIVERGED = "diverged"
    CRASHED = "crashed"
    STALLED = "stalled"
    GPU_FAULT = "gpu-fault"  # the machine's fault: its own retry budget
    NODE_LOST = "node-lost"  # the machine's fault: the scheduler lost a node under the job (Slurm NODE_FAIL)
    TIME_LIMIT = "time-limit"  # Slurm's time limit reached cleanly: the run goes on in a new job
    PREEMPTED = "preempted"  # the scheduler took the job's nodes for another job: the run goes on in a new job


# The outcomes a run can be retried on, and a [[classify]] rule can give (run.toml's retry.on, failure_class)
FAILURE_OUTCOMES: tuple[Outcome, ...] = (Outcome.OOM, Outcome.DIVERGED, Outcome.CRASHED, Outcome.STALLED,
                                        Outcome.GPU_FAULT, Outcome.NODE_LOST)
# The machine's faults: they share `[retry] gpu_fault_max`, never `max_attempts`
MACHINE_FAULTS: tuple[Outcome, ...] = (Outcome.GPU_FAULT, Outcome.NODE_LOST)
# The scheduler's own ends, not failures: the run goes on from its checkpoint whatever `retry.on` says
CHAINED_OUTCOMES: tuple[Outcome, ...] = (Outcome.TIME_LIMIT, Outcome.PREEMPTED)


class AttemptStatus(StrEnum):
    LAUNCHING = "launching"  # recorded before its process was started: adoption starts it once
    RUNNING = "running"
    ENDED = "ended"

    @property
    def live(self) -> bool:
        return self is not AttemptStatus.ENDED


# The stored run states a lost (or stopped) box's run is shown `host-lost` (`host-down`) in: it may well
# still train. An ended run keeps its own status; the lost alert names only these.
SHOWN_OUT_OF_SIGHT = ("pending", "running", "stopping", "retrying", "registered")

_ENDED = frozenset({RunStatus.FINISHED, RunStatus.FAILED, RunStatus.STOPPED})
_TERMINAL = _ENDED | {RunStatus.REFUSED}
_LIVE = frozenset({RunStatus.RUNNING, RunStatus.STOPPING})

ENDED_STATUSES: tuple[RunStatus, ...] = tuple(s for s in RunStatus if s.ended)
TERMINAL_STATUSES: tuple[RunStatus, ...] = tuple(s for s in RunStatus if s.terminal)
LIVE_ATTEMPT_STATUSES: tuple[AttemptStatus, ...] = tuple(s for s in AttemptStatus if s.live)
# The words a surface shows for a run: `registered` is what a run with no state yet is called on screen.
SHOWN_STATUSES: tuple[str, ...] = ("registered", *(s.value for s in RunStatus))
