"""What every run is doing, as one frozen row a run: `babysit status`, `status --watch` and the live view.

Progress comes from the run's log, not only from polls: polls are posted every 30 minutes, but a
run at step 620 has said so in its log seconds ago. The newest records of the log (read from its
end, read-only; the daemon's offset is never touched) give the step and the pace; the last poll fills
in what only a poll measures (GPU utilization) and stands in for the log when the log cannot be read
here (a Slurm job's log on a filesystem this host does not mount).

`build_row` is pure: store rows and log points in, a `RunRow` out. `Reader` is the thin shell that
fetches them over its own SQLite connection (read-only queries; WAL lets it read while the daemon
writes).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from babysit import sources
from babysit.core import progress
from babysit.core.errors import BabysitError
from babysit.core.progress import Progress, ProgressFields, declared_end, eta_seconds, target_step
from babysit.core.reading.log_records import LogRecord, seconds_per_step
from babysit.core.run_events import Relaunch
from babysit.core.spec.run_toml import RunSpec, load_spec
from babysit.core.status import ENDED_STATUSES, SHOWN_OUT_OF_SIGHT, RunStatus
from babysit.db.url import open_existing
from babysit.runtime import registry
from babysit.sources import logtail
from babysit.view.readstore import ReadStore

__all__ = ["ENDED", "Ended", "Incident", "Read", "Reader", "RunRow", "ShownFacts", "build_row", "collect",
           "declared_end", "eta_seconds", "target_step"]
from babysit.db.store import Attempt, HostLease, Poll, Row, Store

ENDED = ENDED_STATUSES  # run states no daemon acts on again
CLOCK_SLACK_S = 2.0  # a record stamped this much before its attempt's start still counts as the attempt's
LOG_WINDOW_BYTES = 32 * 1024  # the end of the log read per run per refresh: enough for ~100 records


@dataclass(frozen=True)
class Incident:
    kind: str
    at: float


@dataclass(frozen=True)
class Ended:
    """How a run that is over ended: shown instead of the last incident on the way there (a stale
    `retrying` under a finished run says the wrong thing)."""

    outcome: str | None
    at: float | None
    reason: str | None


@dataclass(frozen=True)
class Read:
    """The run's latest verdict read: PROVISIONAL before the read step, FINAL after, NO-READ without data."""

    status: str | None
    label: str | None
    delta: float | None
    at_step: int | None


@dataclass(frozen=True)
class RunRow(ProgressFields):
    run: str
    status: str  # registered | pending | running | stopping | retrying | finished | failed | stopped | refused
    attempt: int | None = None
    max_attempts: int | None = None
    profile: str | None = None
    outcome: str | None = None  # the last attempt's outcome, once it ended
    progress: Progress = field(default_factory=lambda: progress.derive(
        step=None, seconds_per_step=None, read_step=None, end_step=None, gpu_hours_used=0.0, gpu_hours_cap=None,
        n_gpus=0, running=False))  # step, s/step, ETA (only while running) and its step, GPU-hours, the cap
    progress_from: str | None = None  # where the step came from: "log" (read now) | "daemon" | "poll" | None
    last_record_ts: float | None = None  # the newest log record's own timestamp
    gpus: int = 0
    gpu_util_pct: tuple[float, ...] = ()  # from the attempt's last poll; () when not measured
    gpu_hours_cap_file: float | None = None  # run.toml's cap when it is not the one the daemon enforces
    last_poll_at: float | None = None
    last_incident: Incident | None = None
    ended: Ended | None = None  # set once the run is finished, failed or stopped
    verdict: Read | None = None
    hardware_profile: Mapping[str, Any] | None = field(default=None, compare=False)
    note: str | None = None  # why something is missing (an unreadable run.toml)
    preset: str | None = None  # the printed-log preset reading it ([source] preset, or the one `auto` chose)
    preset_pending: bool = False  # preset = "auto" and no printed line matched a preset yet
    log_hint: str | None = None  # an empty JSONL log while it prints: what its first poll found in its lines

    @property
    def gpu_hours(self) -> float:
        return self.progress.gpu_hours_used

    def to_dict(self) -> dict[str, Any]:
        """The `status --json` shape (also what the Slack bot reads)."""
        return {
            "run": self.run, "status": self.status, "attempt": self.attempt, "max_attempts": self.max_attempts,
            "profile": self.profile, "outcome": self.outcome,
            "step": self.step, "target_step": self.target_step,
            "seconds_per_step": self.seconds_per_step, "eta_seconds": self.eta_seconds,
            "progress_from": self.progress_from, "last_record_ts": self.last_record_ts,
            "end_step": self.progress.end_step, "read_step": self.progress.read_step,
            "gpus": self.gpus, "gpu_util_pct": list(self.gpu_util_pct), "gpu_hours": self.gpu_hours,
            "gpu_hours_projected": self.progress.gpu_hours_projected,
            "gpu_hours_cap": self.gpu_hours_cap, "gpu_hours_cap_file": self.gpu_hours_cap_file,
            "last_poll_at": self.last_poll_at,
            "last_incident": None if self.last_incident is None else
            {"kind": self.last_incident.kind, "at": self.last_incident.at},
            "ended": None if self.ended is None else
            {"outcome": self.ended.outcome, "at": self.ended.at, "reason": self.ended.reason},
            "verdict": None if self.verdict is None else
            {"status": self.verdict.status, "label": self.verdict.label, "delta": self.verdict.delta,
             "at_step": self.verdict.at_step},
            "hardware_profile": None if self.hardware_profile is None else dict(self.hardware_profile),
            "note": self.note,
            "preset": self.preset,
        }


@dataclass(frozen=True)
class ShownFacts:
    """What the surfaces show of a run's facts (`Store.run_state`: its run_state row's JSON and its reading,
    as its daemon wrote them), read once (`from_dict`, the SQL boundary) into the values `build_row` needs."""

    step: int | None = None  # the daemon's last reading of the log
    enforced: bool = False  # the daemon stored the spec it enforces (then `enforced_cap` is its cap)
    enforced_cap: float | None = None
    enforced_max_attempts: int | None = None  # [retry] max_attempts as its daemon loaded it
    relaunch: Relaunch | None = None  # `babysit relaunch`: attempts after `relaunch.after` are a new sequence
    ended: str | None = None  # how the run ended, in the daemon's word
    end_reason: str | None = None
    hardware_profile: Mapping[str, Any] | None = field(default=None, compare=False)  # `babysit smoke`'s record
    preset: str | None = None  # the printed-log preset `auto` chose
    log_hint: str | None = None  # an empty JSONL log while it prints: what its first poll found in its lines

    @classmethod
    def from_dict(cls, facts: Mapping[str, Any]) -> ShownFacts:
        enforced = facts.get("enforced")
        return cls(step=facts.get("step"), enforced=isinstance(enforced, Mapping),
                   enforced_cap=enforced.get("gpu_hours_cap") if isinstance(enforced, Mapping) else None,
                   enforced_max_attempts=enforced.get("max_attempts") if isinstance(enforced, Mapping) else None,
                   relaunch=Relaunch.from_dict(facts.get("relaunched")), ended=facts.get("ended"),
                   end_reason=facts.get("end_reason"), hardware_profile=facts.get("hardware_profile"),
                   preset=facts.get("preset"), log_hint=facts.get("log_hint"))


def build_row(name: str, *, status: str, facts: ShownFacts, attempts: Sequence[Attempt],
              poll: Poll | None, incident: Row | None, verdict: Row | None, now: float,
              spec: RunSpec | None, records: Sequence[LogRecord] | None, note: str | None = None) -> RunRow:
    """One run's row at `now`. `records` are the newest records of its log (None: the log could not be
    read); `poll` is its latest poll, `incident` its latest incident, `verdict` its latest read. Its
    progress is `core.progress`'s, as the poll derives it; the cap is the one the daemon enforces."""
    last = attempts[-1] if attempts else None
    live = status in (RunStatus.RUNNING, RunStatus.STOPPING)
    shown_status = status if attempts or status != RunStatus.PENDING else "registered"

    step = facts.step  # the daemon's last reading of the log
    source: str | None = "daemon" if step is not None else None
    sps: float | None = None
    last_ts: float | None = None
    if records:
        since = (last.started_at or last.created_at) - CLOCK_SLACK_S if last is not None else None
        mine = [r for r in records if since is None or r.ts >= since]  # never the previous attempt's pace
        if mine or not live:  # a live attempt's progress is its own records, not an older attempt's
            step, last_ts, source = records[-1].step, records[-1].ts, "log"
        sps = seconds_per_step(mine) if len(mine) >= 2 else None
    this_poll = poll if poll is not None and last is not None and poll.attempt == last.n else None
    if this_poll is not None and records is None:  # the log is out of reach here (a Slurm job's filesystem)
        sps = this_poll.snapshot.seconds_per_step
        if step is None and this_poll.snapshot.step is not None:
            step, source = this_poll.snapshot.step, "poll"

    read_step = spec.prereg.read_step if spec is not None and spec.prereg is not None else None
    end_step = progress.end_step(spec.total_steps if spec is not None else None, declared_end(records or ()),
                                 progress.steps_from_argv(last.argv) if last is not None and last.argv else None)
    file_cap = spec.guards.gpu_hours_cap if spec is not None else None
    cap = facts.enforced_cap if facts.enforced else file_cap  # the one the daemon enforces
    # the GPUs the attempt holds on all its nodes (a 2-node x 8-GPU Slurm job: 16), else the run.toml's
    n_gpus = last.gpus if last is not None else (len(spec.gpus) if spec is not None else 0)
    progressed = progress.derive(step=step, seconds_per_step=sps, read_step=read_step, end_step=end_step,
                                 gpu_hours_used=progress.gpu_hours_used(attempts, now), gpu_hours_cap=cap,
                                 n_gpus=n_gpus, running=live)
    utils = tuple(g.util_pct for g in this_poll.snapshot.measured if g.util_pct is not None) \
        if this_poll is not None else ()
    v = verdict.body if verdict is not None else None
    # as its daemon loaded it, else its run.toml (another box's run has none here: its daemon's word alone)
    most = facts.enforced_max_attempts or (spec.retry.max_attempts if spec is not None else None)
    return RunRow(
        run=name, status=shown_status, attempt=last.n if last else None,
        max_attempts=((facts.relaunch.after if facts.relaunch else 0) + most
                      if most is not None else None),  # a relaunched run's sequence goes on from its last attempt
        profile=last.profile if last else None, outcome=last.outcome if last else None,
        progress=progressed, progress_from=source, last_record_ts=last_ts, gpus=n_gpus, gpu_util_pct=utils,
        gpu_hours_cap_file=file_cap if spec is not None and file_cap != cap else None,
        last_poll_at=poll.at if poll is not None else None,
        last_incident=Incident(incident.kind, incident.at) if incident is not None else None,
        ended=Ended(facts.ended or last.outcome, last.ended_at, facts.end_reason)
        if status in ENDED and last is not None else None,
        verdict=None if v is None else Read(v.get("status"), v.get("label"), v.get("delta"), v.get("at_step")),
        hardware_profile=facts.hardware_profile,  # set by `babysit smoke`
        # where a live job runs, as its executor said in the latest poll ("Slurm job 12 RUNNING on n[1-2]")
        note=note or (this_poll.snapshot.note if this_poll is not None and live else None),
        preset=facts.preset or (spec.source.preset if spec is not None and spec.source.preset != "auto"
                                       else None),
        preset_pending=spec is not None and spec.source.preset == "auto" and not facts.preset,
        log_hint=facts.log_hint if not records else None,
    )


@dataclass(frozen=True)
class _Bulk:
    """Every run's state, attempts, latest poll, incident and verdict, each read in one query."""

    states: Mapping[str, tuple[str, dict[str, Any]]]
    attempts: Mapping[str, list[Attempt]]
    polls: Mapping[str, Poll]
    incidents: Mapping[str, Row]
    verdicts: Mapping[str, Row]

    @classmethod
    def read(cls, store: Store) -> _Bulk:
        by_run: dict[str, list[Attempt]] = {}
        for a in store.all_attempts():  # in id order: each run's in its attempts' order
            by_run.setdefault(a.run, []).append(a)
        return cls(store.run_states(), by_run, store.latest_polls(), store.latest_incidents(),
                   store.latest_verdicts())


LIVE_STATUSES = SHOWN_OUT_OF_SIGHT


def out_of_sight(row: RunRow, box_state: str) -> RunRow:
    """A live run of a box that is lost or stopped: `host-lost` / `host-down` (not failed: it may well still
    train), its step the last one its daemon stored, said so, and no ETA or GPU utilization, which would be
    a pace and a reading nobody has measured since (the same ETA, frozen, for as long as the box is away)."""
    note = (f"{row.note} " if row.note else "") + f"({box_state}: its step as last stored)"
    return replace(row, status=f"host-{box_state}", progress=replace(row.progress, eta_seconds=None),
                   gpu_util_pct=(), note=note)


def host_states(hosts: Sequence[HostLease]) -> dict[str, str]:
    """box -> "up" | "lost" (its lease lapsed: another box noticed) | "down" (its daemon was stopped)."""
    return {h.name: h.state for h in hosts}


class Reader:
    """Rows of every registered run, read with a connection of its own (read-only queries).

    Kept open by `status --watch` and the live view across refreshes: the registry, each run.toml and
    each run's log tail are read again only when their files change.
    """

    def __init__(self, registry_path: Path) -> None:
        self._registry = RegistryCache(registry_path)
        self._registry.get()  # a registry that cannot be read is the caller's error now, not at the first rows
        self._specs = SpecCache()
        self._tails = TailCache()
        self._store = ReadStore(self._registry.get)  # on the mirror: PostgreSQL tried again at each look

    @property
    def registry(self) -> registry.Registry:
        return self._registry.get()

    @property
    def state_dir(self) -> Path:
        return self.registry.state_dir

    def close(self) -> None:
        self._store.close()

    def rows(self, names: Sequence[str] | None = None, now: float | None = None, *,
             logs: bool = True) -> list[RunRow]:
        """The rows of `names` (default: every registered run and, in a fleet, every other box's runs, read
        from the database alone: their run.toml and logs are on their boxes). A run whose box is lost shows
        `host-lost`, one whose daemon was stopped `host-down`: not failed, only out of sight. Without `logs`
        no log is read here either: every row's progress is what the daemons stored (the fleet gateway's
        answer, the same for every box's runs; bench/README.md §12)."""
        now = time.time() if now is None else now
        return self._store.read(lambda store: self._rows(store, names, now, logs))

    def _rows(self, store: Store | None, names: Sequence[str] | None, now: float, logs: bool) -> list[RunRow]:
        reg = self.registry
        owners = store.run_hosts() if store is not None and store.host is not None else {}
        away = host_states(store.hosts()) if owners else {}
        wanted = list(reg.names if names is None else names)
        if names is None:
            wanted += sorted(set(owners) - set(wanted))
        # a fleet's every run: five queries in all, not five a run (a round trip over the network each)
        bulk = _Bulk.read(store) if owners and names is None else None
        out = []
        for name in wanted:
            entry = reg.find(name)
            if entry is None and name not in owners:
                entry = reg.get(name)  # unknown here and in the fleet: UnknownRun, the registered runs listed
            spec, note = self._specs.get(reg.spec_path(entry)) if entry is not None else (None, None)
            if store is None:
                out.append(build_row(name, status="pending", facts=ShownFacts(), attempts=(), poll=None, incident=None,
                                     verdict=None, now=now, spec=spec, records=None, note=note))
                continue
            if bulk is not None:
                status, facts = bulk.states.get(name, ("pending", {}))
                attempts, verdict = bulk.attempts.get(name, []), bulk.verdicts.get(name)
                poll, incident = bulk.polls.get(name), bulk.incidents.get(name)
            else:
                status, facts = store.run_state(name)
                attempts, verdict = store.attempts(name), store.latest_verdict(name)
                polls, incidents = store.polls(name, 1), store.incidents(name, 1)
                poll, incident = (polls[0] if polls else None), (incidents[0] if incidents else None)
            records = (self._tails.get(sources.records_path(spec, reg.state_dir))
                       if logs and spec is not None and attempts else None)
            owner = owners.get(name) or (spec.host if spec is not None else None)
            if entry is None or (store.host is not None and owner not in (None, store.host)):
                note = f"on box {owner or '?'}"  # another box's run ([run] host): its files are there
            row = build_row(
                name, status=status, facts=ShownFacts.from_dict(facts), attempts=attempts, poll=poll, incident=incident,
                verdict=verdict,
                now=now, spec=spec, records=records, note=note)
            box_state = away.get(owners.get(name, ""))
            if box_state in ("lost", "down") and row.status in LIVE_STATUSES:
                row = out_of_sight(row, box_state)
            out.append(row)
        return out

    def fleet_boxes(self) -> list[str]:
        """`fleet_boxes` on this reader's connection (after `rows`: the same look, on the store it chose)."""
        return self._store.read(lambda store: fleet_boxes(self.registry, store), retry=False)

    def store(self) -> Store | None:
        """The store once it exists: `status` never creates a state directory the daemon has not. With
        PostgreSQL unreachable, the box's local mirror (its daemon's copy of its runs), said by `banner`;
        after `rows`, the store that look chose (a mirror is not swapped for a second wait on PostgreSQL)."""
        return self._store.get(retry=False)

    def banner(self) -> str | None:
        """The line a reader prints above the rows when they come from the box's mirror, else None."""
        return self._store.banner()


def fleet_boxes(reg: registry.Registry, store: Store | None = None) -> list[str]:
    """One line a box of the fleet: its state, how long since its lease was renewed (its staleness), its
    runs. Empty on SQLite (one box). `store`: an open one to ask (else one is opened and closed here)."""
    own = store is None
    store = open_existing(reg) if own else store
    if store is None or store.host is None:
        if store is not None and own:
            store.close()
        return []
    try:
        hosts, owners, now = store.hosts(), store.run_hosts(), store.now()
    finally:
        if own:
            store.close()
    states = host_states(hosts)
    lines = []
    for h in hosts:
        runs = sorted(r for r, box in owners.items() if box == h.name)
        lines.append(box_staleness(h, states[h.name], now) + f", {len(runs)} run(s)"
                     + (f": {', '.join(runs)}" if runs else ""))
    return lines


def box_away(store: Store, run: str) -> tuple[str, str] | None:
    """(the box, its staleness line) when `run`'s box of the fleet is lost or its daemon was stopped: no
    daemon answers a request for it before that box is back. None on one box, or while that box is up."""
    if store.host is None:
        return None
    owner = store.run_hosts().get(run)
    host = next((h for h in store.hosts() if h.name == owner), None) if owner is not None else None
    if host is None or host.state == "up":
        return None
    return host.name, box_staleness(host, host.state, store.now())


def box_staleness(host: HostLease, state: str, now: float) -> str:
    """'box box-b: up, lease renewed 4 s ago': how fresh what the database says of that box is."""
    shown = {"up": "up", "lost": "LOST", "down": "down (daemon stopped)"}[state]
    return f"box {host.name}: {shown}, lease renewed {max(0.0, now - host.renewed_at):.0f} s ago"


def collect(registry_path: Path, names: Sequence[str] | None = None, now: float | None = None) -> list[RunRow]:
    """One look: the rows of `names` (default: every registered run)."""
    reader = Reader(registry_path)
    try:
        return reader.rows(names, now)
    finally:
        reader.close()


def file_id(path: Path) -> tuple[int, int, int] | None:
    """What says a file changed: mtime, size, inode (None: it is not there)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_mtime_ns, st.st_size, st.st_ino


class SpecCache:
    """run.toml files parsed once and again only when they change; thread-safe (the web page's readers).

    A file edited into something invalid gives (None, note): the store still says what ran."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._specs: dict[Path, tuple[Any, RunSpec | None, str | None]] = {}

    def get(self, path: Path) -> tuple[RunSpec | None, str | None]:
        seen = file_id(path)
        with self._lock:
            hit = self._specs.get(path)
        if hit is not None and hit[0] == seen:
            return hit[1], hit[2]
        try:
            spec, note = load_spec(path), None
        except BabysitError as exc:
            spec, note = None, f"run.toml unreadable: {exc.message}"
        with self._lock:
            self._specs[path] = (seen, spec, note)
        return spec, note


class RegistryCache:
    """babysit.toml, parsed again only when it changes; thread-safe (the web page's readers). While it is
    being rewritten by hand (unreadable), the last good one, as the daemon does; with none, the error."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self._seen: tuple[Any, registry.Registry] | None = None

    def get(self) -> registry.Registry:
        seen = file_id(self.path)
        with self._lock:
            hit = self._seen
        if hit is not None and hit[0] == seen:
            return hit[1]
        try:
            loaded = registry.load(self.path)
        except BabysitError:
            if hit is not None:
                return hit[1]
            raise
        with self._lock:
            self._seen = (seen, loaded)
        return loaded


class TailCache:
    """The newest records of each log (`LOG_WINDOW_BYTES` of it: what a status row reads), read again only
    when the log changed; thread-safe. A finished run's log costs a stat a refresh."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._tails: dict[Path, tuple[Any, tuple[LogRecord, ...] | None]] = {}

    def get(self, log: Path) -> tuple[LogRecord, ...] | None:
        seen = file_id(log)
        with self._lock:
            hit = self._tails.get(log)
        if hit is not None and hit[0] == seen and seen is not None:
            return hit[1]
        records = logtail.read_recent(log, LOG_WINDOW_BYTES)
        with self._lock:
            self._tails[log] = (seen, records)
        return records
