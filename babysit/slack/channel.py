"""SlackChannel: the daemon's `Channel` on Slack's Web API (slack_sdk's WebClient only, never Bolt).

Where each message goes: a launch post to the run's channel; polls, incidents and provisional reads
threaded under it; `header` edits the launch post in place (chat.update); the FINAL verdict goes to
the channel itself, then its chart is uploaded into the channel and into the launch thread (the three
steps of files_upload_v2, each journalled: babysit/slack/upload.py). Every post carries the outbox id
in its metadata (event_type "babysit_outbox").

Exactly once, across crashes: see babysit/slack/journal.py. A post whose `begin` is journalled but not its
`done` (or an outbox message with tries > 0, i.e. an earlier try may have reached Slack before the
connection broke) is first looked up with conversations.history / conversations.replies from
`created_at - LOOKUP_SKEW_S`, matching the metadata, and its ts reused. If the lookup itself is
refused (missing scope, or a "#name" where Slack wants the channel ID — the journal learns each
name's ID from the first post, so only a channel's very first post can be affected; configure
channel IDs to avoid even that), babysit posts anyway: a duplicate is better than a lost message.

Errors become Transient (429 with its Retry-After, 5xx, network) or Permanent (invalid_auth,
channel_not_found, not_in_channel, …) in babysit/slack/errors.py; their texts never carry a token.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import structlog

from babysit.channels.notify import Delivery
from babysit.core.errors import BabysitError, PermanentDeliveryError
from babysit.core.render import chart_comment, render
from babysit.db.store import OutboxMessage, Store
from babysit.runtime import registry
from babysit.slack.client import web_client
from babysit.slack.errors import NETWORK_ERRORS, delivery_error
from babysit.slack.journal import Journal
from babysit.slack.refs import OUTBOX_EVENT, is_outbox_post, make_ref, split_ref
from babysit.slack.upload import upload_once

log = structlog.get_logger("babysit.slack")

CHANNEL_ENV = "BABYSIT_SLACK_CHANNEL"
LOOKUP_SKEW_S = 300.0  # our clock vs Slack's: look this far before created_at
LOOKUP_PAGES = 5


class SlackChannel:
    name = "slack"

    def __init__(self, client: Any, state_dir: Path, *, default_channel: str | None = None,
                 store: Store | None = None) -> None:
        self.client = client
        self.default_channel = default_channel
        self.store = store  # to re-render the launch post under a header update
        self.journal = Journal(Path(state_dir) / "slack_journal.jsonl")

    @classmethod
    def from_env(cls, state_dir: Path, store: Store | None = None, *, fleet: bool = False) -> SlackChannel:
        """SLACK_BOT_TOKEN and BABYSIT_SLACK_API_URL from the environment; the default channel from
        BABYSIT_SLACK_CHANNEL, else `[daemon].channel` of the registry whose state this is. `store`: the
        box's; none: the state directory's SQLite, or, on a fleet's box (`fleet`), the daemon's store,
        given by `read_from` when the daemon opens it."""

        if store is None and not fleet:
            store = Store.in_dir(state_dir)
        return cls(web_client(), state_dir, default_channel=_default_channel(Path(state_dir)), store=store)

    def read_from(self, store: Store) -> None:
        """Re-render launch posts from the daemon's own store: on a fleet's box its journaled one, which
        answers from the local mirror while PostgreSQL is down (a store of the channel's own would fail
        then, and hold up every run's posts behind a header update until the database is back)."""
        self.store = store

    # -- Channel ---------------------------------------------------------------------------------------
    def deliver(self, delivery: Delivery) -> str | None:
        from slack_sdk.errors import SlackApiError, SlackRequestError

        method = "chat.update" if delivery.message.kind == "header" else "chat.postMessage"
        try:
            if delivery.message.kind == "header":
                return self._update(delivery)
            ref = self._post(delivery)
            m = delivery.message
            if m.kind == "launch":
                self.journal.done(f"launch:{m.run}", ref)
            if m.kind in ("verdict", "campaign") and m.payload.get("chart_path"):  # campaign: the saga chart
                method = "files_upload_v2"
                self._upload_charts(m, ref)
            return ref
        except (SlackApiError, SlackRequestError, *NETWORK_ERRORS) as exc:
            raise delivery_error(exc, method) from None  # no chained request: its headers hold the token

    # -- posts -----------------------------------------------------------------------------------------
    def _post(self, delivery: Delivery) -> str:
        m = delivery.message
        key = f"post:{m.id}"
        known = self.journal.ref(key)
        if known is not None:
            return known  # posted before a crash; the outbox just never heard
        thread = split_ref(delivery.thread_ref)
        channel, thread_ts = thread if thread else (self._channel_for(m), None)
        if self.journal.began(key) or m.tries > 0:
            found = self._find_posted(m, self.journal.ref(f"channel:{channel}") or channel, thread_ts)
            if found is not None:
                self.journal.done(key, found)
                log.info("reused an earlier post", message=m.id, run=m.run, ref=found)
                return found
        rendered = render(m.kind, m.payload)
        self.journal.begin(key)
        resp = self.client.chat_postMessage(
            channel=channel, text=rendered.text, blocks=rendered.blocks or None, thread_ts=thread_ts,
            unfurl_links=False, unfurl_media=False,
            metadata={"event_type": OUTBOX_EVENT, "event_payload": {"id": m.id, "run": m.run}})
        ref = make_ref(resp["channel"], resp["ts"])
        self.journal.done(key, ref)
        if resp["channel"] != channel and self.journal.ref(f"channel:{channel}") != resp["channel"]:
            self.journal.done(f"channel:{channel}", resp["channel"])  # history lookups need the ID, not "#name"
        return ref

    def _update(self, delivery: Delivery) -> str | None:
        target = split_ref(delivery.update_ref)
        if target is None:
            return None  # the launch post never reached Slack: there is nothing to edit
        m = delivery.message
        payload: Mapping[str, Any] = m.payload
        if self.store is not None and m.thread_of is not None:
            payload = {**payload, "launch": self.store.message(m.thread_of).payload}
        rendered = render("header", payload)
        self.client.chat_update(channel=target[0], ts=target[1], text=rendered.text, blocks=rendered.blocks)
        return delivery.update_ref

    def _channel_for(self, m: OutboxMessage) -> str:
        channel = m.payload.get("channel") or self.default_channel
        if not channel:
            launch = split_ref(self.journal.ref(f"launch:{m.run}"))
            channel = launch[0] if launch else None
        if not channel:
            raise PermanentDeliveryError(
                f"no Slack channel for run {m.run}: set [notify].channel in its run.toml or [daemon].channel "
                "in babysit.toml")
        return channel

    def _find_posted(self, m: OutboxMessage, channel: str, thread_ts: str | None) -> str | None:
        """The ts of our earlier post of `m`, if Slack has it; None when not found or not searchable."""
        from slack_sdk.errors import SlackApiError

        args: dict[str, Any] = {"channel": channel, "oldest": f"{max(0.0, m.created_at - LOOKUP_SKEW_S):.6f}",
                                "include_all_metadata": True, "limit": 200}
        call = self.client.conversations_replies if thread_ts else self.client.conversations_history
        if thread_ts:
            args["ts"] = thread_ts
        try:
            for _ in range(LOOKUP_PAGES):
                resp = call(**args)
                for message in resp.get("messages") or ():
                    if is_outbox_post(message, m.id):
                        return make_ref(resp.get("channel") or channel, message["ts"])
                cursor = (resp.get("response_metadata") or {}).get("next_cursor")
                if not cursor:
                    return None
                args["cursor"] = cursor
        except SlackApiError as exc:
            error = delivery_error(exc, "conversations lookup")
            if isinstance(error, PermanentDeliveryError):
                log.warning("cannot look for an earlier post; posting (a duplicate beats a loss)",
                            message=m.id, error=str(error))
                return None
            raise
        return None

    # -- the verdict chart -----------------------------------------------------------------------------
    def _upload_charts(self, m: OutboxMessage, verdict_ref: str) -> None:
        path = Path(str(m.payload["chart_path"]))
        if not path.is_file():
            log.warning("verdict chart missing; posted without it", run=m.run, chart=str(path))
            return
        targets = [("channel", split_ref(verdict_ref)[0], None)]  # type: ignore[index]
        launch = split_ref(self.journal.ref(f"launch:{m.run}"))
        if launch is not None:
            targets.append(("thread", launch[0], launch[1]))
        comment = chart_comment(m.run, m.payload.get("verdict"))
        for where, channel, thread_ts in targets:  # each step journalled: shared exactly once (upload.py)
            upload_once(self.client, self.journal, f"chart:{m.id}:{where}", path, channel=channel,
                        thread_ts=thread_ts, title=f"{m.run} verdict chart", comment=comment)


def _default_channel(state_dir: Path) -> str | None:
    if os.environ.get(CHANNEL_ENV):
        return os.environ[CHANNEL_ENV]

    try:
        reg = registry.load(registry.resolve_registry_path(None))
    except BabysitError:
        return None
    return reg.daemon.channel if reg.state_dir == Path(os.path.abspath(state_dir)) else None
