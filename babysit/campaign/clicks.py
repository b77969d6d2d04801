"""An owner's click on an owner call (launch / extend / hold), carried out on the box that owns the call.

The bot (bot/owner_calls.py) hands a click here after Bolt checked its signature. The checks and the
decision need the campaign's file (its `owners`) and its proposals, which are on the box whose run raised
the call: on that box (or a single box) the bot calls `answer` itself; a fleet's gateway answering for
another box's call queues a control request addressed to that box instead (`request_action`), which its
daemon carries out through the same `answer` (babysit/service/control.py) and answers with `Answer.to_result`; the
gateway then tells the clicker through the response_url, as an abort's answer is told.

Checks, in order: the clicker on the campaign's `owners` (else `[daemon].abort_allow_list`), the decision
one of the call's options, the call not decided yet (the store's atomic update: the first decision wins,
a replayed or second click is refused). Every click, accepted or refused, is a row of `owner_call_clicks`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import structlog

from babysit.campaign import actions
from babysit.core.campaign.spec import load_campaign
from babysit.core.errors import BabysitError
from babysit.db.store import Store
from babysit.runtime import registry as registry_mod

log = structlog.get_logger("babysit.campaign")

ACTION = "owner-call"  # a control request's action: "owner-call CALL_ID DECISION"
OWNERS = "owners listed in the campaign's `owners` (else `[daemon].abort_allow_list`)"


@dataclass(frozen=True)
class Answer:
    """What the clicker is told: `accepted` replaces the call's message in the channel with the decision;
    a refusal is told to the clicker alone."""

    accepted: bool
    text: str

    def to_result(self) -> str:
        return json.dumps({"accepted": self.accepted, "text": self.text})

    @classmethod
    def from_result(cls, result: str) -> Answer:
        """A control request's result (a daemon's `to_result`; plain text from a daemon that failed)."""
        try:
            body = json.loads(result)
            return cls(bool(body["accepted"]), str(body["text"]))
        except (ValueError, TypeError, KeyError):
            return cls(False, f"Owner call: {result}. Nothing was done.")


def request_action(call_id: int, decision: str) -> str:
    return f"{ACTION} {call_id} {decision}"


def parse_action(action: str) -> tuple[int, str] | None:
    """(call id, decision) of a `request_action`; None for any other action."""
    words = action.split()
    if len(words) != 3 or words[0] != ACTION or not words[1].isdigit():
        return None
    return int(words[1]), words[2]


def decided_text(call_id: int, decision: str, user: str, result: str) -> str:
    return f"🙋 owner call #{call_id}: *{decision}* chosen by <@{user}> — {result}"


def answer(registry_path: Path, store: Store, call_id: int | None, decision: str | None, user: str,
           now: float, *, shown_id: str | None = None) -> Answer:
    """Check the click and carry out its decision, here (the box holding the call's campaign)."""
    call = store.owner_call(call_id) if call_id is not None else None
    if call is None:
        shown = shown_id if shown_id is not None else call_id
        store.add_click(None, user, decision, "refused", f"no owner call {shown!r}", now)
        return Answer(False, f"No owner call #{shown} is open here: nothing was done.")
    row = store.campaign(call.campaign)
    owners = load_campaign(row["file"]).owners if row else ()
    allowed = owners or registry_mod.load(registry_path).daemon.abort_allow_list
    refusal = None
    if user not in set(allowed):
        refusal = "not on the allow-list"
    elif decision not in call.options:
        refusal = f"'{decision}' is not an option of this call"
    elif not store.decide_owner_call(call.id, str(decision), f"slack:{user}", now):
        done = store.owner_call(call.id)
        refusal = f"already decided: {done.decision} by {done.decided_by}" if done else "already decided"
    if refusal is not None:
        store.add_click(call.id, user, decision, "refused", refusal, now)
        store.add_campaign_event(call.campaign, call.run, "click-refused",
                                 {"call": call.id, "user": user, "action": decision, "reason": refusal}, now)
        log.warning("owner call click refused", call=call.id, user=user, action=decision, reason=refusal)
        text = (f"<@{user}>, you cannot answer owner call #{call.id}: only {OWNERS} can. Nothing was done."
                if refusal == "not on the allow-list" else f"Owner call #{call.id}: {refusal}. Nothing was done.")
        return Answer(False, text)
    store.add_click(call.id, user, decision, "accepted", "", now)
    try:
        result = actions.decide(registry_path, store, call, str(decision), f"slack:{user}", now)
    except BabysitError as exc:
        result = f"FAILED: {exc.message}" + (f" ({exc.hint})" if exc.hint else "")
        store.set_owner_call_result(call.id, result)
        store.add_campaign_event(call.campaign, call.run, "decision",
                                 {"call": call.id, "decision": decision, "by": f"slack:{user}",
                                  "result": result}, now, dedupe_key=f"{call.campaign}:decision:{call.id}")
    log.warning("owner call decided", call=call.id, user=user, decision=decision, result=result)
    return Answer(True, decided_text(call.id, str(decision), user, result))


def carry_out(registry_path: Path, store: Store, action: str, requested_by: str, now: float) -> str:
    """A daemon's answer to an `owner-call` control request another box's gateway queued: the result."""
    parsed = parse_action(action)
    if parsed is None:
        return Answer(False, f"Owner call: a malformed request {action!r}. Nothing was done.").to_result()
    call_id, decision = parsed
    user = requested_by.removeprefix("slack:")
    return answer(registry_path, store, call_id, decision, user, now).to_result()
