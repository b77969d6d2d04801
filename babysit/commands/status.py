"""`babysit status [RUN] [--json] [--watch]`: what every run is doing, from the store and the runs' logs
(fast, read-only; the rows come from babysit/runview.py, the table from babysit/runtable.py)."""

from __future__ import annotations

import argparse
import json
import time
from typing import Any


def add_parser(sub: argparse._SubParsersAction) -> None:
    from babysit.cli import add_registry_option, positive_seconds

    p = sub.add_parser("status", help="runs, attempt, step, s/step, ETA, last poll, last incident (--watch: live)",
                       description="What every registered run is doing (or RUN alone), read from the state "
                                   "database: status, attempt, step, s/step, ETA, GPU-hours, last poll, the last "
                                   "incident (or how a finished run ended) and the latest verdict read. Read-only; "
                                   "works with or without a daemon.")
    p.add_argument("run", nargs="?", metavar="RUN", help="one registered run (default: all)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--watch", action="store_true",
                   help="keep the table up, refreshed from the state database (a terminal: redrawn in place; "
                        "otherwise a line per run when it changes); Ctrl-C ends it")
    p.add_argument("--interval", type=positive_seconds, default=2.0, metavar="S",
                   help="with --watch: seconds between looks")
    add_registry_option(p)
    p.set_defaults(func=run)


def collect(reg: Any, names: list[str]) -> list[dict[str, Any]]:
    """The rows as plain dicts (the `--json` shape; what the Slack bot reads): see babysit/runview.py."""
    from babysit import runview

    return [row.to_dict() for row in runview.collect(reg.path, names)]


def run(args: argparse.Namespace) -> int:
    from babysit import registry, runview
    from babysit.runtable import status_table

    reg = registry.load(registry.resolve_registry_path(args.registry))
    names = [reg.get(args.run).name] if args.run else list(reg.names)
    if args.watch:
        from babysit.core.errors import BadInput
        from babysit.watch import watch

        if args.json:
            raise BadInput("--watch and --json do not go together",
                           hint="`babysit status --json` for one look, `babysit status --watch` for the live table")
        return watch(reg.path, names if args.run else None, interval=args.interval)
    rows = runview.collect(reg.path, names)
    if args.json:
        dicts = [row.to_dict() for row in rows]
        print(json.dumps(dicts if not args.run else dicts[0], indent=2))
        return 0
    if not rows:
        print(f"no runs registered in {reg.path}; `babysit register RUN.toml` adds one")
        return 0
    print(status_table(rows, time.time()))
    for r in rows:
        if r.note:  # e.g. a run.toml edited into something invalid: the table is the store's word only
            print(f"{r.run}: {r.note}")
        if r.hardware_profile:
            hp = r.hardware_profile
            print(f"{r.run}: attempt 1 profile '{hp.get('profile')}' selected by smoke run {hp.get('measured_at')} "
                  f"({hp.get('path')})")
    return 0


