"""Pure predicates and parsers over Slack payload dicts: no I/O, no Slack imports, trivially testable.

Bolt hands listeners plain dicts (the slash command's form fields, an action's JSON); every decision
about them — which subcommand, which run, who may abort, is this Slack message our outbox post —
is made here, so handlers stay thin and each rule is tested on its own.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

READ_ONLY = frozenset({"status", "runs", "poll", "chart", "gpus", "help", "campaign"})  # poll asks, never changes a run
SUBCOMMANDS = READ_ONLY | {"abort", "relaunch"}  # these two change a run: allow-listed users only


@dataclass(frozen=True)
class Command:
    """`/babysit WORD [RUN] [rest…]` or `/verdict RUN [post]`, split once."""

    name: str  # "verdict" for /verdict; the subcommand for /babysit ("help" when empty)
    run: str | None
    rest: tuple[str, ...] = ()


def parse_babysit(text: str | None) -> Command:
    words = (text or "").split()
    if not words:
        return Command("help", None)
    return Command(words[0].lower(), words[1] if len(words) > 1 else None, tuple(words[2:]))


def parse_verdict(text: str | None) -> Command:
    words = (text or "").split()
    return Command("verdict", words[0] if words else None, tuple(w.lower() for w in words[1:]))


def wants_post(command: Command) -> bool:
    """`/verdict RUN post` shares the card in the channel; anything else answers only the asker."""
    return "post" in command.rest


def may_abort(user_id: str | None, allow_list: Iterable[str]) -> bool:
    """Only an explicitly listed Slack member ID may abort or relaunch; an empty list means nobody."""
    return bool(user_id) and user_id in set(allow_list)


def close_names(name: str, names: Iterable[str]) -> list[str]:
    return difflib.get_close_matches(name, list(names), n=3, cutoff=0.6)


def user_of(body: Mapping[str, Any]) -> str | None:
    """The acting user of a slash command (`user_id`) or an interaction (`user.id`)."""
    user = body.get("user")
    if isinstance(user, Mapping):
        return user.get("id")
    return body.get("user_id")


def action_value(body: Mapping[str, Any], action_id: str) -> str | None:
    """The value of the clicked button with this action_id, if the payload is that click."""
    for action in body.get("actions") or ():
        if action.get("action_id") == action_id:
            return action.get("value")
    return None


