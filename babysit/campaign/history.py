"""A campaign as it stands, read from the registry, the store and the runs' logs into one frozen view.

`babysit campaign show`, `/babysit campaign`, the campaign post and the saga chart all read through
`collect`, so they say the same thing: the suspect table (declared statuses + recorded moves), each
run with its delta, label and what it changed, the banked references, and the decision log.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from fractions import Fraction
from pathlib import Path
from typing import Any

from babysit.campaign import settle
from babysit.core.campaign import grid as grid_mod
from babysit.core.campaign.spec import Campaign, load_campaign
from babysit.core.errors import BadInput
from babysit.core.spec.run_toml import RunSpec, load_spec
from babysit.core.verdict import build_rules
from babysit.db.store import OwnerCall, Row, Store
from babysit.db.url import open_store
from babysit.runtime import registry as registry_mod
from babysit.verdict.reading import read_series, records_log


@dataclass(frozen=True)
class RunView:
    name: str
    parent: str | None
    suspect: str | None
    changed: str
    state: str  # the run's status in the store (pending, running, finished, …)
    label: str | None = None
    delta: float | None = None
    verdict_status: str | None = None  # FINAL | PROVISIONAL | NO-READ | None (no read yet)
    read_step: int | None = None
    baseline_step: int | None = None
    scale: float | None = None  # the last amendment's scale: the run's own units (drawn with its annotation)
    curve: tuple[tuple[int, float], ...] = ()  # delta from the baseline eval, by step
    bands: tuple[tuple[str, float | None, float | None], ...] = ()  # the original rule: (label, min, max)
    metric: str | None = None
    outcome: str | None = None  # its grid: carried | pending | suspended | None (no FINAL verdict yet)
    outcome_why: str | None = None  # what it stands on, waits for, or why it is suspended


@dataclass(frozen=True)
class View:
    campaign: Campaign
    suspects: tuple[grid_mod.SuspectRow, ...]
    runs: tuple[RunView, ...]
    calls: tuple[OwnerCall, ...] = ()
    events: tuple[Row, ...] = field(default=())

    def to_json(self) -> dict[str, Any]:
        c = self.campaign
        return {
            "campaign": c.name, "question": c.question, "file": str(c.file),
            "suspects": [{"name": s.name, "status": s.status, "declared": s.declared, "by_run": s.by_run,
                          "by_label": s.by_label, "held": list(s.held)} for s in self.suspects],
            "banked": [{"name": b.name, "delta": b.delta, "note": b.note} for b in c.banked],
            "runs": [{"name": r.name, "parent": r.parent, "suspect": r.suspect, "changed": r.changed,
                      "state": r.state, "label": r.label, "delta": r.delta, "status": r.verdict_status,
                      "scale": r.scale, "outcome": r.outcome, "outcome_why": r.outcome_why} for r in self.runs],
            "decisions": [{"call": k.id, "run": k.run, "question": k.question, "options": list(k.options),
                           "decision": k.decision, "decided_by": k.decided_by, "decided_at": k.decided_at,
                           "result": k.result} for k in self.calls],
            "history": [{"at": e.at, "run": e.run or None, "kind": e.kind, **e.body} for e in self.events],
        }


def collect(registry_path: Path, name: str, *, curves: bool = False) -> View:
    """The view of campaign `name`; `curves` also reads each run's log for the saga chart."""
    reg = registry_mod.load(registry_path)
    store = open_store(reg)
    try:
        row = store.campaign(name)
        if row is None:
            known = [c["name"] for c in store.campaigns()]
            raise BadInput(f"no campaign named '{name}' in {reg.state_dir}" +
                           (f"; registered: {', '.join(known)}" if known else " (none registered)"),
                           hint="register it: babysit campaign register CAMPAIGN.toml")
        return view_of(load_campaign(row["file"]), store, curves=curves)
    finally:
        store.close()


def view_of(campaign: Campaign, store: Store, *, curves: bool = False) -> View:
    events = tuple(store.campaign_events(campaign.name))
    moves = [e.body for e in events if e.kind == "suspect"]
    history = [(e.run, e.kind, e.body) for e in events]
    outcomes = settle.outcomes(history)
    runs = []
    states = store.run_states()
    for joined in store.campaign_runs(campaign.name):
        view = _run_view(joined, store, states.get(joined["run"], ("pending", {}))[0], curves)
        kind, body = outcomes.get(view.name, (None, {}))
        runs.append(replace(view, outcome=kind, outcome_why=body.get("why")))
    return View(campaign, grid_mod.suspect_table(campaign, moves, settle.held_moves(history)), tuple(runs),
                tuple(store.owner_calls(campaign.name)), events)


def _run_view(joined: dict[str, Any], store: Store, state: str, curves: bool) -> RunView:
    run = joined["run"]
    verdict = store.final_verdict(run) or store.latest_verdict(run)
    body = verdict.body if verdict else {}
    base = RunView(name=run, parent=joined["parent"], suspect=joined["suspect"],
                   changed=joined["delta"].get("summary", ""), state=state, label=body.get("label"),
                   delta=body.get("delta"), verdict_status=body.get("status"), read_step=body.get("read_step"),
                   baseline_step=body.get("baseline_step"), scale=_scale(body))
    if not curves:
        return base
    spec = _spec(Path(joined["spec"]))
    if spec is None or spec.prereg is None:
        return base
    series, _, _ = read_series(records_log(spec, store), spec.prereg)
    values = dict(series)
    b = spec.prereg.baseline_step
    curve = tuple((s, float(Fraction(repr(v)) - Fraction(repr(values[b])))) for s, v in sorted(values.items())
                  if b in values and s >= b)
    return replace(base, curve=curve, bands=_bands(spec), metric=spec.prereg.metric,
                   read_step=spec.prereg.read_step, baseline_step=b)


def _spec(path: Path) -> RunSpec | None:
    """The run's spec as it is now; an unreadable one draws no curve (the store still has its read)."""
    try:
        return load_spec(path)
    except BadInput:
        return None


def _bands(spec: RunSpec) -> tuple[tuple[str, float | None, float | None], ...]:

    assert spec.prereg is not None
    (original, *_) = build_rules(spec.prereg)
    return tuple((b.label, None if b.min is None else float(b.min), None if b.max is None else float(b.max))
                 for b in original.bands)


def _scale(body: dict[str, Any]) -> float | None:
    scales = [r.get("scale") for r in body.get("rules") or () if r.get("scale") is not None]
    return float(scales[-1]) if scales else None
