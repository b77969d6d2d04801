"""Block Kit element builders: plain dicts, no Slack imports, limits enforced where Slack would refuse.

Kept apart from `bot/messages.py` so that module holds only what babysit *says*, not how a
section dict is shaped.
"""

from __future__ import annotations

from typing import Any

SECTION_MAX = 2900  # Slack refuses a section text over 3000 characters
HEADER_MAX = 150  # ...and a header block's plain text over 150
BUTTON_TEXT_MAX = 75

Block = dict[str, Any]


def section(text: str) -> Block:
    if len(text) > SECTION_MAX:
        text = text[:SECTION_MAX] + "\n…(cut here; the plain-text fallback has all of it)"
    return {"type": "section", "text": {"type": "mrkdwn", "text": text or " "}}


def header(text: str) -> Block:
    return {"type": "header", "text": {"type": "plain_text", "text": text[:HEADER_MAX], "emoji": True}}


def context(text: str) -> Block:
    return {"type": "context", "elements": [{"type": "mrkdwn", "text": text[:SECTION_MAX] or " "}]}


def divider() -> Block:
    return {"type": "divider"}


def code(text: str) -> str:
    """A Slack code block; a fence inside the text would end it early, so it is broken up."""
    fence = "`" * 3
    return fence + text.replace(fence, "'" * 3) + fence


def plain(text: str) -> dict[str, Any]:
    return {"type": "plain_text", "text": text, "emoji": True}


def confirm_button(*, action_id: str, text: str, value: str, title: str, question: str, yes: str,
                   no: str = "Cancel") -> Block:
    """A danger button behind Slack's own confirmation dialog: two deliberate clicks, never one."""
    return {
        "type": "button", "action_id": action_id, "style": "danger", "value": value,
        "text": plain(text[:BUTTON_TEXT_MAX]),
        "confirm": {"title": plain(title[:100]), "text": {"type": "mrkdwn", "text": question[:300]},
                    "confirm": plain(yes[:30]), "deny": plain(no[:30]), "style": "danger"},
    }


def actions(*elements: Block, block_id: str | None = None) -> Block:
    block: Block = {"type": "actions", "elements": list(elements)}
    if block_id:
        block["block_id"] = block_id
    return block
