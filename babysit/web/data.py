"""What the web pages show, read from the registry, the store and the runs' logs: the thin shell.

Read-only: the store is opened only once it exists (the web server never creates a state directory),
only SELECTs are issued, and the runs' logs are read, never their offsets. Each server thread gets its
own SQLite connection (WAL: pages read while the daemon writes). The rows are the ones `babysit
status` shows (babysit/view/runview.py), so the page, the terminal and Slack say the same thing; runs the
store remembers but the registry no longer lists are shown too, from the store alone.
"""

from __future__ import annotations

import functools
import sqlite3
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from babysit import sources
from babysit.campaign.history import view_of
from babysit.core.campaign.spec import load_campaign
from babysit.core.errors import BabysitError
from babysit.core.nodes import NodeRow
from babysit.core.reading.log_records import LogRecord, metric_series
from babysit.core.spec.run_toml import RunSpec
from babysit.core.status import AttemptStatus
from babysit.db.store import Attempt, Poll, Row, Store
from babysit.run.gpufault import quarantine_lines
from babysit.runtime import registry
from babysit.sources import logtail
from babysit.verdict import prereg_record, reading
from babysit.view import runview
from babysit.view.readstore import Outage, ReadStore
from babysit.view.runview import RegistryCache, RunRow, SpecCache, TailCache, file_id
from babysit.web import svg

CHART_TAIL_BYTES = 256 * 1024  # a run without a [prereg]: its train curve from the log's last records
TEXT_WINDOW_S = 5.0  # an incident and its message are recorded this close together
MIRROR_RETRY_S = 2.0  # while a thread reads the box's mirror, PostgreSQL is tried again this often
F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True)
class IncidentEntry:
    id: int
    at: float
    attempt: int | None
    kind: str
    text: str  # the message posted for it (what Slack was told), else its detail
    detail: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class RunDetail:
    row: RunRow
    registered: bool
    attempts: tuple[Attempt, ...] = ()
    incidents: tuple[IncidentEntry, ...] = ()
    verdict: Mapping[str, Any] | None = None  # the latest read's JSON
    banner: str | None = None  # PostgreSQL unreachable: read from the box's mirror, and since when
    has_chart_png: bool = False  # the FINAL verdict's chart, drawn by the daemon
    chart: svg.CurveChart | None = None
    chart_note: str | None = None  # why there is no chart, or what it leaves out
    prereg: Mapping[str, Any] | None = None  # `babysit prereg show --json`'s shape
    prereg_note: str | None = None
    nodes: tuple[NodeRow, ...] = ()  # a job across nodes: one row a node, from its latest poll
    nodes_poll: Poll | None = None  # that poll (when, which attempt)


@dataclass(frozen=True)
class DaemonFacts:
    """What /metrics says of the daemon: its outbox."""

    outbox_pending: int
    outbox_failed: int
    oldest_pending_at: float | None
    last_error: str | None
    last_error_run: str | None
    outbox_held: int = 0  # posts the outbox refused, held by their runs (babysit/run/run_posts.py)


@dataclass(frozen=True)
class StoreFacts:
    """What /metrics says of the store the page read: degraded while PostgreSQL cannot be reached (the
    box's mirror read instead, or nothing when it has none)."""

    degraded: bool
    mirror_age_s: float | None = None  # since the mirror was last in step with PostgreSQL, while it is read


def _falls_back(method: F) -> F:
    """A read of the page's: made once more, from the box's mirror, when PostgreSQL is lost under it."""

    @functools.wraps(method)
    def read(self: Site, *args: Any, **kwargs: Any) -> Any:
        return self._reader().read(lambda _store: method(self, *args, **kwargs))

    return read  # type: ignore[return-value]


class Site:
    """Everything the pages read, for one registry; safe to call from several threads at once.

    The runs table of 1,000 runs is read with one query a table (not five a run), and what only
    changes with a file (the registry, each run.toml, each log's tail) is re-read only when the file's
    size, mtime or inode changed: a finished run costs a stat a refresh.
    """

    def __init__(self, registry_path: Path) -> None:
        self.registry_path = Path(registry_path)
        self._local = threading.local()
        self._outage = Outage(MIRROR_RETRY_S)  # PostgreSQL unreachable, as the threads' readers found it
        self._lock = threading.Lock()
        self._registry = RegistryCache(self.registry_path)
        self._specs = SpecCache()
        self._tails = TailCache()
        self._series: dict[str, tuple[str, reading.SeriesCache, threading.Lock]] = {}
        self._rows: dict[str, tuple[Any, RunRow]] = {}

    # -- files, re-read when they change --------------------------------------------------------------
    def registry(self) -> registry.Registry:
        return self._registry.get()

    @property
    def state_dir(self) -> Path:
        return self.registry().state_dir

    def spec(self, path: Path) -> tuple[RunSpec | None, str | None]:
        return self._specs.get(path)

    def tail(self, log: Path) -> tuple[LogRecord, ...] | None:
        """The newest records of a log (what `babysit status` reads), re-read only when the log changed."""
        return self._tails.get(log)

    def _reader(self) -> ReadStore:
        """This thread's store, as `babysit status` opens it (babysit/view/readstore.py): the database once
        it exists (never created here), else the box's mirror while PostgreSQL is unreachable."""
        reader = getattr(self._local, "reader", None)
        if reader is None:
            reader = self._local.reader = ReadStore(self.registry, MIRROR_RETRY_S, self._outage)
        return reader

    def _store(self) -> Store | None:
        return self._reader().get()

    def banner(self) -> str | None:
        """What this thread's last read came from, when not the database: the mirror's banner (call it on
        the thread that read, right after: `rows_and_banner`)."""
        return self._reader().banner()

    def store_facts(self) -> StoreFacts:
        """/metrics' store gauge, of this thread's reads."""
        reader = self._reader()
        return StoreFacts(reader.degraded, reader.mirror_age())

    # -- the runs table --------------------------------------------------------------------------------
    def rows_and_banner(self, now: float | None = None) -> tuple[list[RunRow], str | None]:
        """The rows and, when they come from the box's mirror, its banner (one thread's one read)."""
        rows = self.rows(now)
        return rows, self.banner()

    @_falls_back
    def rows(self, now: float | None = None) -> list[RunRow]:
        """Every registered run's row (as `babysit status` shows it), then the store's other runs."""
        now = time.time() if now is None else now
        reg = self.registry()
        store = self._store()
        facts = _Facts.read(store)
        entries = {e.name: e for e in reg.runs}
        out = [self._row(reg, entries[name], name, facts, now) for name in reg.names]
        out += [self._row(reg, None, name, facts, now) for name in sorted(set(facts.states) - set(entries))]
        return out

    def _row(self, reg: registry.Registry, entry: registry.RunEntry | None, name: str, facts: _Facts,
             now: float) -> RunRow:
        spec, note = self.spec(reg.spec_path(entry)) if entry is not None else (None, None)
        if entry is None:
            note = "not in the registry (babysit.toml): shown from the state database only"
        status, known = facts.states.get(name, ("pending", {}))
        attempts = facts.attempts.get(name, ())
        log = sources.records_path(spec, reg.state_dir) if spec is not None and attempts else None
        poll, incident, verdict = facts.polls.get(name), facts.incidents.get(name), facts.verdicts.get(name)
        key = None
        if status in runview.ENDED and all(a.status == AttemptStatus.ENDED for a in attempts):
            # settled: nothing in its row moves with the clock, so the same inputs give the same row
            key = (status, repr(sorted(known.items())), tuple((a.id, a.ended_at, a.outcome) for a in attempts),
                   poll and poll.id, incident and incident.id, verdict and verdict.id, id(spec), note,
                   file_id(log) if log is not None else None)
            with self._lock:
                hit = self._rows.get(name)
            if hit is not None and hit[0] == key:
                return hit[1]
        row = runview.build_row(
            name, status=status, facts=runview.ShownFacts.from_dict(known), attempts=attempts, poll=poll,
            incident=incident, verdict=verdict,
            now=now, spec=spec,
            records=self.tail(log) if log is not None else None, note=note)
        if key is not None:
            with self._lock:
                self._rows[name] = (key, row)
        return row

    # -- one run ---------------------------------------------------------------------------------------
    @_falls_back
    def run(self, name: str, now: float | None = None) -> RunDetail | None:
        """One run's page, or None when neither the registry nor the store knows it."""
        now = time.time() if now is None else now
        reg = self.registry()
        registered = reg.find(name) is not None
        store = self._store()
        if not registered and (store is None or name not in store.run_states()):
            return None
        facts = _Facts.read(store, name)
        row = self._row(reg, reg.get(name) if registered else None, name, facts, now)
        if store is None:
            return RunDetail(row=row, registered=True, chart_note="nothing has run yet: no state database")
        latest = facts.verdicts.get(name)
        polls = store.polls(name, 1)
        across = polls[0] if polls and len(polls[0].snapshot.nodes) > 1 else None  # one node: its note says it
        common = {"row": row, "registered": registered, "attempts": facts.attempts.get(name, ()),
                  "banner": self.banner(), "incidents": incidents(store, name),
                  "verdict": latest.body if latest is not None else None,
                  "has_chart_png": self.chart_png(name) is not None,
                  "nodes": across.snapshot.nodes if across else (), "nodes_poll": across}
        if not registered:
            return RunDetail(**common, chart_note="not in the registry: its run.toml is unknown, so there is no "
                                                  "curve to draw")
        chart, chart_note = self._chart(store, reg, name)
        info, info_note = _prereg_info(self.registry_path, name, store)
        return RunDetail(**common, chart=chart, chart_note=chart_note, prereg=info, prereg_note=info_note)

    @_falls_back
    def chart_png(self, name: str) -> Path | None:
        """The FINAL verdict's PNG the daemon drew, where its verdict row says (`reading.final_chart`)."""
        store = self._store()
        return reading.final_chart(store, name) if store is not None else None

    def _chart(self, store: Store, reg: registry.Registry, name: str) -> tuple[svg.CurveChart | None, str | None]:
        entry = reg.get(name)
        spec, note = self.spec(reg.spec_path(entry))
        if spec is None:
            return None, note
        log = sources.records_path(spec, self.state_dir)
        if spec.prereg is None:
            return _train_chart(log), "no [prereg]: the train loss, from the log's last records"
        tampered = None
        try:
            reading.check_frozen(spec, entry.prereg_sha256)
        except reading.PreregChanged as exc:
            tampered = exc.message
        series, train = self._read_series(name, spec.prereg, log)
        marks = tuple(svg.Mark(a.n, a.title, a.data_seen_through_step) for a in store.amendments(name))
        if tampered is not None:  # the curve, but no bands: they are not what was registered
            return svg.CurveChart(metric=spec.prereg.metric, series=series, marks=marks), tampered
        try:
            verdict = reading.verdict_of(spec, store, series, train)  # as the daemon reads it
        except BabysitError as exc:
            return svg.CurveChart(metric=spec.prereg.metric, series=series, marks=marks), exc.message
        return svg.chart_of(spec.prereg, verdict, series, train, marks), None

    def _read_series(self, name: str, prereg: Any, log: Path) -> tuple[reading.Series, reading.Series]:
        """The metric and train series, from the bytes appended since the last look (a cache a run)."""
        with self._lock:
            cached = self._series.get(name)
            if cached is None or cached[0] != prereg.sha256:
                cached = self._series[name] = (prereg.sha256, reading.SeriesCache(prereg), threading.Lock())
        with cached[2]:  # one reader at a time moves a cache's offset
            return cached[1].update(log)

    # -- campaigns (docs/campaigns.md) -----------------------------------------------------------------
    @_falls_back
    def campaign_names(self) -> list[str]:
        store = self._store()
        try:
            return [c["name"] for c in store.campaigns()] if store is not None else []
        except sqlite3.OperationalError:  # a state database from before campaigns: none
            return []

    @_falls_back
    def campaign(self, name: str) -> tuple[Any | None, str | None]:
        """(the campaign's view with its runs' curves, None) or (None, why not)."""

        store = self._store()
        row = store.campaign(name) if store is not None and name in self.campaign_names() else None
        if row is None:
            return None, None
        try:
            return view_of(load_campaign(row["file"]), store, curves=True), None
        except BabysitError as exc:
            return None, f"campaign {name!r}: {exc.message}"

    def saga_png(self, name: str) -> Path | None:
        """The saga chart the daemon drew (state/campaigns/NAME.png), for a campaign the store knows."""
        if "/" in name or name.startswith(".") or name not in self.campaign_names():
            return None
        path = self.state_dir / "campaigns" / f"{name}.png"
        return path if path.is_file() else None

    @_falls_back
    def quarantined(self) -> list[str]:
        """The quarantined GPUs, one line each (babysit/commands/gpu.py words them)."""
        store = self._store()
        return quarantine_lines(store.quarantined_gpus()) if store is not None else []

    # -- /metrics --------------------------------------------------------------------------------------
    @_falls_back
    def incident_counts(self) -> dict[str, dict[str, int]]:
        store = self._store()
        return store.incident_counts() if store is not None else {}

    @_falls_back
    def daemon_facts(self) -> DaemonFacts:
        store = self._store()
        if store is None:
            return DaemonFacts(0, 0, None, None, None)
        s = store.outbox_summary()
        return DaemonFacts(outbox_pending=s.counts.get("pending", 0), outbox_failed=s.counts.get("failed", 0),
                           oldest_pending_at=s.oldest_pending_at, last_error=s.last_error,
                           last_error_run=s.last_error_run, outbox_held=s.held)


@dataclass(frozen=True)
class _Facts:
    """What the store says of every run (or one), read with one query a table."""

    states: Mapping[str, tuple[str, Mapping[str, Any]]]
    attempts: Mapping[str, tuple[Attempt, ...]]
    polls: Mapping[str, Poll]
    incidents: Mapping[str, Row]
    verdicts: Mapping[str, Row]

    @classmethod
    def read(cls, store: Store | None, name: str | None = None) -> _Facts:
        if store is None:
            return cls({}, {}, {}, {}, {})
        if name is not None:  # one run's page: its own rows only
            polls, found, verdict = store.polls(name, 1), store.incidents(name, 1), store.latest_verdict(name)
            return cls({name: store.run_state(name)}, {name: tuple(store.attempts(name))},
                       {name: polls[0]} if polls else {}, {name: found[0]} if found else {},
                       {name: verdict} if verdict is not None else {})
        attempts: dict[str, list[Attempt]] = {}
        for a in store.all_attempts():
            attempts.setdefault(a.run, []).append(a)
        return cls(store.run_states(), {k: tuple(sorted(v, key=lambda a: a.n)) for k, v in attempts.items()},
                   store.latest_polls(), store.latest_incidents(), store.latest_verdicts())


def incidents(store: Store, name: str) -> tuple[IncidentEntry, ...]:
    """The run's incidents, oldest first, each with the text its message said."""
    texts = [m for m in store.messages(name) if m.kind == "incident"]
    used: set[int] = set()
    out = []
    for row in reversed(store.incidents(name, limit=1000)):
        text = None
        for m in texts:
            if m.id in used or m.payload.get("incident") != row.kind or m.payload.get("attempt") != row.attempt:
                continue
            if abs(m.created_at - row.at) <= TEXT_WINDOW_S:
                used.add(m.id)
                text = str(m.payload.get("message") or "")
                break
        if text is None:
            text = str(row.body.get("message") or "") or ", ".join(f"{k}={v}" for k, v in row.body.items())
        out.append(IncidentEntry(row.id, row.at, row.attempt, row.kind, text, row.body))
    return tuple(out)


def _prereg_info(registry_path: Path, name: str, store: Store) -> tuple[dict[str, Any] | None, str | None]:
    try:
        info = prereg_record.collect(registry_path, name, store)
    except BabysitError as exc:
        return None, exc.message
    if info["prereg"] is None:
        return None, "no [prereg]: this run is babysat but has no verdict"
    return info, None



def _train_chart(log: Path) -> svg.CurveChart | None:
    records = logtail.read_recent(log, CHART_TAIL_BYTES)
    if not records:
        return None
    series = tuple(metric_series(records, "train_loss"))
    return svg.CurveChart(metric="train_loss", series=series) if series else None
