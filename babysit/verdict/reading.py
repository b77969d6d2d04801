"""The shell around the pure verdict: freeze check, log and store reads, fixture runs, verdict files.

The daemon and the CLI both read verdicts through here, so the prereg hash is compared on EVERY read
and a tampered prereg can never produce a verdict, only a `prereg-tampered` incident.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, NamedTuple

from babysit import sources
from babysit.core.errors import BadInput, FixtureMismatch, PreregTampered
from babysit.core.fmt import fmt_delta
from babysit.core.reading.log_records import LogRecord
from babysit.core.spec.amendment import AmendmentRecord, parse_amendment
from babysit.core.spec.prereg import Prereg
from babysit.core.spec.run_toml import RunSpec, load_spec
from babysit.core.spec.source_kinds import KINDS
from babysit.core.verdict import FixtureResult, Verdict, evaluate, fixture_result
from babysit.db.store import Amendment, Store
from babysit.runtime import atomic, registry
from babysit.sources.logtail import TailState, read_new, scan
from babysit.sources.records import ColumnSegment, RecordBatch
from babysit.verdict.chart import render_chart, render_in_child

TAMPER_INCIDENT = "prereg-tampered"
Series = tuple[tuple[int, float], ...]


class PreregChanged(PreregTampered):
    """PreregTampered with both hashes attached, so an incident can be recorded once per pair."""

    def __init__(self, run: str, registered: str | None, current: str | None, spec_file: Path) -> None:
        self.run = run
        self.registered_sha256 = registered
        self.current_sha256 = current
        super().__init__(
            f"run '{run}': the [prereg] of {spec_file} was edited after registration "
            f"(registered sha256 {registered or '<no [prereg]>'}, now {current or '<no [prereg]>'}); "
            "no verdict is read from an edited pre-registration",
            hint="restore the original [prereg] (see `babysit prereg show`); a different experiment needs a "
                 "new [run].name registered with `babysit register`; to change how it is read, `babysit amend`",
        )


def check_frozen(spec: RunSpec, registered_sha256: str | None) -> None:
    """Raise PreregChanged unless the spec's [prereg] still hashes to what `register` froze."""
    current = spec.prereg.sha256 if spec.prereg is not None else None
    if current != registered_sha256:
        raise PreregChanged(spec.name, registered_sha256, current, spec.spec_file)


def require_prereg(spec: RunSpec) -> Prereg:
    if spec.prereg is None:
        raise BadInput(f"run '{spec.name}' has no [prereg]: it is babysat but has no verdict",
                       hint="pre-register a [prereg] table before launch (docs/spec.md, [prereg]) under a new run name")
    return spec.prereg


def read_series(log: Path, prereg: Prereg) -> tuple[Series, Series, int]:
    """(metric series, train-metric series, garbage lines) of a whole log; a missing log is empty."""

    series: dict[int, float] = {}
    train: dict[int, float] = {}
    garbage = 0
    try:
        for chunk in scan(log):  # one chunk in memory at a time: a 10,000,000-record log costs its series only
            if chunk.reset:
                series, train, garbage = {}, {}, 0
            garbage += chunk.garbage
            for record in chunk.records:
                value = record.metrics.get(prereg.metric)
                if value is not None:
                    series[record.step] = value  # the last value logged for a step wins (metric_series)
                if prereg.train_metric is not None:
                    value = record.metrics.get(prereg.train_metric)
                    if value is not None:
                        train[record.step] = value
    except FileNotFoundError:
        return (), (), 0
    return tuple(sorted(series.items())), tuple(sorted(train.items())), garbage


def stored_amendments(store: Store, run: str) -> tuple[AmendmentRecord, ...]:
    return tuple(from_store(a) for a in store.amendments(run))


class SeriesCache:
    """The metric and train-metric series of a live log, kept up to date from the new bytes only.

    The daemon reads a verdict each time a new eval arrives; re-reading the whole log for it made
    that O(log size) per eval (about 11 s on a 1,000,000-record log). This keeps the two series
    (step -> value, the last value logged for a step wins, as in `metric_series`) and the tail
    offset, and starts over when the file is truncated or replaced. As a live tail it leaves an
    unterminated last line for later; a finished run's verdict goes through `read_series`.

    The verdict looks at the train metric only at eval steps (the corroborating train delta), so
    only those train values are kept (plus the last TRAIN_WINDOW steps', for an eval logged after
    its step's train record): memory and the per-read cost follow the evals, not the log.
    """

    TRAIN_WINDOW = 4096

    def __init__(self, prereg: Prereg) -> None:
        self.metric = prereg.metric
        self.train_metric = prereg.train_metric
        self.state = TailState()
        self._series: dict[int, float] = {}
        self._train: dict[int, float] = {}  # at eval steps only
        self._recent: dict[int, float] = {}  # the last TRAIN_WINDOW train values, by step

    def feed(self, records: Sequence[LogRecord], start: int, state: TailState) -> None:
        """The daemon's own read of the log, handed over (no second parse): `records` read from byte
        `start` up to `state`. Ignored unless the cache had read up to `start` exactly (it is ahead, or
        it reads from the start after a restart): `update` reads the rest itself."""
        if start != self.state.offset or (state.file_id != self.state.file_id and self.state.offset):
            return
        self._take(records)
        self.state = state

    def complete(self, log: Path) -> bool:
        """Whether the cache holds the whole log (a finished run's verdict can be read from it)."""
        try:
            size = os.stat(log).st_size
        except OSError:
            return False
        return not self.state.skipping and self.state.offset == size

    def update(self, log: Path) -> tuple[Series, Series]:

        while True:
            got = read_new(log, self.state)
            if got.missing:
                self.state, self._series, self._train, self._recent = TailState(), {}, {}, {}
                return (), ()
            if got.reset:
                self._series, self._train, self._recent = {}, {}, {}
            self._take(got.records)
            progressed = got.state.offset > self.state.offset
            self.state = got.state
            if not progressed:
                break
        return self.series()

    def series(self) -> tuple[Series, Series]:
        """(metric series, train values at eval steps) as read so far, without reading."""
        return tuple(sorted(self._series.items())), tuple(sorted(self._train.items()))

    def _take(self, records: Sequence[LogRecord]) -> None:
        if isinstance(records, RecordBatch):  # a read matched whole: only the segments holding the metrics
            for seg in records.segments:
                if not isinstance(seg, ColumnSegment):
                    self._take(seg)
                elif self.metric in seg.names or (self.train_metric is not None and self.train_metric in seg.names):
                    self._take([seg.record(i) for i in range(len(seg))])
            return
        for record in records:
            step = record.step
            if self.train_metric is not None:
                value = record.metrics.get(self.train_metric)
                if value is not None:
                    self._recent.pop(step, None)
                    self._recent[step] = value
                    if len(self._recent) > self.TRAIN_WINDOW:
                        del self._recent[next(iter(self._recent))]
                    if step in self._series:
                        self._train[step] = value
            value = record.metrics.get(self.metric)
            if value is not None:
                self._series[step] = value
                if step in self._recent:
                    self._train[step] = self._recent[step]


def records_log(spec: RunSpec, store: Store | None) -> Path:
    """Where a run's records are read from: its [source]'s record log under the store's state directory
    (the trainer's own JSONL for kind = "jsonl"); offline, without a store, `[run].log`."""
    if store is None:
        if spec.log is None:
            raise BadInput(f"{spec.spec_file}: run '{spec.name}' reads a [source] of kind "
                           f"\"{spec.source.kind}\" and has no [run].log to read offline",
                           hint="pass the record log with --log PATH (a registered run's is "
                                f".babysit/runs/{spec.name}/records.jsonl), or read it registered: "
                                f"`babysit verdict {spec.name}`")
        return spec.log
    if store.state_dir is None:  # a store opened without its box (`babysit db copy`'s destination)
        raise BadInput(f"run '{spec.name}': this store ({store.where}) was opened without its box's state "
                       "directory, so the run's record log cannot be found",
                       hint="open it through the registry (babysit.toml) of the box that runs it")
    return sources.records_path(spec, store.state_dir)


def read_registered_verdict(spec: RunSpec, entry_prereg_sha256: str | None, store: Store, *,
                            at_step: int | None = None,
                            extra: Sequence[AmendmentRecord] = (), cache: SeriesCache | None = None) -> Verdict:
    """Tamper check, then the store's amendments, then the log: the verdict as of `at_step`.

    With `cache` (the daemon's, one per run), only the bytes appended since the last read are parsed.
    """
    check_frozen(spec, entry_prereg_sha256)
    prereg = require_prereg(spec)
    log = records_log(spec, store)
    if cache is not None:
        series, train = cache.update(log)
    else:
        series, train, _ = read_series(log, prereg)
    return verdict_of(spec, store, series, train, at_step=at_step, extra=extra)


def verdict_of(spec: RunSpec, store: Store, series: Series, train: Series, *, at_step: int | None = None,
               extra: Sequence[AmendmentRecord] = ()) -> Verdict:
    """A registered run's verdict from its read series: the store's amendments, then `extra`, evaluated by
    core/verdict. The one evaluation the daemon's reads and the web page's chart share (the page reads its
    series through a cache of its own, and draws them)."""
    return evaluate(require_prereg(spec), (*stored_amendments(store, spec.name), *extra), series,
                    train_series=train, at_step=at_step)


def record_tamper_incident(store: Store, run: str, exc: PreregTampered, now: float) -> int | None:
    """Record `prereg-tampered` once per (registered, current) hash pair; returns the new id or None."""
    detail = {
        "registered_sha256": getattr(exc, "registered_sha256", None),
        "current_sha256": getattr(exc, "current_sha256", None),
        "message": exc.message,
    }
    for row in store.incidents(run, limit=100_000):
        if row.kind == TAMPER_INCIDENT and (row.body.get("registered_sha256"), row.body.get("current_sha256")) \
                == (detail["registered_sha256"], detail["current_sha256"]):
            return None
    return store.add_incident(run, None, now, TAMPER_INCIDENT, detail)


def run_fixture(prereg: Prereg) -> FixtureResult:
    """The instrument on the fixture log (original rule, no amendments)."""
    if prereg.fixture is None:
        raise BadInput("the [prereg] has no [prereg.fixture]: nothing to check the instrument against",
                       hint="add [prereg.fixture] with log, expect_delta and expect_label")
    if not prereg.fixture.log.is_file():
        raise BadInput(f"prereg.fixture.log: {prereg.fixture.log} does not exist",
                       hint="point [prereg.fixture].log at a train log whose delta is known")
    series, train, _ = read_series(prereg.fixture.log, prereg)
    return fixture_result(prereg, series, train)


def check_fixture(prereg: Prereg) -> FixtureResult:
    """run_fixture, raising FixtureMismatch (exit 1) with both numbers when it does not reproduce."""
    result = run_fixture(prereg)
    if not result.ok:
        p = prereg.precision
        got = (f"{fmt_delta(result.got_delta, p)} -> {result.got_label}" if result.verdict.status == "FINAL"
               else f"no read ({result.verdict.reason})")
        raise FixtureMismatch(
            f"fixture check failed on {prereg.fixture.log}: expected {fmt_delta(result.expected_delta, p)} -> "
            f"{result.expected_label}, the instrument got {got}",
            hint="the instrument must reproduce the fixture before the run is trusted: fix [prereg] "
                 "(metric, steps, bands) or the fixture's expect_delta / expect_label",
        )
    return result


def write_json_atomic(path: Path, data: Mapping[str, Any]) -> Path:
    """Temp file in the same directory, then rename: a reader sees the old file or the new one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    return atomic.write_json_atomic(path, data, indent=2)


class VerdictFiles(NamedTuple):
    """Where the verdict went: the JSON always; the chart unless drawing it failed (`chart_error` says why)."""

    json_path: Path
    chart_path: Path | None
    chart_error: Exception | None = None


def final_dir(state_dir: Path) -> Path:
    """Where the daemon writes a FINAL verdict's files (docs/verdicts.md): `<state_dir>/verdicts/`."""
    return Path(state_dir) / "verdicts"


def verdict_json_path(out_dir: Path, run: str) -> Path:
    return Path(out_dir) / f"{run}.json"


def verdict_chart_path(out_dir: Path, run: str) -> Path:
    return Path(out_dir) / f"{run}.png"


def final_chart(store: Store, run: str) -> Path | None:
    """The FINAL verdict's chart as the daemon drew it: the path its verdict row keeps (`chart_path`, set by
    every daemon when it saves a FINAL verdict), read here, never rebuilt from the run's name, so the web
    page, the bot and `babysit verdict` show the one chart of record. A relative path is the store's state
    directory's. None: no FINAL verdict, or its chart is not a file here (not drawn, or on another box)."""
    stored = store.final_chart_path(run)
    if not stored:
        return None
    path = Path(stored)
    if not path.is_absolute() and store.state_dir is not None:
        path = store.state_dir / path
    return path if path.is_file() else None


def draw_chart(spec: RunSpec, verdict_json: Mapping[str, Any], store: Store | None, path: Path, *,
               verdict: Verdict | None = None, comparators: Mapping[str, Series] | None = None,
               log: Path | None = None, series: tuple[Series, Series] | None = None,
               child: bool = False) -> tuple[Path | None, Exception | None]:
    """Best effort, never raising: (the PNG, None), or (None, why it could not be drawn).

    A chart is an illustration of the verdict, not the verdict: a value matplotlib cannot place, an
    unwritable path or a font problem must cost the chart, never the verdict's JSON, its record or its
    post. The caller logs the exception (with its traceback) and says the chart is missing.

    Without `verdict`, the chart's verdict is re-derived from the log and the store's amendments as of
    the JSON's at_step, so the daemon can pass just the body it already has. `log`: the record log read
    (an offline read's --log), else the run's own; `series`: (metric, train metric) already read whole
    (the daemon's cache), so the log is not parsed again. `child`: drawn in a child process
    (`chart.render_in_child`: the daemon never imports matplotlib), its exception returned the same way.
    """
    try:
        prereg = require_prereg(spec)
        if series is None:
            metric_series, train, _ = read_series(records_log(spec, store) if log is None else log, prereg)
        else:
            metric_series, train = series
        if verdict is None:
            amendments = stored_amendments(store, spec.name) if store is not None else ()
            at = verdict_json.get("at_step") if verdict_json.get("status") != "NO-READ" else None
            verdict = evaluate(prereg, amendments, metric_series, train_series=train, at_step=at)
        draw = render_in_child if child else render_chart
        return draw(path, run=str(verdict_json["run"]), prereg=prereg, series=metric_series, verdict=verdict,
                    amendments=verdict.amendments, comparators=comparators or {}, train_series=train), None
    except Exception as exc:  # best effort by design: see the docstring
        return None, exc


def write_verdict_files(spec: RunSpec, verdict_json: Mapping[str, Any], store: Store | None, out_dir: Path, *,
                        verdict: Verdict | None = None, comparators: Mapping[str, Series] | None = None,
                        chart_path: Path | None = None) -> VerdictFiles:
    """Write `<out_dir>/<run>.json` atomically FIRST, then the chart (`<out_dir>/<run>.png` unless
    `chart_path`) best effort: a chart that cannot be drawn is reported in `chart_error`, never raised."""
    require_prereg(spec)
    run = str(verdict_json["run"])
    json_path = write_json_atomic(verdict_json_path(out_dir, run), verdict_json)
    png, error = draw_chart(spec, verdict_json, store, chart_path or verdict_chart_path(out_dir, run),
                            verdict=verdict, comparators=comparators)
    return VerdictFiles(json_path, png, error)


def load_registered(registry_path: Path, name: str) -> tuple[Any, Any, RunSpec]:
    """(Registry, RunEntry, RunSpec) of a registered run; UnknownRun names close matches."""

    reg = registry.load(registry_path)
    entry = reg.get(name)
    spec_path = reg.spec_path(entry)
    return reg, entry, load_spec(spec_path, display=str(spec_path))


def from_store(stored: Amendment) -> AmendmentRecord:
    """A stored amendment back to a record; its text was validated when it was recorded."""
    spec = parse_amendment(stored.text, f"amendment {stored.n} of run '{stored.run}'")
    return AmendmentRecord(n=stored.n, spec=spec, declared_at=stored.declared_at,
                           data_seen_through_step=stored.data_seen_through_step, sha256=stored.sha256)


OFFLINE_READS = tuple(k for k, rules in KINDS.items() if rules.offline)  # pumped into a record log of their own
_OFFLINE_PUMPS = 10_000  # pump budgets at most (each reads a bounded batch): a huge source still ends


def offline_records(spec: RunSpec, given: Path | None, scratch: Path) -> Path:
    """The record log an offline read (`babysit verdict run.toml [--log PATH]`) reads. For a TensorBoard
    or CSV `[source]`, PATH (else `[source].path`) is that source — an event directory, a CSV file — read
    through the same adapter as the daemon's into a record log under `scratch`; a `.jsonl` PATH is read as
    a record log (a registered run's `records.jsonl`). Every other kind reads PATH (else `[run].log`)."""
    kind = spec.source.kind
    rules = KINDS[kind]
    if rules.offline is None or (given is not None and given.suffix == ".jsonl"):
        log = given if given is not None else records_log(spec, None)
        if not log.is_file():
            raise BadInput(f"log {log} does not exist", hint="pass the train log with --log PATH")
        return log
    path = given if given is not None else spec.source.path
    want = rules.offline
    if path is None or not path.exists() or rules.directory != path.is_dir():
        raise BadInput(f"--log {path}: expected {want} for [source] kind = \"{kind}\"",
                       hint=f"pass {want} (what the trainer writes), or a record log (.jsonl) with --log PATH")
    sources.adapter(kind).require()  # exit 2 naming the extra it reads with (tensorboard's)
    local = replace(spec, source=replace(spec.source, path=Path(path).resolve()))
    pump = sources.SourcePump(local, scratch)
    for _ in range(_OFFLINE_PUMPS):
        if not pump.pump(time.time()).backlog:
            break
    log = sources.records_path(local, scratch)
    if not log.is_file():
        log.parent.mkdir(parents=True, exist_ok=True)
        log.touch()  # nothing read: an empty record log reads NO-READ, saying what it saw
    return log
