"""What happens to a run and what babysit does about it: the events and effects of `run_machine.step`.

Frozen values only. An event carries the time it was seen and what the shell saw (an exit already
classified, the guards' actions on one observation); an effect says what the shell is to write, post,
launch, signal or kill (babysit/run/supervisor.py carries them out in order).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from babysit.core.guards import Action
from babysit.core.status import RunStatus


def frozen(m: Mapping[str, Any] | None) -> Mapping[str, Any]:
    return m if isinstance(m, MappingProxyType) else MappingProxyType(dict(m or {}))


@dataclass(frozen=True)
class StopOrder:
    """A requested stop of attempt `attempt`: recorded before the signal is sent (`sent_at` after), so a
    daemon that died in between sends it on adoption and one that died after does not send it twice."""

    attempt: int
    reason: str
    at: float
    signal: str
    sent_at: float | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"attempt": self.attempt, "reason": self.reason, "at": self.at, "signal": self.signal}
        if self.sent_at is not None:
            out["sent_at"] = self.sent_at
        return out

    @classmethod
    def from_dict(cls, d: Mapping[str, Any] | None, default_signal: str) -> StopOrder | None:
        if not d or d.get("attempt") is None:
            return None
        sent = d.get("sent_at")
        return cls(int(d["attempt"]), str(d.get("reason") or "?"), float(d.get("at") or 0.0),
                   str(d.get("signal") or default_signal), None if sent is None else float(sent))


@dataclass(frozen=True)
class Relaunch:
    """`babysit relaunch` took the ended run (docs/spec.md, Relaunching): attempts after `after` are a new
    sequence, whose profiles and `retry.max_attempts` count from it."""

    after: int
    by: str = "?"
    resume: bool = False

    @classmethod
    def from_dict(cls, d: Mapping[str, Any] | None) -> Relaunch | None:
        if not d:
            return None
        return cls(int(d.get("after", 0)), str(d.get("by") or "?"), bool(d.get("resume")))


# -- events ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Registered:
    """The daemon took the run on: at start-up (after a restart too) or when it was registered."""

    at: float


@dataclass(frozen=True)
class Launched:
    """Attempt n's process started (a new attempt, or a recorded one a dead daemon never started)."""

    at: float
    n: int
    profile: str
    gpus: int
    started_at: float
    halvings: int = 0
    note: str | None = None


@dataclass(frozen=True)
class LaunchRefused:
    """The prelaunch guards refused attempt n (GPUs held or unseen): no attempt was begun."""

    at: float
    n: int
    refusals: tuple[Action, ...]


@dataclass(frozen=True)
class WaitingForGpu:
    """Attempt n needs a quarantined GPU and has no stand-in: it is not begun, the run waits and looks again."""

    at: float
    n: int
    waiting_for: tuple[int, ...]


@dataclass(frozen=True)
class Adopted:
    """A live attempt of a dead daemon found running (it is watched from now on)."""

    at: float
    n: int
    started_at: float | None


@dataclass(frozen=True)
class RecordsRead:
    """New log records of attempt n: whether one carried the prereg's metric (a verdict read is due), and
    a watched metric that went non-finite (noted on the attempt once; the guards stop on it)."""

    at: float
    n: int
    new_eval: bool = False
    nonfinite: str | None = None


@dataclass(frozen=True)
class PollDue:
    at: float
    kind: str | None = None  # first | periodic | on-demand (None: first or periodic, by the history)


@dataclass(frozen=True)
class GuardReading:
    """The live guards' actions on one observation of attempt n; `exited`: its process had already exited
    with its own code (then that is its outcome, never a guard stop)."""

    at: float
    n: int
    actions: tuple[Action, ...]
    exited: bool = False
    run_pids: frozenset[int] = frozenset()  # the run's processes now (a stall's stack dump is theirs)


@dataclass(frozen=True)
class ExitSeen:
    """Attempt n exited, classified (babysit.core.classify) by the shell from what it saw."""

    at: float
    n: int
    outcome: str
    summary: str
    ended_at: float | None = None
    exit_code: int | None = None
    signal: int | None = None
    retry_override: bool | None = None
    stopped_by: str | None = None  # set when a requested stop decided the outcome
    detail: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))

    def __post_init__(self) -> None:
        object.__setattr__(self, "detail", frozen(self.detail))


@dataclass(frozen=True)
class InternalError:
    """Handling attempt n's exit failed unexpectedly: n ends `crashed` unclassified and the run fails
    (unless a later attempt was launched), with the error as its reason."""

    at: float
    n: int
    error: str
    ended_at: float | None = None
    exit_code: int | None = None
    signal: int | None = None


@dataclass(frozen=True)
class Request:
    """A control request: abort (stop the running attempt), poll (now). A relaunch is no request of a
    run's machine: the daemon records it (status relaunching) and starts the run anew (`Registered`)."""

    at: float
    kind: str  # abort | poll
    by: str = "?"
    id: int | None = None


@dataclass(frozen=True)
class VerdictRead:
    """A FINAL verdict was read (`stored`: the store already holds it: a dead daemon saved it)."""

    at: float
    body: Mapping[str, Any]
    stored: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "body", frozen(self.body))


@dataclass(frozen=True)
class StopGraceOver:
    """The stop's grace period of attempt n is over; `exited`: its process is gone already."""

    at: float
    n: int
    exited: bool


@dataclass(frozen=True)
class StopSent:
    """The stop signal of attempt n went out at `sent_at`: a daemon that dies after this does not send it again."""

    at: float
    n: int
    sent_at: float


Event = (Registered | Launched | LaunchRefused | WaitingForGpu | Adopted | RecordsRead | PollDue | GuardReading
         | ExitSeen | InternalError | Request | VerdictRead | StopGraceOver | StopSent)


# -- effects --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Launch:
    """Check the GPUs, record attempt n, start it (then `Launched`, or `LaunchRefused`)."""

    n: int
    resume: bool
    halvings: int
    note: str | None


@dataclass(frozen=True)
class Adopt:
    """A live attempt after a restart: find it (a recorded one never started is started: `Launched`),
    else `Adopted`."""

    n: int


@dataclass(frozen=True)
class SetStatus:
    """Write the run's status (and facts beside it)."""

    status: RunStatus
    facts: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))

    def __post_init__(self) -> None:
        object.__setattr__(self, "facts", frozen(self.facts))


@dataclass(frozen=True)
class RecordExit:
    """Write attempt n's end (its one outcome)."""

    n: int
    outcome: str
    ended_at: float | None
    exit_code: int | None
    signal: int | None
    detail: Mapping[str, Any]


@dataclass(frozen=True)
class NoteAttempt:
    """Merge facts into attempt n's detail (host-memory pressure, a non-finite metric)."""

    n: int
    facts: Mapping[str, Any]


@dataclass(frozen=True)
class Post:
    """Queue a channel message about attempt n: `launch` (the run's thread) or `ended`."""

    kind: str
    n: int
    note: str | None = None


@dataclass(frozen=True)
class Incident:
    """Record and post an incident (once per `key`); `stacks_of`: add these processes' stack dump (a stall)."""

    kind: str
    message: str
    detail: Mapping[str, Any]
    key: str
    stacks_of: frozenset[int] | None = None
    unless_raised: str | None = None  # skip it when a guard raised this key already (the same cause)
    ends: int | None = None  # it says attempt n ended (one post for a crash); skipped: n's `ended` post instead


@dataclass(frozen=True)
class Watch:
    """Watch attempt n's exit (and schedule its polls)."""

    n: int


@dataclass(frozen=True)
class Signal:
    """Send the stop signal to attempt n's leader, the SIGKILL armed `kill_after` seconds later first;
    then tell the machine it was sent (`StopSent`)."""

    n: int
    stop: StopOrder
    kill_after: float


@dataclass(frozen=True)
class NoteStop:
    """Record the stop in force (its `sent_at` now set): a restarted daemon reads it back."""

    stop: StopOrder


@dataclass(frozen=True)
class ArmKill:
    """SIGKILL attempt n after `delay` seconds unless it exits (then `StopGraceOver`)."""

    n: int
    delay: float


@dataclass(frozen=True)
class Kill:
    n: int


@dataclass(frozen=True)
class Recheck:
    """Read the guards again soon (a foreign-looking GPU holder seen once)."""

    n: int
    action: Action


@dataclass(frozen=True)
class TakePoll:
    n: int
    kind: str | None


@dataclass(frozen=True)
class ReadVerdict:
    """Read the verdict: `full` from the whole log as a finished file (after the last exit)."""

    full: bool


@dataclass(frozen=True)
class SaveVerdict:
    """Write the FINAL verdict's JSON and save it (`stored`: saved already; its JSON rewritten if lost)."""

    body: Mapping[str, Any]
    stored: bool = False


@dataclass(frozen=True)
class Chart:
    body: Mapping[str, Any]


@dataclass(frozen=True)
class PostVerdict:
    body: Mapping[str, Any]


@dataclass(frozen=True)
class Forget:
    """The run is over: cancel its timers and polls."""


@dataclass(frozen=True)
class Reply:
    """Answer a control request."""

    id: int | None
    text: str


Effect = (Launch | Adopt | SetStatus | RecordExit | NoteAttempt | Post | Incident | Watch | Signal | NoteStop
          | ArmKill | Kill | Recheck | TakePoll | ReadVerdict | SaveVerdict | Chart | PostVerdict | Forget | Reply)
