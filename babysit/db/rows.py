"""The values the state database's tables are read back as (and a poll to record), frozen: what the
store hands the shell, whichever backend read them (babysit/db/store.py, babysit/db/postgres.py)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from babysit.core.snapshot import Snapshot


@dataclass(frozen=True)
class Attempt:
    id: int
    run: str
    n: int
    profile: str
    argv: tuple[str, ...]
    executor: str
    gpus: int
    attempt_dir: str
    status: str
    pid: int | None
    pid_create_time: float | None
    job_id: str | None
    created_at: float
    started_at: float | None
    ended_at: float | None
    exit_code: int | None
    exit_signal: int | None
    outcome: str | None
    detail: dict[str, Any]

    def gpu_seconds(self, now: float) -> float:
        """Wall time × GPUs, the live attempt's to `now`; with the runs its job made before the scheduler
        requeued it (`requeued_seconds`: started_at moved to the job's new start)."""
        earlier = float(self.detail.get("requeued_seconds") or 0.0)
        if self.started_at is None:
            return earlier * self.gpus
        end = self.ended_at if self.ended_at is not None else now
        return (max(0.0, end - self.started_at) + earlier) * self.gpus


@dataclass(frozen=True)
class OutboxMessage:
    id: int
    run: str
    kind: str
    payload: dict[str, Any]
    thread_of: int | None
    status: str
    tries: int
    next_try_at: float
    created_at: float
    sent_at: float | None
    remote_ref: str | None
    error: str | None


@dataclass(frozen=True)
class Amendment:
    run: str
    n: int
    declared_at: str
    title: str
    text: str
    sha256: str
    prev_sha256: str | None
    data_seen_through_step: int | None


@dataclass(frozen=True)
class OwnerCall:
    """A question put to a campaign's owners with buttons; `decision` is None until one is clicked."""

    id: int
    campaign: str
    run: str
    question: str
    options: tuple[str, ...]
    body: dict[str, Any]
    created_at: float
    decision: str | None
    decided_by: str | None
    decided_at: float | None
    result: str | None


@dataclass(frozen=True)
class PollRow:
    """A poll to record: its row, and its threaded post and live-header update (`Store.record_polls`)."""

    run: str
    attempt: int
    at: float
    kind: str
    snapshot: Snapshot
    thread_of: int | None
    payload: dict[str, Any]  # the posts' JSON (the outbox's), the poll's id added when recorded
    held: bool = False  # its run holds posts the outbox refused: the row alone, its posts the run's (run_posts)


@dataclass(frozen=True)
class Poll:
    """A recorded poll: its row, and its snapshot read back as the value it was when first asked for. The
    polls table's JSON text is kept as read (the SQL boundary) and parsed once, on first use: the web page
    of 1,000 runs reads every run's latest poll, and parses only those whose figures a row shows."""

    id: int
    run: str
    at: float
    kind: str
    attempt: int | None
    stored: str = field(repr=False)  # the snapshot column, JSON

    @classmethod
    def of(cls, id: int, run: str, at: float, kind: str, attempt: int | None, snapshot: Snapshot) -> Poll:
        """A poll as the store would read it back (a test's, a bench's)."""
        return cls(id, run, at, kind, attempt, json.dumps(snapshot.to_dict()))

    @cached_property
    def snapshot(self) -> Snapshot:
        return Snapshot.from_dict(json.loads(self.stored))


@dataclass(frozen=True)
class HostLease:
    """A box of the fleet as the hosts table has it: its lease (the database's clock) and what it published
    (`info`: its GPU report and its word that it stopped, JSON as the box wrote it)."""

    name: str
    started_at: float
    renewed_at: float
    lease_until: float
    pid: int | None
    version: str | None
    lost_at: float | None  # another box noticed its lease lapse
    info: Mapping[str, Any]

    @property
    def state(self) -> str:
        """"up" | "lost" (its lease lapsed: another box noticed) | "down" (its daemon was stopped)."""
        if self.lost_at is not None:
            return "lost"
        return "down" if self.info.get("stopped") else "up"


@dataclass(frozen=True)
class OutboxSummary:
    """The outbox at a glance (/metrics): messages by status, the oldest pending one, the newest error, and
    the posts it refused that their runs hold (queued once it takes rows again)."""

    counts: Mapping[str, int]
    oldest_pending_at: float | None
    last_error: str | None
    last_error_run: str | None
    held: int = 0


@dataclass(frozen=True)
class Row:
    """A poll, an incident, a verdict or a control request: id, run, time and a JSON body."""

    id: int
    run: str
    at: float
    kind: str
    body: dict[str, Any]
    attempt: int | None = None
