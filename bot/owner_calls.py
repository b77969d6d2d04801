"""Owner calls in Slack: a proposed run or an escalation, answered with a button (launch / extend / hold).

The click is an interactivity request: in HTTP mode Bolt checks its signature and its 5-minute replay
window before any listener runs (401 otherwise, recorded here as a refused click); the listener then
checks the clicker against the campaign's `owners` (else `[daemon].abort_allow_list`), and the store
takes the FIRST decision only (a replayed or second click is refused and recorded). Nothing launches
without an accepted click: `launch` and `extend` register the proposed run.toml, and the daemon
launches what is registered. Every click, accepted or refused, is a row of `owner_call_clicks`.

The payload Slack sends (`block_actions`): `actions[0].action_id` one of the three ids below,
`actions[0].value` the owner call's id (decimal), `user.id` the clicker, `response_url` where the
answer goes (the message is replaced with the decision).
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

import structlog

from babysit.campaign import clicks
from babysit.campaign.history import view_of
from babysit.core.blocks import context, section
from babysit.core.campaign import render as crender
from babysit.core.campaign.spec import Banked, Campaign, Suspect, load_campaign
from babysit.core.errors import BabysitError
from babysit.core.render import Rendered
from babysit.view import runview
from bot.context import BotConfig, opened, owner_elsewhere, unanswered, wait_result
from bot.messages import answer, reply
from bot.predicates import user_of

log = structlog.get_logger("babysit.bot")

# The action ids a Socket Mode client or a test sends (the buttons are drawn by babysit/core/campaign/render.py).
LAUNCH_ACTION_ID, EXTEND_ACTION_ID, HOLD_ACTION_ID = crender.LAUNCH_ACTION_ID, crender.EXTEND_ACTION_ID, \
    crender.HOLD_ACTION_ID
ACTION_IDS = crender.ACTION_IDS
DECISION_OF = {v: k for k, v in ACTION_IDS.items()}
REPLAY_WINDOW_S = 300  # Bolt's: a request timestamp older than this is refused as a replay


decided_text = clicks.decided_text


# -- the click -----------------------------------------------------------------------------------------
def clicked(cfg: BotConfig, body: Mapping[str, Any], ack: Any, respond: Any) -> None:
    """An owner-call button click whose signature Bolt verified: answered here when the call is this box's
    (or the only box's); in a fleet, a call another box raised (its campaign's file and proposals are
    there) is a control request addressed to that box, whose answer comes back through the response_url."""

    ack()
    decision, value = _clicked(body)
    user = user_of(body) or "?"
    now = time.time()
    call_id = int(value) if value and value.isdigit() else None
    with opened(cfg) as (_, store):
        call = store.owner_call(call_id) if call_id is not None else None
        owner = owner_elsewhere(store, call.run) if call is not None else None
        if call is None or owner is None:
            done = clicks.answer(cfg.registry_path, store, call_id, decision, user, now, shown_id=value)
        else:
            request = store.request(call.run, clicks.request_action(call.id, str(decision)), f"slack:{user}", now)
            log.info("owner call click sent to its box", call=call.id, box=owner, user=user, request=request)
            result = wait_result(store, request, cfg.request_wait_s, call.run)
            if result is None:
                respond(**answer(unanswered(store, call.run, "decision", request, cfg.request_wait_s,
                                            shown=f"owner call #{call.id} (box {owner})")))
                return
            done = clicks.Answer.from_result(result)
    respond(**answer(reply(done.text), in_channel=done.accepted, replace=True if done.accepted else None))


def campaign_reply(cfg: BotConfig, name: str | None) -> Any:
    """`/babysit campaign [NAME]`: the list of campaigns, or one's suspect table, runs and decisions."""

    with opened(cfg) as (_, store):
        if not name:
            return Rendered(*crender.campaigns_reply([c["name"] for c in store.campaigns()]))
        row = store.campaign(name)
        if row is None:
            known = [c["name"] for c in store.campaigns()]
            text = f"No campaign named `{name}`." + (f" Known: {', '.join(known)}." if known else
                                                      " `babysit campaign register CAMPAIGN.toml` adds one.")
            return Rendered(text, [section(text)])
        if Path(row["file"]).is_file():
            view = view_of(load_campaign(row["file"]), store).to_json()
            return Rendered(*crender.table_reply(view))
        # another box's campaign (its file is there): as registered, with its runs and decisions as stored
        campaign, registered = stored_campaign(row, store)
        view = view_of(campaign, store).to_json()
        note = _away_note(row, registered, store)
    text, blocks = crender.table_reply(view)
    return Rendered(f"{text}\n{note}", [*blocks, context(note)])


def stored_campaign(row: Mapping[str, Any], store: Any) -> tuple[Campaign, bool]:
    """The campaign of `row` rebuilt from what `babysit campaign register` stored (its question, suspects
    and banked references, under its sha256), for a box that cannot read its file; (campaign, whether
    a registration was found: a campaign only joined by its runs has none)."""
    events = [e for e in store.campaign_events(row["name"]) if e.kind == "registered"
              and e.body.get("sha256") == row["sha256"]]
    body = events[-1].body if events else {}
    suspects = tuple(Suspect(str(n), str(st)) for n, st in (body.get("suspects") or {}).items())
    banked = tuple(Banked(str(n), float(d)) for n, d in (body.get("banked") or {}).items())
    question = str(body.get("question") or f"(in {row['file']}, not readable here)")
    return Campaign(name=row["name"], question=question, file=Path(row["file"]), suspects=suspects, banked=banked,
                    sha256=row["sha256"]), bool(events)


def _away_note(row: Mapping[str, Any], registered: bool, store: Any) -> str:
    """Where the campaign's file is and how fresh what the database says of its box(es) is."""
    owners = store.run_hosts()
    boxes = sorted({owners[r["run"]] for r in store.campaign_runs(row["name"]) if r["run"] in owners})
    hosts = {h.name: h for h in store.hosts()}
    states, now = runview.host_states(list(hosts.values())), store.now()
    fresh = "; ".join(runview.box_staleness(hosts[b], states[b], now) for b in boxes if b in hosts)
    where = f"box {', '.join(boxes)}" if boxes else "the box that registered it"
    what = ("its question, suspects and banked runs as registered" if registered
            else "its declared suspects are not in the database (it was never `babysit campaign register`ed)")
    return (f"From the fleet's database: {row['name']}'s file {row['file']} is on {where}; {what} "
            f"(sha256 {row['sha256'][:12]}…), its runs, verdicts and decisions as stored"
            + (f" ({fresh})." if fresh else "."))


# -- registration --------------------------------------------------------------------------------------
def register(app: Any, cfg: BotConfig) -> None:
    """The three button listeners, and a record of every owner-call click Bolt refused (401)."""
    for action_id in ACTION_IDS.values():
        app.action(action_id)(lambda ack, body, respond: clicked(cfg, body, ack, respond))
    dispatch = app.dispatch

    def recording_dispatch(req: Any) -> Any:
        resp = dispatch(req)
        if resp.status == 401:
            record_unverified(cfg, req.raw_body, req.headers)
        return resp

    app.dispatch = recording_dispatch


def record_unverified(cfg: BotConfig, raw_body: str, headers: Mapping[str, Any], now: float | None = None) -> None:
    """A refused request that claims to be an owner-call click: recorded (its claims unverified)."""

    now = time.time() if now is None else now
    try:
        payload = json.loads(parse_qs(raw_body or "").get("payload", ["{}"])[0])
    except (ValueError, TypeError):
        return
    if not isinstance(payload, dict):
        return
    decision, value = _clicked(payload)
    if decision is None:
        return  # not an owner-call click: Bolt logs it
    stamp = (headers.get("x-slack-request-timestamp") or ["0"])[0]
    stale = not str(stamp).isdigit() or abs(now - int(stamp)) > REPLAY_WINDOW_S
    reason = ("request timestamp outside the 5-minute window (a replay?)" if stale
              else "signature does not verify (forged?)")
    user = user_of(payload)
    try:
        with opened(cfg) as (_, store):
            call_id = int(value) if value and str(value).isdigit() else None
            store.add_click(call_id, f"unverified:{user}", decision, "refused", reason, now)
    except BabysitError as exc:
        log.error("refused click not recorded", error=exc.message)
    log.warning("owner call click refused (401)", claimed_user=user, action=decision, reason=reason)


def _clicked(body: Mapping[str, Any]) -> tuple[str | None, str | None]:
    for action in body.get("actions") or ():
        if isinstance(action, Mapping) and action.get("action_id") in DECISION_OF:
            return DECISION_OF[action["action_id"]], str(action.get("value") or "")
    return None, None
