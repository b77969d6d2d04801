"""What a campaign does when a verdict lands: each run's grid carried out, held pending, or suspended.

A single-delta run is read against its parent, so its grid waits for the parent (`settle`, pure): when
the run's FINAL verdict lands first, its outcome is recorded *pending* (on what, in words) and nothing
moves, is banked or proposed; the parent's own FINAL verdict then triggers it — carried out, once, on a
usable read, or *suspended* on an AMBIGUOUS-BY-INSTRUMENT one (an outcome already carried out is
withdrawn: its moves stop counting, its open owner call is closed). `reconcile` does it for every run of
a campaign that has a FINAL verdict, from what the store records, so it is called freely: after any
FINAL verdict of the campaign, at the daemon's start, after an amendment. Every record and post is
keyed in the store (its dedupe keys), so a daemon redoing a step — a restart mid-way, a second
trigger — records and posts nothing twice.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import structlog

from babysit.campaign import actions, settle
from babysit.core.campaign import grid as grid_mod
from babysit.core.campaign.spec import Campaign, load_campaign, parse_grid
from babysit.core.errors import BabysitError
from babysit.core.spec.run_toml import RunSpec, load_spec
from babysit.core.spec.tomlfile import Table
from babysit.db.store import Store
from babysit.verdict.reading import read_registered_verdict

log = structlog.get_logger("babysit.campaign")
_ORDER = {settle.SUSPEND: 0, settle.PEND: 1, settle.CARRY: 2}
_ONE_AT_A_TIME = threading.Lock()  # the daemon's threads (a verdict, the start's catch-up) take turns


class CampaignStepFailed(BabysitError):
    """Carrying out, holding or suspending a run's outcome failed (the others were still done)."""


def on_final_verdict(ctx: Any, spec: RunSpec, verdict: Mapping[str, Any]) -> None:
    """The daemon's hook after a FINAL verdict is saved and queued: every campaign the run belongs to,
    or is the parent of a run of, is reconciled (its own grid and its children's pending ones)."""
    if verdict.get("status") != "FINAL":
        return
    for name in campaigns_touching(ctx.store, spec.name):
        reconcile(ctx.store, name, state_dir=ctx.state_dir, default_channel=ctx.default_channel, now=ctx.now(),
                  specs={spec.name: spec})


def campaigns_touching(store: Store, run: str) -> list[str]:
    """The campaign `run` joined, then every campaign with a run whose parent it is."""
    joined = store.campaign_run(run)
    out = [joined["campaign"]] if joined else []
    for c in store.campaigns():
        if c["name"] not in out and any(r["parent"] == run for r in store.campaign_runs(c["name"])):
            out.append(c["name"])
    return out


def reconcile(store: Store, name: str, *, state_dir: Path, default_channel: str | None, now: float,
              specs: Mapping[str, RunSpec] | None = None) -> list[tuple[str, str]]:
    """Take the one due step of every run of campaign `name` that has a FINAL verdict; returns the
    (run, step) taken. A step that fails is logged and raised after the others were taken."""
    with _ONE_AT_A_TIME:
        return _reconcile(store, name, state_dir=state_dir, default_channel=default_channel, now=now, specs=specs)


def _reconcile(store: Store, name: str, *, state_dir: Path, default_channel: str | None, now: float,
               specs: Mapping[str, RunSpec] | None) -> list[tuple[str, str]]:
    row = store.campaign(name)
    if row is None:
        return []
    campaign = load_campaign(row["file"])
    runs = store.campaign_runs(name)
    states = {run: state for run, (state, _) in store.run_states().items()}
    recorded = settle.outcomes((e.run, e.kind, e.body) for e in store.campaign_events(name))
    done: list[tuple[str, str]] = []
    failed: list[str] = []
    due: list[tuple[settle.Step, dict[str, Any], dict[str, Any]]] = []
    for joined in runs:
        run = joined["run"]
        final = store.final_verdict(run)
        if final is None:
            continue
        try:
            step = settle.next_step(recorded.get(run, (None, {}))[0],
                                    settle.settle(baseline_of(store, campaign, joined, states)))
        except Exception as exc:  # one run's failure never costs the others theirs
            log.error("campaign step not decided", campaign=name, run=run, exc_info=exc)
            failed.append(f"{run}: {getattr(exc, 'message', None) or f'{type(exc).__name__}: {exc}'}")
            continue
        if step is not None:
            due.append((step, joined, final.body))
    # what no longer stands (or not yet) is recorded first, so every post's suspect table is the truth
    due.sort(key=lambda d: _ORDER[d[0].action])
    for step, joined, verdict in due:
        run = joined["run"]
        try:
            spec = (specs or {}).get(run) or load_spec(Path(joined["spec"]))
            _take(step, store, campaign, joined, spec, verdict, state_dir, default_channel, now)
            done.append((run, step.action))
            log.info("campaign outcome", campaign=name, run=run, step=step.action, why=step.settlement.why)
        except Exception as exc:
            log.error("campaign step failed", campaign=name, run=run, exc_info=exc)
            failed.append(f"{run}: {getattr(exc, 'message', None) or f'{type(exc).__name__}: {exc}'}")
    if failed:
        raise CampaignStepFailed(f"campaign {name}: " + "; ".join(failed),
                                 hint="fix what it names; the next FINAL verdict or daemon start redoes the step")
    return done


def baseline_of(store: Store, campaign: Campaign, joined: Mapping[str, Any],
                states: Mapping[str, str]) -> settle.Baseline:
    """Where the run's parent stands, from the store: its kind, its latest read, its state, and its FINAL
    read again when amendments were recorded after it."""
    run, parent = joined["run"], joined["parent"]
    if parent is None:
        return settle.Baseline(run, None, settle.NO_PARENT)
    banked = campaign.banked_run(parent)
    if banked is not None and banked.spec is not None:  # join.parent_spec takes the banked one first too
        return settle.Baseline(run, parent, settle.BANKED)
    verdict = store.final_verdict(parent) or store.latest_verdict(parent)
    body = verdict.body if verdict else {}
    base = settle.Baseline(run, parent, settle.RUN, status=body.get("status"), label=body.get("label"),
                           at_step=body.get("at_step"), read_step=body.get("read_step"), state=states.get(parent))
    if body.get("status") != "FINAL":
        return base
    counted = {a.get("n") for a in body.get("amendments") or ()}
    late = tuple(a.n for a in store.amendments(parent) if a.n not in counted)
    if not late:
        return base
    from dataclasses import replace

    return replace(base, late=late, relabel=_read_again(store, parent, body))


def _read_again(store: Store, parent: str, body: Mapping[str, Any]) -> str | None:
    """The parent's label read from its whole log with every amendment the store holds (None: unreadable)."""
    joined = store.campaign_run(parent)
    if joined is None:
        return None
    try:
        spec = load_spec(Path(joined["spec"]))
        return read_registered_verdict(spec, body.get("prereg_sha256"), store).label
    except BabysitError as exc:
        log.warning("parent's verdict not re-read with its late amendments", run=parent, error=exc.message)
        return None


# -- the steps ----------------------------------------------------------------------------------------
def _take(step: settle.Step, store: Store, campaign: Campaign, joined: Mapping[str, Any], spec: RunSpec,
          verdict: Mapping[str, Any], state_dir: Path, default_channel: str | None, now: float) -> None:
    run = joined["run"]
    grid = parse_grid(Table(json.loads(joined["grid"]), f"the grid frozen for {run}", "campaign.grid"))
    label = str(verdict.get("label"))
    plan = grid_mod.plan(run, label, grid, verdict.get("interpretation"))
    key = f"{campaign.name}:{run}:final"
    store.add_campaign_event(campaign.name, run, "verdict",
                             {"label": label, "delta": verdict.get("delta"), "sentence": plan.sentence}, now,
                             dedupe_key=f"{key}:verdict")
    channel = campaign.channel or spec.notify.channel or default_channel
    post: dict[str, Any] = {"run": run, "campaign": campaign.name, "label": label, "sentence": plan.sentence,
                            "outcome": step.action, "baseline": step.settlement.to_json(), "channel": channel,
                            "moves": [list(m) for m in plan.moves]}
    if step.action == settle.CARRY:
        _carry(store, campaign, spec, plan, key, now, post, state_dir, channel)
        return
    body = {"label": label, "parent": step.settlement.parent, "why": step.settlement.why,
            "moves": [list(m) for m in plan.moves], "bank_to": plan.bank_to,
            "propose": plan.propose.suspect if plan.propose else None, "extend_to": plan.extend_to}
    if step.action == settle.PEND:
        store.add_campaign_event(campaign.name, run, settle.PENDING, body, now, dedupe_key=f"{key}:pending")
    else:
        body["withdrawn"] = _withdraw(store, campaign, run, step, now) if step.withdraw else {}
        store.add_campaign_event(campaign.name, run, settle.SUSPENDED, body, now, dedupe_key=f"{key}:suspended")
        post["withdrawn"] = body["withdrawn"]
    chart, chart_error = actions.saga_step(store, state_dir, campaign)
    suspects = _suspects(store, campaign)
    post.update(suspects=suspects, table_as_in=_table_as_last_posted(store, campaign, suspects),
                chart_path=str(chart) if chart else None,
                chart_error=chart_error, would={"bank_to": plan.bank_to, "proposals": _would_propose(plan)})
    store.enqueue(run, "campaign", post, now, dedupe_key=f"{key}:{step.action}-post")


def _carry(store: Store, campaign: Campaign, spec: RunSpec, plan: grid_mod.Plan, key: str, now: float,
           post: dict[str, Any], state_dir: Path, channel: str | None) -> None:
    """The grid entry of the label, carried out: moves, bank, proposals, the post, the owner call."""
    run, label = spec.name, plan.label
    for suspect, status in plan.moves:
        store.add_campaign_event(campaign.name, run, "suspect",
                                 {"suspect": suspect, "status": status, "run": run, "label": label}, now,
                                 dedupe_key=f"{key}:suspect:{suspect}")
    bank = actions.bank_step(store, campaign, spec, plan, key, now) if plan.bank_to else None
    proposals = actions.proposal_step(store, campaign, spec, plan, key, now)
    store.add_campaign_event(campaign.name, run, settle.CARRIED,
                             {"label": label, "parent": post["baseline"]["parent"], "why": post["baseline"]["why"]},
                             now, dedupe_key=f"{key}:carried")
    chart, chart_error = actions.saga_step(store, state_dir, campaign)
    suspects = _suspects(store, campaign)
    post.update(bank=bank, proposals=proposals, suspects=suspects,
                table_as_in=_table_as_last_posted(store, campaign, suspects),
                chart_path=str(chart) if chart else None, chart_error=chart_error)
    store.enqueue(run, "campaign", post, now, dedupe_key=f"{key}:post")
    if plan.question:
        options = tuple(o for o in plan.options if o == grid_mod.HOLD or o in proposals)
        call = store.open_owner_call(campaign.name, run, plan.question, options,
                                     {"label": label, "proposals": proposals}, now, dedupe_key=f"{key}:call")
        store.add_campaign_event(campaign.name, run, "owner-call",
                                 {"call": call.id, "question": plan.question, "options": list(options)}, now,
                                 dedupe_key=f"{key}:call")
        store.enqueue(run, "owner-call", {
            "run": run, "campaign": campaign.name, "call_id": call.id, "label": label,
            "question": plan.question, "options": list(options), "proposals": proposals, "channel": channel,
            "owners": list(campaign.owners)}, now, dedupe_key=f"{key}:call-post")


def _withdraw(store: Store, campaign: Campaign, run: str, step: settle.Step, now: float) -> dict[str, Any]:
    """An outcome carried out on a baseline since found instrument-ambiguous: what it did, and its open
    owner call closed (held by babysit, so a later click is refused as already decided)."""
    events = [e for e in store.campaign_events(campaign.name) if e.run == run]
    moves = [[e.body.get("suspect"), e.body.get("status")] for e in events if e.kind == "suspect"]
    banked = [e.body.get("dest") for e in events if e.kind == "banked"]
    proposed = [e.body.get("path") for e in events if e.kind == "proposed"]
    closed, decided = [], []
    for call in store.owner_calls(campaign.name):
        if call.run != run:
            continue
        if store.decide_owner_call(call.id, grid_mod.HOLD, "babysit", now):
            store.set_owner_call_result(call.id, f"withdrawn by babysit: {step.settlement.why}")
            store.add_campaign_event(campaign.name, run, "decision",
                                     {"call": call.id, "decision": grid_mod.HOLD, "by": "babysit",
                                      "result": f"withdrawn: {step.settlement.why}"}, now,
                                     dedupe_key=f"{campaign.name}:decision:{call.id}")
            closed.append(call.id)
        elif call.decided_by == "babysit":  # closed by a suspension a restarted daemon is redoing
            closed.append(call.id)
        elif call.decision is not None and call.decided_by != "babysit":
            decided.append({"call": call.id, "decision": call.decision, "by": call.decided_by,
                            "result": call.result})
    return {"moves": moves, "banked": banked, "proposed": proposed, "calls_closed": closed,
            "calls_decided": decided}


def _would_propose(plan: grid_mod.Plan) -> list[str]:
    out = []
    if plan.propose is not None:
        out.append(f"the next single-delta run (suspect {plan.propose.suspect})")
    if plan.extend_to is not None:
        out.append(f"an extension to step {plan.extend_to}")
    return out


def _table_as_last_posted(store: Store, campaign: Campaign, suspects: list[dict[str, Any]]) -> str | None:
    """The run whose campaign post came last, when that post showed this very suspect table (two verdicts
    read in one round post one after the other): the new post says so instead of printing it again."""
    last = store.last_message("campaign", [joined["run"] for joined in store.campaign_runs(campaign.name)])
    return last.run if last is not None and last.payload.get("suspects") == suspects else None


def _suspects(store: Store, campaign: Campaign) -> list[dict[str, Any]]:
    events = store.campaign_events(campaign.name)
    moved = [e.body for e in events if e.kind == "suspect"]
    held = settle.held_moves((e.run, e.kind, e.body) for e in events)
    return [{"name": s.name, "status": s.status, "by_run": s.by_run, "by_label": s.by_label, "held": list(s.held)}
            for s in grid_mod.suspect_table(campaign, moved, held)]
