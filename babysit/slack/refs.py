"""How a Slack post is tied to its outbox message: the message's metadata and the "CHANNEL:TS" ref.

The daemon's channel writes both and reads them back after a crash (was this message already
posted?); the bot reads the refs to answer in a run's thread.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

OUTBOX_EVENT = "babysit_outbox"


def is_outbox_post(message: Mapping[str, Any], outbox_id: int) -> bool:
    """Is this Slack message the post of outbox message `outbox_id`? (its metadata says so)"""
    meta = message.get("metadata") or {}
    payload = meta.get("event_payload") or {}
    return meta.get("event_type") == OUTBOX_EVENT and str(payload.get("id")) == str(outbox_id)


def split_ref(ref: str | None) -> tuple[str, str] | None:
    """A Slack remote_ref is "CHANNEL:TS"; anything else (a console ref, None) is not a Slack post."""
    if not ref or ref.count(":") != 1:
        return None
    channel, ts = ref.split(":")
    if not channel or ts.count(".") != 1 or not ts.replace(".", "").isdigit():  # Slack ts: "1712345678.000100"
        return None
    return channel, ts


def make_ref(channel: str, ts: str) -> str:
    return f"{channel}:{ts}"
