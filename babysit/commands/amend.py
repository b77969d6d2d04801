"""`babysit amend NAME FILE`: append an amendment to a registered run, before the data it touches.

The record carries its number, the UTC time, its sha256 chained to the previous record, and the last
step of `metric` data in the log at this moment. Refused (exit 1) on a tampered prereg or once read-step
data exists; a malformed file is refused naming the field (exit 2).
"""

from __future__ import annotations

import argparse
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from babysit.campaign.outcomes import campaigns_touching, reconcile
from babysit.core.errors import BabysitError, BadInput
from babysit.core.reading.log_records import metric_series
from babysit.core.spec.amendment import AmendmentSpec, check_against, last_metric_step, load_amendment, utc_now_iso
from babysit.core.spec.run_toml import RunSpec
from babysit.db.store import Amendment, Store
from babysit.db.url import open_store
from babysit.runtime.registry import resolve_registry_path
from babysit.sources.logtail import read_all
from babysit.verdict import reading


def amend_registered(registry_path: Path, name: str, file: Path, now: datetime) -> tuple[Amendment, RunSpec]:
    """Check the freeze, parse FILE, record it; returns (store.Amendment, RunSpec)."""
    reg, entry, spec = reading.load_registered(registry_path, name)
    reading.check_frozen(spec, entry.prereg_sha256)
    amendment = load_amendment(file, str(file))
    store = open_store(reg)
    try:
        record = record_amendment(store, spec, amendment, now)
        _reconcile_campaigns(store, spec.name, reg, now)
        return record, spec
    finally:
        store.close()


def _reconcile_campaigns(store: Store, run: str, reg: Any, now: datetime) -> None:
    """An amendment recorded after the run's FINAL read (the read raced the amend) can make it
    AMBIGUOUS-BY-INSTRUMENT: what its campaign children concluded from it is suspended now
    (docs/campaigns.md). The amendment stands whatever happens here."""
    for name in campaigns_touching(store, run):
        try:
            reconcile(store, name, state_dir=reg.state_dir, default_channel=reg.daemon.channel, now=now.timestamp())
        except BabysitError as exc:
            print(f"WARNING: campaign {name} not reconciled after the amendment: {exc.message} (the daemon redoes "
                  "it at its next start)", file=sys.stderr)


def run(args: argparse.Namespace) -> int:
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


def record_amendment(store: Store, run_spec: RunSpec, spec: AmendmentSpec, now: datetime) -> Amendment:
    """Append `spec` to the run's chain, recording what `metric` data the log held at this moment.

    Refused (exit 1) once data at or after `read_step` exists: an amendment written after the read can
    no longer be told apart from fitting the rule to the answer. The caller checks the prereg hash.
    """
    prereg = run_spec.prereg
    if prereg is None:
        raise BadInput(f"run '{run_spec.name}' has no [prereg]: there is no verdict to amend",
                       hint="amendments change how a pre-registered verdict is read; add [prereg] under a new name")
    check_against(spec, prereg)
    log = reading.records_log(run_spec, store)
    try:
        records, _garbage = read_all(log)
    except FileNotFoundError:
        records = []
    seen = last_metric_step(metric_series(records, prereg.metric))
    if seen is not None and seen >= prereg.read_step:
        raise BabysitError(
            f"amendment refused: the log already holds {prereg.metric} data through step {seen}, at or after "
            f"read_step {prereg.read_step} ({log})",
            hint="an amendment must be declared before the data it touches; report the read under the frozen "
                 "rules, or try it offline as a what-if: babysit verdict RUN.toml --log PATH --amendment FILE",
        )
    return store.add_amendment(run_spec.name, spec.title, spec.text, utc_now_iso(now), seen)
