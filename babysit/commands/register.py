"""`babysit register RUN.toml`: validate, run the fixture, freeze the prereg hash, record the run.

Re-registering says exactly what changed since the last register (a changed [prereg] is refused by
the registry), and warns when the trainer looks set to write its log somewhere babysit does not read.
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from babysit import logcheck, registry, sources, wake
from babysit.atomic import write_private_json
from babysit.campaign import join as campaign_join
from babysit.core.retry import build_argv
from babysit.core.spec import check_cadence, load_spec
from babysit.core.specdiff import changes
from babysit.core.tomlfile import load
from babysit.prereg_record import keep_frozen_copy
from babysit.reading import check_fixture

APPLIES = ("  these apply when a daemon next reads run.toml, at its next start (`babysit up`): a running daemon "
           "keeps the spec it read; restart it to apply them now (the runs keep running across a restart)")


def run(args: argparse.Namespace) -> int:
    spec = load_spec(Path(args.spec), display=args.spec)
    check_cadence(spec, args.accelerated)
    if spec.source.kind == "tensorboard":
        sources.require()  # exit 2 naming the extra, before anything is frozen
    if spec.prereg is not None and spec.prereg.fixture is not None:
        result = check_fixture(spec.prereg)
        print(f"fixture ok: {spec.prereg.fixture.log.name} reads Δ {result.got_delta:+.{spec.prereg.precision}f} "
              f"→ {result.got_label} (expected {result.expected_delta:+.{spec.prereg.precision}f} → "
              f"{result.expected_label})")
    _warn_about_the_log(spec, args.spec)
    path = registry.resolve_registry_path(args.registry)
    joining = campaign_join.prepare(spec, path, args.spec)  # a campaign run: its delta shown, >1 refused (exit 2)
    for line in joining.lines() if joining else ():
        print(line)
    for warning in joining.warnings if joining else ():  # e.g. a child's prereg words copied from its parent
        print(f"WARNING: {warning}", file=sys.stderr)
    now = registry.utc_timestamp(datetime.now(timezone.utc))
    sha = spec.prereg.sha256 if spec.prereg else None

    def change(reg: registry.Registry) -> tuple[registry.Registry, str]:
        entry = registry.RunEntry(name=spec.name, spec=reg.spec_ref(spec.spec_file), registered_at=now,
                                  prereg_sha256=sha)
        return registry.with_run(reg, entry)

    outcome = registry.update(path, change)
    state_dir = registry.load(path).state_dir
    if spec.prereg is not None:
        keep_frozen_copy(state_dir, spec.name, spec.prereg.sha256, spec.prereg.canonical, now)
    if joining is not None:
        campaign_join.record(joining, spec, state_dir)
    changed = _changes_since_last_register(state_dir, spec, now, first=outcome == "added")
    wake.wake(state_dir)  # a running daemon picks the run up now, not at its next guard round
    if sha:
        frozen = f"; prereg sha256 {sha[:16]}… " + ("still frozen" if changed else "frozen")
    else:
        frozen = "; no [prereg]: babysat without a verdict"
    if not changed:
        print(f"{outcome}: {spec.name} in {path}{frozen}")
        return 0
    moved = f", spec now {spec.spec_file}" if outcome == "updated" else ""
    print(f"changed: {spec.name} in {path}: {len(changed)} field(s) since the last register{moved}{frozen}")
    for c in changed:
        print(f"  {c}")
    print(APPLIES)
    return 0


def _warn_about_the_log(spec: Any, shown: str) -> None:
    if spec.log is None:  # records come from a [source] other than a JSONL log: nothing to compare
        return
    argvs = [build_argv(spec, n, resume=False, halvings=0)[0] for n in range(1, max(len(spec.attempts), 1) + 1)]
    for text in logcheck.warnings(spec, argvs, log_dir_exists=spec.log.parent.is_dir()):
        print(f"WARNING: {shown}: {text}", file=sys.stderr)


def _changes_since_last_register(state_dir: Path, spec: Any, now: str, *, first: bool) -> tuple[Any, ...]:
    """The fields that differ from the spec kept at the last register (none the first time), and keep
    this one. [prereg] is left out: the registry refuses any change to it before we get here."""
    table = json.loads(json.dumps(load(spec.spec_file), default=str))
    kept = state_dir / "specs" / f"{spec.name}.json"
    before = None
    if not first and kept.exists():
        try:
            before = json.loads(kept.read_text(encoding="utf-8"))["table"]
        except (ValueError, KeyError, OSError):
            before = None  # an unreadable copy lists nothing; the new one replaces it
    found = () if before is None else changes(before, table, skip=("prereg",))
    if before != table:
        write_private_json(kept, {"run": spec.name, "spec": str(spec.spec_file), "registered_at": now, "table": table})
    return found
