"""`babysit verdict NAME | RUN.toml --log PATH`: the pre-registered read, as a card or the verdict JSON, plus a chart.

A registered run is read through the freeze check and its recorded amendments; an offline read takes
the spec and a log as given, and `--amendment FILE` what-ifs that are marked not provenance-checked.
Exit 0 on any read (FINAL, PROVISIONAL or NO-READ), 1 on a tampered prereg or a fixture mismatch,
2 on bad input.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from babysit import sources
from babysit.core.errors import BadInput, PreregTampered
from babysit.core.fmt import fmt_delta, fmt_duration
from babysit.core.render import verdict_text
from babysit.core.spec.amendment import check_against, load_amendment, what_if
from babysit.core.spec.run_toml import load_spec
from babysit.core.status import RunStatus
from babysit.core.verdict import FINAL, PROVISIONAL, decimal_of, evaluate
from babysit.db.url import open_store
from babysit.runtime.registry import resolve_registry_path
from babysit.verdict import reading
from babysit.view import runview


def run(args: argparse.Namespace) -> int:
    with tempfile.TemporaryDirectory(prefix="babysit-verdict-") as scratch:
        return _run(args, Path(scratch))


def _run(args: argparse.Namespace, scratch: Path) -> int:
    offline = Path(args.target).is_file() or args.target.endswith(".toml")
    final_dir: Path | None = None  # where the daemon keeps the FINAL verdict's files (registered runs)
    final_chart: Path | None = None  # the FINAL verdict's chart as the daemon drew it (its verdict row's path)
    shown_log: Path | None = None  # what the card names as the log, when not the record log read
    chart_dir: Path | None = None  # an offline chart's folder, when not the record log's
    progress: str | None = None  # a registered run's state, when its read is not FINAL
    if offline:
        spec = load_spec(Path(args.target), display=args.target)
        prereg = reading.require_prereg(spec)
        log = reading.offline_records(spec, Path(args.log) if args.log else None, scratch)
        if scratch in log.parents:  # read from a TensorBoard directory or a CSV: say and draw beside that
            source = Path(args.log) if args.log else spec.source.path
            assert source is not None
            shown_log, chart_dir = source, source.parent
        recorded: tuple[Any, ...] = ()
        frozen_sha = prereg.sha256
    else:
        if args.log:
            raise BadInput("--log is for offline reads (RUN.toml --log PATH); a registered run reads its own log",
                           hint=f"drop --log, or read offline: babysit verdict RUN.toml --log {args.log}")
        reg, entry, spec = reading.load_registered(resolve_registry_path(args.registry), args.target)
        store = open_store(reg)
        try:
            reading.check_frozen(spec, entry.prereg_sha256)
            recorded = reading.stored_amendments(store, spec.name)
            final_chart = reading.final_chart(store, spec.name)
        except PreregTampered as exc:
            reading.record_tamper_incident(store, spec.name, exc, time.time())
            raise
        finally:
            store.close()
        prereg = reading.require_prereg(spec)
        log = sources.records_path(spec, reg.state_dir)
        frozen_sha = entry.prereg_sha256
        final_dir = reading.final_dir(reg.state_dir)
        registry_path = resolve_registry_path(args.registry)

    if args.fixture:
        return _fixture(args, spec, prereg, frozen_sha)
    # Checked exactly as `babysit amend` checks them (check_against): a typo in a reference is exit 2
    # naming the file and the field, never a traceback from deep in the arithmetic.
    extra = []
    for i, f in enumerate(args.amendment):
        amendment = load_amendment(Path(f), f)
        check_against(amendment, prereg)
        extra.append(what_if(amendment, len(recorded) + i + 1))
    comparators = _comparators(args.compare, prereg)
    series, train, garbage = reading.read_series(log, prereg)
    verdict = evaluate(prereg, (*recorded, *extra), series, train_series=train, at_step=args.at_step)
    body = verdict.to_json(spec.name, frozen_sha)
    # The FINAL verdict's files (verdicts/<run>.json and .png) are the daemon's record: only the plain
    # FINAL read of a registered run may draw its chart there; every other read is a what-if.
    of_record = (final_dir is not None and verdict.status == FINAL and args.at_step is None and not extra
                 and not comparators)
    chart = _chart_path(args, spec.name, log, final_dir, of_record, chart_dir)
    out = sys.stderr if args.json else sys.stdout
    if not offline and verdict.status != FINAL and args.at_step is None:
        progress = run_progress(runview.collect(registry_path, [spec.name])[0], prereg.read_step, time.time())
    if args.json:  # the verdict first: a chart that cannot be drawn must not cost the JSON
        print(json.dumps(body, indent=2), flush=True)
        if progress:
            print(progress, file=out)
    else:
        print(card(body, verdict, prereg, log=shown_log or log, garbage=garbage, matches=True, offline=offline,
                   comparators={n: _comparator_delta(s, prereg) for n, s in comparators.items()},
                   progress=progress), flush=True)
    if of_record and final_chart is not None and not args.chart:
        print(f"chart: {final_chart} (the FINAL verdict's, as the daemon drew it)", file=out)
        return 0
    drawn, error = reading.draw_chart(spec, body, None, chart, verdict=verdict, comparators=comparators,
                                      log=log)
    if drawn is None:
        print(f"chart: not drawn ({type(error).__name__}: {error}); the verdict above stands without it", file=out)
    else:
        print(f"chart: {chart}", file=out)
    return 0


def run_progress(row: runview.RunRow, read_step: int, now: float) -> str:
    """Where a registered run is, for a read that is not FINAL: still running (and when the read step is
    due, from its step and s/step), not launched yet, or over before its read step."""
    status = row.status
    at = f"step {row.step}" if row.step is not None else "no step logged yet"
    if status in (RunStatus.RUNNING, RunStatus.STOPPING, RunStatus.RETRYING, RunStatus.RELAUNCHING):
        pace = f" at {row.seconds_per_step:.3g} s/step" if row.seconds_per_step else ""
        head = f"still {status} (attempt {row.attempt}, {at}{pace})"
        eta = runview.eta_seconds(row.step, read_step, row.seconds_per_step)
        if row.step is not None and row.step >= read_step:
            return f"{head}: read step {read_step} reached; the FINAL read comes with its eval"
        if eta is None:
            return f"{head}: read step {read_step} expected once its pace is known (two records)"
        when = datetime.fromtimestamp(now + eta, timezone.utc).strftime("%H:%M UTC")
        return f"{head}: read step {read_step} expected in ~{fmt_duration(eta)} (about {when})"
    if status in ("registered", "pending", "refused"):
        return f"{status}: not launched yet; the read comes at step {read_step} (`babysit up` launches it)"
    ended = f" ({row.outcome})" if row.outcome else ""
    return (f"{status}{ended} at {at}, before read step {read_step}: no read will come from this run "
            f"(`babysit relaunch {row.run}` runs it again)")


def _chart_path(args: argparse.Namespace, run: str, log: Path, final_dir: Path | None, of_record: bool,
                chart_dir: Path | None = None) -> Path:
    """Where this read's chart goes; a what-if never writes over the FINAL verdict's files."""
    if args.chart:
        chart = Path(args.chart)
        if final_dir is not None:
            record = [reading.verdict_json_path(final_dir, run)] + (
                [] if of_record else [reading.verdict_chart_path(final_dir, run)])
            if chart.resolve() in {p.resolve() for p in record}:
                raise BadInput(f"--chart {args.chart}: that is one of the FINAL verdict's files, which only the "
                               "FINAL read of record may draw (no --at-step, --amendment or --compare)",
                               hint="give another path, or drop --chart to write under the state directory's "
                                    "whatif/")
        return chart
    if final_dir is None:
        return (chart_dir or log.parent) / f"{run}.verdict.png"
    if of_record:
        return reading.verdict_chart_path(final_dir, run)
    suffix = (f"-at-{args.at_step}" if args.at_step is not None else "") + ("-whatif" if args.amendment else "") \
        + ("-compare" if args.compare else "")
    return final_dir.parent / "whatif" / f"{run}{suffix}.png"


def card(body: dict[str, Any], verdict: Any, prereg: Any, *, log: Path, garbage: int, matches: bool,
         offline: bool, comparators: dict[str, Any] | None = None, progress: str | None = None) -> str:
    """The verdict as the post says it (`core.render.verdict_text`: the same words, symbols and digits),
    with what only a terminal shows around it. PROVISIONAL is fenced top and bottom, so it cannot be missed."""
    p = prereg.precision
    extra = ([f"question:  {prereg.question}"] if prereg.question else []) + (
        [f"run:       {progress}"] if progress else [])
    lines = verdict_text(body, p, extra=extra).splitlines()
    if body["status"] == PROVISIONAL:
        bar = "=" * 78
        lines = [bar, lines[0], bar, *lines[1:]]
    for name, delta in (comparators or {}).items():
        lines.append(f"compare:   {name}: Δ {fmt_delta(delta, p)} over the same window")
    sha = body["prereg_sha256"] or "—"
    lines.append(f"prereg:    sha256 {sha}" + (" (offline: not checked against a registration)" if offline
                                                else " (matches the registration)" if matches else ""))
    for a in verdict.amendments:
        prov = ("WHAT-IF, not provenance-checked" if not a.provenance_checked else
                f"declared {a.declared_at}, eval data seen through step {a.data_seen_through_step}")
        lines.append(f"amendment {a.n}: {a.spec.title} ({prov}); sha256 {(a.sha256 or '-')[:16]}…")
    lines.append(f"log:       {log}" + (f" ({garbage} garbage line(s) ignored)" if garbage else ""))
    return "\n".join(lines)


def _fixture(args: argparse.Namespace, spec: Any, prereg: Any, frozen_sha: str | None) -> int:
    result = reading.run_fixture(prereg)
    p = prereg.precision
    if args.json:
        print(json.dumps({"run": spec.name, "fixture_log": str(prereg.fixture.log), "ok": result.ok,
                          "expected_delta": result.expected_delta, "got_delta": result.got_delta,
                          "expected_label": result.expected_label, "got_label": result.got_label,
                          "verdict": result.verdict.to_json(spec.name, frozen_sha)}, indent=2))
    else:
        print(f"fixture {prereg.fixture.log}: expected {fmt_delta(result.expected_delta, p)} → "
              f"{result.expected_label}; got {fmt_delta(result.got_delta, p)} → {result.got_label or 'no read'}: "
              + ("OK" if result.ok else "MISMATCH"))
    if not result.ok:
        reading.check_fixture(prereg)  # raises FixtureMismatch with both numbers (exit 1)
    return 0


def _comparators(items: list[str], prereg: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for item in items:
        name, sep, path = item.partition("=")
        if not sep or not name or not path:
            raise BadInput(f"--compare: expected NAME=LOGPATH, got {item!r}",
                           hint="e.g. --compare demosonly=logs/demosonly.jsonl")
        if not Path(path).is_file():
            raise BadInput(f"--compare {name}: log {path} does not exist")
        out[name] = reading.read_series(Path(path), prereg)[0]
    return out


def _comparator_delta(series: Any, prereg: Any) -> float | None:
    values = dict(series)
    if prereg.baseline_step not in values or prereg.read_step not in values:
        return None
    d = decimal_of(values[prereg.read_step]) - decimal_of(values[prereg.baseline_step])
    return float(round(d, prereg.precision))

