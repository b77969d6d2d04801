"""What a campaign says: the post after a FINAL verdict, the suspect table, `campaign show`. Pure.

Each function returns (text, blocks): `text` is the whole message (console, notifications), `blocks`
how Slack shows it; bot/messages.py wraps them as its `Rendered`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from typing import Any

from babysit.core.blocks import actions as actions_block
from babysit.core.blocks import code, context, header, plain, section
from babysit.core.campaign.grid import EXTEND, HOLD, LAUNCH

LAUNCH_ACTION_ID = "babysit_owner_call_launch"  # bot/owner_calls.py answers them
EXTEND_ACTION_ID = "babysit_owner_call_extend"
HOLD_ACTION_ID = "babysit_owner_call_hold"
ACTION_IDS = {LAUNCH: LAUNCH_ACTION_ID, EXTEND: EXTEND_ACTION_ID, HOLD: HOLD_ACTION_ID}
ICON = {"live": "🔴", "convicted": "⚖️", "exonerated": "✅", "untested": "⚪"}
HELD_ICON = {"PENDING": "⏳", "SUSPENDED": "⏸"}
DECISIONS_HEAD = "decisions (owner calls: questions only the campaign's owners answer; nothing runs until they do):"
OWNER_CALL_WORDS = ("A decision babysit does not take itself: one of the campaign's owners answers it (a button "
                    "in Slack); until then nothing runs.")


def suspect_lines(suspects: Sequence[Mapping[str, Any]]) -> list[str]:
    """One line a suspect: status, and which run's verdict set it (or "declared"); then each move that
    does not count, pending on a parent or suspended (docs/campaigns.md)."""
    width = max((len(str(s["name"])) for s in suspects), default=8)
    out = []
    for s in suspects:
        why = f"by {s['by_run']} ({s['by_label']})" if s.get("by_run") else "declared"
        icon = ICON.get(str(s["status"]), "·")
        out.append(f"{icon} {str(s['name']).ljust(width)}  {str(s['status']).ljust(10)}  {why}")
        out += [f"   {HELD_ICON.get(h.split(':', 1)[0], '·')} {h}" for h in s.get("held") or ()]
    return out


def run_lines(runs: Sequence[Mapping[str, Any]]) -> list[str]:
    out = []
    for r in runs:
        read = "no read yet" if r.get("label") is None else (
            f"{r['label']} Δ {r['delta']:+.4f}" if r.get("delta") is not None else str(r["label"]))
        status = f" ({r['status']})" if r.get("status") and r.get("status") != "FINAL" else ""
        parent = f" ← {r['parent']}" if r.get("parent") else " (baseline)"
        tests = f" tests {r['suspect']}" if r.get("suspect") else ""
        scale = f" · own units ×{r['scale']:.4g}" if r.get("scale") else ""
        out.append(f"• {r['name']}{parent}{tests} [{r['state']}]: {read}{status}{scale}\n    changed: {r['changed']}")
        if r.get("outcome") in ("pending", "suspended"):
            out[-1] += f"\n    {HELD_ICON[r['outcome'].upper()]} outcome {r['outcome'].upper()}: {r.get('outcome_why')}"
    return out


def decision_lines(decisions: Sequence[Mapping[str, Any]]) -> list[str]:
    out = []
    for d in decisions:
        if d.get("decision"):
            when = _utc(d.get("decided_at"))
            out.append(f"• call #{d['call']} ({d['run']}): {d['decision']} by {d['decided_by']} at {when}"
                       + (f" — {d['result']}" if d.get("result") else ""))
        else:
            out.append(f"• call #{d['call']} ({d['run']}): OPEN — {d['question']} [{' / '.join(d['options'])}]")
    return out


def show_text(view: Mapping[str, Any]) -> str:
    """`babysit campaign show NAME`: the suspect table, the runs, the banked references, the decision log."""
    lines = [f"campaign {view['campaign']}: {view['question']}", "", "suspects:"]
    lines += ["  " + line for line in suspect_lines(view["suspects"])]
    if view["banked"]:
        lines += ["", "banked references: " + ", ".join(f"{b['name']} {b['delta']:+.4f}" for b in view["banked"])]
    lines += ["", "runs:"] + (["  " + line for line in run_lines(view["runs"])] or ["  none yet"])
    lines += ["", DECISIONS_HEAD] + (["  " + line for line in decision_lines(view["decisions"])] or ["  none yet"])
    return "\n".join(lines)


def campaign_post(p: Mapping[str, Any]) -> tuple[str, list[dict[str, Any]]]:
    """After a FINAL verdict: the grid's sentence, what moved, what was banked and proposed, the table —
    or, while the run's parent has not settled, that its outcome is pending and on what; or, on an
    instrument-ambiguous parent, that it is suspended and what was withdrawn."""
    outcome = p.get("outcome") or "carry"
    baseline = p.get("baseline") or {}
    if outcome == "pend":
        head = (f"⏳ {p['campaign']}: {p['run']} FINAL {p['label']} — outcome PENDING: nothing moves, is banked or "
                f"proposed until its parent settles; waiting for {baseline.get('why')}")
        done = [f"if it lands usable (FINAL, not AMBIGUOUS-BY-INSTRUMENT) the grid says: {p['sentence']}",
                *_would(p, "PENDING, not done yet")]  # each line says so: quoted alone, none reads as done
        title = f"⏳ {p['campaign']}: {p['run']} → {p['label']} (PENDING)"
    elif outcome == "suspend":
        head = (f"⏸ {p['campaign']}: {p['run']} FINAL {p['label']} — conclusion SUSPENDED: {baseline.get('why')}")
        done = [f"the grid's “{p['sentence']}” does not stand", *_withdrawn(p)]
        title = f"⏸ {p['campaign']}: {p['run']} → {p['label']} (SUSPENDED)"
    else:
        head = f"🧭 {p['campaign']}: {p['run']} FINAL {p['label']} — {p['sentence']}"
        done = [f"suspect {suspect} → {status}" for suspect, status in p.get("moves") or ()]
        bank = p.get("bank")
        if bank:
            done.append(f"banked {bank['files']} file(s), {bank['bytes']} bytes to {bank['dest']} (manifest sha256 "
                        "verified)" if bank.get("ok") else f"NOT banked: {bank.get('error')}")
        for kind, path in (p.get("proposals") or {}).items():
            done.append(f"proposed ({kind}): {path} — not launched; an owner call follows")
        if baseline.get("parent"):
            done.append(f"read against: {baseline.get('why')}")
        title = f"🧭 {p['campaign']}: {p['run']} → {p['label']}"
    table = "\n".join(suspect_lines(p.get("suspects") or ()))
    same = p.get("table_as_in")  # the campaign's previous post showed this very table: said, not repeated
    shown = f"suspects: unchanged since {same}'s post (`babysit campaign show {p['campaign']}`)" if same else None
    text = "\n".join([head, *(f"  {d}" for d in done), *([shown] if shown else ["suspects:", table])])
    if p.get("chart_path"):
        text += f"\nsaga chart: {p['chart_path']}"
    elif p.get("chart_error"):
        text += f"\nsaga chart: not drawn ({p['chart_error']})"
    blocks = [header(title[:150]), section(head if outcome != "carry" else f"*grid:* {p['sentence']}")]
    if done:
        blocks.append(section("\n".join(f"• {d}" for d in done)))
    blocks.append(section(shown if shown else "*suspects:*\n" + code(table)))
    blocks.append(context(f"`/babysit campaign {p['campaign']}` shows the table · docs/campaigns.md"))
    return text, blocks


def _would(p: Mapping[str, Any], when: str) -> list[str]:
    out = [f"{when}: suspect {suspect} → {status}" for suspect, status in p.get("moves") or ()]
    would = p.get("would") or {}
    if would.get("bank_to"):
        out.append(f"{when}: bank the checkpoints to {would['bank_to']}")
    out += [f"{when}: propose {what}" for what in would.get("proposals") or ()]
    return out


def _withdrawn(p: Mapping[str, Any]) -> list[str]:
    w = p.get("withdrawn") or {}
    if not w:
        return ["nothing was moved, banked or proposed on it", *_would(p, "not done")]
    out = [f"withdrawn: suspect {suspect} → {status} (it no longer counts)" for suspect, status in w.get("moves") or ()]
    out += [f"banked earlier to {dest}: not load-bearing (kept, not deleted)" for dest in w.get("banked") or ()]
    out += [f"proposed earlier: {path} — do not launch it on this baseline" for path in w.get("proposed") or ()]
    out += [f"owner call #{c} closed (held by babysit)" for c in w.get("calls_closed") or ()]
    out += [f"owner call #{d['call']} was already answered ({d['decision']} by {d['by']}): what it launched stands "
            "on a suspended conclusion" for d in w.get("calls_decided") or ()]
    return out


def table_reply(view: Mapping[str, Any]) -> tuple[str, list[dict[str, Any]]]:
    """`/babysit campaign NAME` in Slack."""
    text = show_text(view)
    table = "\n".join(suspect_lines(view["suspects"]))
    runs = "\n".join(run_lines(view["runs"])) or "none yet"
    decisions = "\n".join(decision_lines(view["decisions"])) or "none yet"
    blocks = [header(f"🧭 campaign {view['campaign']}"), section(f"*question:* {view['question']}"),
              section("*suspects:*\n" + code(table)), section("*runs:*\n" + runs),
              section("*decisions:*\n" + decisions)]
    return text, blocks


def campaigns_reply(names: Sequence[str]) -> tuple[str, list[dict[str, Any]]]:
    if not names:
        text = "No campaign is registered: `babysit campaign register CAMPAIGN.toml` on the babysat host adds one."
    else:
        text = "Campaigns: " + ", ".join(f"`{n}`" for n in names) + " — `/babysit campaign NAME` shows one."
    return text, [section(text)]


def _utc(at: float | None) -> str:
    if at is None:
        return "—"
    return datetime.fromtimestamp(at, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def render_call(p: Mapping[str, Any]) -> tuple[str, list[dict[str, Any]]]:
    """The owner-call post: the question, the proposals, one button an option."""
    owners = " ".join(f"<@{u}>" for u in p.get("owners") or ())
    head = f"🙋 owner call #{p['call_id']} — {p['campaign']}: {p['run']} FINAL {p['label']}"
    lines = [head, OWNER_CALL_WORDS, f"question: {p['question']}"]
    for kind, path in (p.get("proposals") or {}).items():
        lines.append(f"{kind}: {path} (written, not launched)")
    lines.append("answer: " + " / ".join(p.get("options") or ()) + " — only the campaign's owners can; nothing "
                 "launches without it")
    buttons = []
    for option in p.get("options") or ():
        button: dict[str, Any] = {"type": "button", "action_id": ACTION_IDS[option], "value": str(p["call_id"]),
                                  "text": plain({LAUNCH: "Launch the proposal", EXTEND: "Extend the run",
                                                 HOLD: "Hold"}[option])}
        if option == LAUNCH:
            button["style"] = "primary"
        if option in (LAUNCH, EXTEND):
            button["confirm"] = {"title": plain("Launch a run?"), "confirm": plain("Launch it"),
                                 "deny": plain("Cancel"),
                                 "text": {"type": "mrkdwn", "text": f"Register {option} of *{p['run']}*: the "
                                          "daemon launches it and it spends GPU-hours."}}
        buttons.append(button)
    blocks = [header(head[:150]), section(f"{OWNER_CALL_WORDS}\n*question:* {p['question']}"
                                          + (f"\n{owners}" if owners else ""))]
    proposals = [f"• *{k}*: `{v}`" for k, v in (p.get("proposals") or {}).items()]
    if proposals:
        blocks.append(section("*written, not launched:*\n" + "\n".join(proposals)))
    blocks.append(actions_block(*buttons, block_id=f"babysit_owner_call_{p['call_id']}"))
    blocks.append(context("Only the campaign's owners can answer; the decision, who and when go to the "
                          "campaign's history (docs/campaigns.md)."))
    return "\n".join(lines), blocks
