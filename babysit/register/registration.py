"""Registering a run: the one function `babysit register`, a campaign's launch of a proposal, and a relaunch
(`babysit relaunch`, `/babysit relaunch`) go through, so each is held to the same checks.

The checks, in order, before anything is written: run.toml valid (`load_spec`), the poll cadence, the
TensorBoard extra, the command's program exists (`commandcheck`), the verdict instrument on its fixture,
the campaign's single-delta rule. Then the registry takes the run (a changed `[prereg]` under the same
name is refused there), the prereg text is frozen, the campaign grid recorded, the spec kept for the next
register's diff, and a running daemon woken so it picks the run up at once. Nothing here prints: the
caller says `notes` on stdout and `warnings` on stderr.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from babysit import sources
from babysit.core.retry import build_argv
from babysit.core.spec.diff import Change, changes
from babysit.core.spec.run_toml import RunSpec, check_cadence, load_spec
from babysit.core.spec.tomlfile import load
from babysit.register import campaign_join as campaign_join
from babysit.register import commandcheck, logcheck
from babysit.runtime import registry, wake
from babysit.runtime.atomic import write_private_json
from babysit.verdict.prereg_record import keep_frozen_copy
from babysit.verdict.reading import check_fixture


@dataclass(frozen=True)
class Registration:
    spec: RunSpec
    registry_path: Path
    state_dir: Path
    outcome: str  # "added" | "unchanged" | "updated" (registry.with_run)
    notes: tuple[str, ...]  # what the checks found fine: the fixture's read, the campaign delta
    warnings: tuple[str, ...]  # each "FILE: FIELD: what looks wrong; what to do" (said, never refused)
    changed: tuple[Change, ...]  # the fields that differ from the spec kept at the last register
    woke_daemon: bool

    @property
    def sha256(self) -> str | None:
        return self.spec.prereg.sha256 if self.spec.prereg else None


def register(spec_file: Path, registry_path: Path, *, shown: str | None = None, accelerated: bool = False,
             wake_daemon: bool = True, now: datetime | None = None) -> Registration:
    """Check run.toml and record it in the registry; raises a BabysitError (exit 2 for what the user wrote)
    before anything is written when a check refuses it."""
    shown = shown or str(spec_file)
    spec = load_spec(Path(spec_file), display=shown)
    notes, warnings = check(spec, shown, accelerated=accelerated)
    joining = campaign_join.prepare(spec, registry_path, shown)  # a campaign run: its delta shown, >1 refused
    notes += joining.lines() if joining else []
    warnings += joining.warnings if joining else ()  # e.g. a child's prereg words copied from its parent
    stamp = registry.utc_timestamp(now or datetime.now(timezone.utc))
    sha = spec.prereg.sha256 if spec.prereg else None

    def change(reg: registry.Registry) -> tuple[registry.Registry, str]:
        return registry.with_run(reg, registry.RunEntry(name=spec.name, spec=reg.spec_ref(spec.spec_file),
                                                        registered_at=stamp, prereg_sha256=sha))

    outcome = registry.update(registry_path, change)
    registered = registry.load(registry_path)
    state_dir = registered.state_dir
    if spec.prereg is not None:
        keep_frozen_copy(state_dir, spec.name, spec.prereg.sha256, spec.prereg.canonical, stamp)
    if joining is not None:
        campaign_join.record(joining, spec, registered)
    changed = _changes_since_last_register(state_dir, spec, stamp, first=outcome == "added")
    woke = wake.wake(state_dir) if wake_daemon else False  # a running daemon picks the run up now
    return Registration(spec, registry_path, state_dir, outcome, tuple(notes), tuple(warnings), changed, woke)


def check(spec: RunSpec, shown: str, *, accelerated: bool) -> tuple[list[str], list[str]]:
    """Every check that needs no registry: (notes, warnings, each "SHOWN: FIELD: …"); raises on a refusal."""
    check_cadence(spec, accelerated)
    sources.adapter(spec.source.kind).require()  # exit 2 naming the extra it reads with, before anything is frozen
    warnings: list[str] = []
    for problem in (commandcheck.check_program(spec, shown), commandcheck.check_script(spec, shown)):
        if problem is not None:
            warnings.append(problem)
    notes: list[str] = []
    if spec.prereg is not None and spec.prereg.fixture is not None:
        result = check_fixture(spec.prereg)
        p = spec.prereg.precision
        notes.append(f"fixture ok: {spec.prereg.fixture.log.name} reads Δ {result.got_delta:+.{p}f} → "
                     f"{result.got_label} (expected {result.expected_delta:+.{p}f} → {result.expected_label})")
    argvs = [build_argv(spec, n, resume=False, halvings=0)[0] for n in range(1, max(len(spec.attempts), 1) + 1)]
    warnings += commandcheck.read_step_warnings(spec, argvs)
    if spec.log is not None:  # records from a [source] other than a JSONL log: no log path to compare
        warnings += logcheck.warnings(spec, argvs, log_dir_exists=spec.log.parent.is_dir(),
                                      writes_babysit_log=any(logcheck.writes_babysit_log(spec, a) for a in argvs))
    return notes, [f"{shown}: {w}" for w in warnings]


def _changes_since_last_register(state_dir: Path, spec: RunSpec, now: str, *, first: bool) -> tuple[Change, ...]:
    """The fields that differ from the spec kept at the last register (none the first time), and keep
    this one. [prereg] is left out: the registry refuses any change to it before we get here."""
    table = json.loads(json.dumps(load(spec.spec_file), default=str))
    kept = state_dir / "specs" / f"{spec.name}.json"
    before: Any = None
    if not first and kept.exists():
        try:
            before = json.loads(kept.read_text(encoding="utf-8"))["table"]
        except (ValueError, KeyError, OSError):
            before = None  # an unreadable copy lists nothing; the new one replaces it
    found = () if before is None else changes(before, table, skip=("prereg",))
    if before != table:
        write_private_json(kept, {"run": spec.name, "spec": str(spec.spec_file), "registered_at": now, "table": table})
    return found
