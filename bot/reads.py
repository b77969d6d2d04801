"""The verdict and its chart for the slash commands, read the way the daemon reads them.

The FINAL verdict, once stored, is the one of record and is shown as stored. Before it, /verdict
reads the log now through `babysit.verdict.reading` (prereg hash checked on every read, so a tampered
pre-registration gives a refusal, never a card). Errors are BabysitErrors whose message the bot
shows as is.

A run of another box of the fleet (its run.toml and log are on that box) is answered from the database:
the verdict that box stored last (its FINAL one, else its newest PROVISIONAL read), with how old that
read is and how fresh the box's lease is (`Stored`).

`/babysit status` and `runs` in a fleet (`fleet_rows`): every box's rows from the database alone, this
box's included (progress as its daemon stored it, as for every other box: no log is read), through one
reader kept across commands: its connection, the registry and each run.toml are read again only when
they change. The answer is five queries, whatever the number of runs (bench/README.md §12).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from babysit.core.errors import BabysitError, BadInput
from babysit.core.spec.run_toml import load_spec
from babysit.db.store import Store
from babysit.db.url import store_url
from babysit.runtime.registry import Registry, RunEntry
from babysit.verdict.chart import render_chart
from babysit.verdict.reading import final_chart, read_registered_verdict, read_series, records_log, require_prereg
from babysit.view import runview
from babysit.view.runview import RunRow, box_staleness, host_states


@dataclass(frozen=True)
class Stored:
    """Another box's run as the database has it: the verdict body that box stored and how fresh it is."""

    body: dict[str, Any]
    host: str
    read_ago_s: float  # since the owning box computed this read
    box: str  # 'box box-b: up, lease renewed 4 s ago'
    chart_path: str | None  # where that box drew the FINAL chart (a path on that box)

    @property
    def note(self) -> str:
        final = self.body.get("status") == "FINAL"
        return (f"From the fleet's database: {'the FINAL verdict' if final else 'the last read'} box {self.host} "
                f"stored {self.read_ago_s:.0f} s ago ({self.box}); its run.toml and log are on that box.")


def stored_verdict(store: Store, run: str, host: str) -> Stored:
    """The verdict of `run`, owned by box `host`, from the database alone; raises when none is stored."""
    row = store.latest_verdict(run)
    hosts = {h.name: h for h in store.hosts()}
    now = store.now()
    box = (box_staleness(hosts[host], host_states([hosts[host]])[host], now) if host in hosts
           else f"box {host}: no lease row")
    if row is None:
        raise BadInput(f"box {host} has stored no verdict read of {run} yet ({box})",
                       hint=f"a read is stored at each of {run}'s evals on box {host}")
    chart = store.final_chart_path(run) if row.body.get("status") == "FINAL" else None
    return Stored(row.body, host, max(0.0, now - row.at), box, chart)


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
    stored = final_chart(store, entry.name)  # where the daemon drew it, as its verdict row says
    if final is not None and stored is not None:
        return stored, final.body
    spec = load_spec(reg.spec_path(entry))
    prereg = require_prereg(spec)
    verdict = read_registered_verdict(spec, entry.prereg_sha256, store)
    series, train, _ = read_series(records_log(spec, store), prereg)
    out = reg.state_dir / "charts" / f"{entry.name}-{int(time.time())}.png"
    path = render_chart(out, run=entry.name, prereg=prereg, series=series, verdict=verdict,
                        amendments=verdict.amendments, train_series=train)
    return Path(path), verdict.to_json(entry.name, entry.prereg_sha256)



_readers: dict[Path, runview.Reader] = {}
_readers_lock = threading.Lock()  # Bolt runs listeners on a pool of threads: one reader, one at a time


def fleet_rows(reg: Registry, names: Sequence[str] | None = None) -> tuple[list[RunRow], list[str]]:
    """(the rows of `names`, default every box's runs; one line a box) for `/babysit status|runs`. On one
    box (SQLite) as `babysit status` reads them, its logs included; in a fleet from the database alone."""
    if store_url(reg) is None:
        return runview.collect(reg.path, names), []
    with _readers_lock:
        reader = _readers.get(reg.path)
        if reader is None:
            reader = _readers[reg.path] = runview.Reader(reg.path)
        try:
            return reader.rows(names, logs=False), reader.fleet_boxes()
        except BabysitError:
            _readers.pop(reg.path, None)  # a fresh reader (and connection) at the next command
            reader.close()
            raise


def close_readers() -> None:
    """Close the readers' connections (the bot stopping: a box that lost the gateway lease keeps none)."""
    with _readers_lock:
        for reader in _readers.values():
            reader.close()
        _readers.clear()
