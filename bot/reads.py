"""The verdict and its chart for the slash commands, read the way the daemon reads them.

The FINAL verdict, once stored, is the one of record and is shown as stored. Before it, /verdict
reads the log now through `babysit.reading` (prereg hash checked on every read, so a tampered
pre-registration gives a refusal, never a card). Errors are BabysitErrors whose message the bot
shows as is.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from babysit.chart import render_chart
from babysit.core.spec import load_spec
from babysit.reading import read_registered_verdict, read_series, records_log, require_prereg
from babysit.registry import Registry, RunEntry
from babysit.store import Store


def verdict_body(reg: Registry, entry: RunEntry, store: Store) -> tuple[dict[str, Any], int]:
    """(the verdict JSON of docs/verdicts.md, precision)."""

    spec = load_spec(reg.spec_path(entry))
    prereg = require_prereg(spec)
    final = store.final_verdict(entry.name)
    if final is not None:
        return final.body, prereg.precision
    verdict = read_registered_verdict(spec, entry.prereg_sha256, store)
    return verdict.to_json(entry.name, entry.prereg_sha256), prereg.precision


def chart_file(reg: Registry, entry: RunEntry, store: Store) -> tuple[Path, dict[str, Any]]:
    """The FINAL verdict's chart when it exists, else one drawn now from the log as it stands."""

    final = store.final_verdict(entry.name)
    stored = reg.state_dir / "verdicts" / f"{entry.name}.png"  # where the daemon draws the FINAL chart
    if final is not None and stored.is_file():
        return stored, final.body
    spec = load_spec(reg.spec_path(entry))
    prereg = require_prereg(spec)
    verdict = read_registered_verdict(spec, entry.prereg_sha256, store)
    series, train, _ = read_series(records_log(spec, store), prereg)
    out = reg.state_dir / "charts" / f"{entry.name}-{int(time.time())}.png"
    path = render_chart(out, run=entry.name, prereg=prereg, series=series, verdict=verdict,
                        amendments=verdict.amendments, train_series=train)
    return Path(path), verdict.to_json(entry.name, entry.prereg_sha256)

