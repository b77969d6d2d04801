"""`babysit status [RUN] [--json] [--watch]`: what every run is doing, from the store and the runs' logs
(fast, read-only; the rows come from babysit/view/runview.py, the table from babysit/view/runtable.py)."""

from __future__ import annotations

import argparse
import json
import time

from babysit.core.errors import BadInput
from babysit.core.spec.source import preset_line
from babysit.db.store import Store
from babysit.run.gpufault import quarantine_lines
from babysit.runtime import registry
from babysit.view import runview
from babysit.view.runtable import status_table


def run(args: argparse.Namespace) -> int:
    reg = registry.load(registry.resolve_registry_path(args.registry))
    names = [reg.get(args.run).name] if args.run else list(reg.names)
    if args.watch:
        # Lazy: babysit.view.watch imports structlog, and with it rich (~0.2 s); `babysit status` stays fast.
        from babysit.view.watch import watch

        if args.json:
            raise BadInput("--watch and --json do not go together",
                           hint="`babysit status --json` for one look, `babysit status --watch` for the live table")
        return watch(reg.path, names if args.run else None, interval=args.interval)
    reader = runview.Reader(reg.path)  # one store for the whole look: a fleet's PostgreSQL, or the mirror
    try:
        return _show(args, reg, reader, names)
    finally:
        reader.close()


def _show(args: argparse.Namespace, reg: registry.Registry, reader: runview.Reader, names: list[str]) -> int:
    rows = reader.rows(names if args.run else None)  # None: in a fleet, every box's runs too
    banner = reader.banner()  # PostgreSQL unreachable: this box's runs from its local mirror, and how old
    if args.json:
        dicts = [row.to_dict() for row in rows]
        print(json.dumps(dicts if not args.run else dicts[0], indent=2))
        return 0
    if banner:
        print(banner)
    boxes = reader.fleet_boxes()  # a fleet: every box, with its staleness (docs/fleet.md)
    if not rows:
        print(f"no runs registered in {reg.path}; `babysit register RUN.toml` adds one")
        print("\n".join(boxes) if boxes else "", end="\n" if boxes else "")
        return 0
    print(status_table(rows, time.time()))
    for line in boxes:
        print(line)
    quarantined = _quarantined(reader.store())
    if quarantined:
        print("quarantined GPUs (`babysit gpu release UUID` lifts one):")
        print("\n".join("  " + line for line in quarantined))
    adhoc_dir = reg.state_dir / "adhoc"
    for r in rows:
        if r.note:  # e.g. a run.toml edited into something invalid: the table is the store's word only
            print(f"{r.run}: {r.note}")
        entry = reg.find(r.run)
        spec = reg.spec_path(entry) if entry is not None else None
        if spec is not None and spec.parent == adhoc_dir:
            print(f"{r.run}: written by `babysit run`: {spec}")
        if r.preset:
            print(f"{r.run}: {preset_line(r.preset)}")
        elif r.log_hint:
            print(f"{r.run}: {r.log_hint.removeprefix('📄 ')}")
        elif r.preset_pending and r.ended is not None:
            print(f"{r.run}: no printed line gave a record: babysit never read its losses (its log-unreadable "
                  "incident says what it saw and what would read it)")
        elif r.preset_pending:
            print(f'{r.run}: preset = "auto": no printed line has given a record yet; babysit says what reads them, '
                  "or what would, by the 20th line or 10 s after the first")
        if r.hardware_profile:
            hp = r.hardware_profile
            print(f"{r.run}: attempt 1 profile '{hp.get('profile')}' selected by smoke run {hp.get('measured_at')} "
                  f"({hp.get('path')})")
    return 0




def _quarantined(store: Store | None) -> list[str]:
    """The quarantined GPUs' lines, read-only (no state database yet: none)."""
    return [] if store is None else quarantine_lines(store.quarantined_gpus())
