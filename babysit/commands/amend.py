"""`babysit amend NAME FILE`: append an amendment to a registered run, before the data it touches.

The record carries its number, the UTC time, its sha256 chained to the previous record, and the last
step of `metric` data in the log at this moment. Refused (exit 1) on a tampered prereg or once read-step
data exists; a malformed file is refused naming the field (exit 2).
"""

from __future__ import annotations

import argparse
from datetime import datetime, timezone
from pathlib import Path
from typing import Any


def add_parser(sub: argparse._SubParsersAction) -> None:
    from babysit.cli import add_registry_option

    p = sub.add_parser("amend", help="append an amendment (e.g. a scale rule) to a run's pre-registration",
                       description="Append FILE (title, rationale, scale, combine) to the run's amendment chain. "
                                   "Nothing in the frozen [prereg] is edited; the amendment adds a rule.")
    p.add_argument("run", metavar="NAME", help="a registered run")
    p.add_argument("file", metavar="FILE", help="the amendment TOML")
    add_registry_option(p)
    p.set_defaults(func=run)


def amend_registered(registry_path: Path, name: str, file: Path, now: datetime) -> tuple[Any, Any]:
    """Check the freeze, parse FILE, record it; returns (store.Amendment, RunSpec)."""
    from babysit import reading
    from babysit.amendment import load_amendment, record_amendment
    from babysit.store import Store

    reg, entry, spec = reading.load_registered(registry_path, name)
    reading.check_frozen(spec, entry.prereg_sha256)
    amendment = load_amendment(file, str(file))
    store = Store.in_dir(reg.state_dir)
    try:
        return record_amendment(store, spec, amendment, now), spec
    finally:
        store.close()


def run(args: argparse.Namespace) -> int:
    from babysit.registry import resolve_registry_path

    record, spec = amend_registered(resolve_registry_path(args.registry), args.run, Path(args.file),
                                    datetime.now(timezone.utc))
    seen = record.data_seen_through_step
    print(f"amendment {record.n} recorded for {spec.name}: {record.title}")
    print(f"  declared_at {record.declared_at}; {spec.prereg.metric} data seen through step "
          f"{seen if seen is not None else '— (none yet)'}")
    print(f"  sha256 {record.sha256}" + (f" (chained to {record.prev_sha256[:16]}…)" if record.prev_sha256 else ""))
    if seen is not None and seen >= spec.prereg.baseline_step:
        print(f"  note: declared after the baseline eval (step {spec.prereg.baseline_step}) was in the log; "
              "the record says so")
    return 0
