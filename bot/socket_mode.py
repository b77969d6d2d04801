"""The Socket Mode transport: Bolt's SocketModeHandler, each envelope handled once, and a daemon's bot that
keeps trying to connect instead of giving up at startup.

Bolt's default adapter (slack_sdk's built-in client) with pings every PING_INTERVAL_S: a `disconnect`
from Slack (refresh_requested, link_disabled, …) opens the new connection before the old one closes; a
socket reset or a silent network is noticed within a few pings and reconnected through a fresh
apps.connections.open URL. One weakness remains in slack_sdk 3.48 (fixed upstream, not released): a
socket that Slack's side closes without a close frame keeps the client's reader busy until its pings
fail, about 5 × PING_INTERVAL_S of one core. (Bolt's websocket-client adapter sees that at once, but
after half of the `disconnect`s it sat 10 s with no connection, and never noticed a silent network.)

Reconnects can lose an ack in flight, and Slack re-sends what it did not see acked: bot/envelopes.py
keeps a command from running twice. The ack is what Bolt's listener acked (bot/handlers.py acks first,
answers slow work through the response_url), so it always leaves within Slack's 3 seconds.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import Any

import structlog

from babysit.core.errors import BabysitError, PermanentDeliveryError
from babysit.slack.errors import delivery_error
from bot.envelopes import EnvelopeLedger, keys_of

log = structlog.get_logger("babysit.bot")

PING_INTERVAL_S = 2.0
RETRY_FIRST_S = 1.0
RETRY_MAX_S = 120.0
APP_TOKEN_HINT = "check SLACK_APP_TOKEN (an xapp-… app-level token with connections:write); docs/slack.md"


class Stopped(Exception):
    """The bot is being stopped: no more connection attempts."""


class OpenBackoff:
    """apps.connections.open, spaced out while it fails.

    While Slack is unreachable the client asks for a new URL at every ping (logging an error each time),
    and apps.connections.open is a Tier 1 method. After a failure the next call waits 1 s, 2 s, 4 s, …
    up to 2 minutes (or until the bot is stopped); a success resets it.
    """

    def __init__(self, open_url: Callable[[], str], stop: threading.Event, first_s: float = RETRY_FIRST_S,
                 max_s: float = RETRY_MAX_S) -> None:
        self.open_url = open_url
        self.stop = stop
        self.first_s = first_s
        self.max_s = max_s
        self.delay = 0.0

    def __call__(self) -> str:
        if self.stop.is_set() or (self.delay and self.stop.wait(self.delay)):
            raise Stopped()
        try:
            url = self.open_url()
        except Exception:
            self.delay = min(self.max_s, max(self.first_s, self.delay * 2))
            raise
        self.delay = 0.0
        return url


def socket_handler(app: Any, app_token: str, stop: threading.Event, ledger: EnvelopeLedger | None = None) -> Any:
    """Bolt's SocketModeHandler, its requests through the ledger, its reconnects backed off; not connected
    yet. Setting `stop` ends its connection attempts."""
    from slack_bolt.adapter.socket_mode import SocketModeHandler

    handler = SocketModeHandler(app, app_token, ping_interval=PING_INTERVAL_S)
    handler.client.issue_new_wss_url = OpenBackoff(handler.client.issue_new_wss_url, stop)
    once = ledger or EnvelopeLedger()
    handler.client.socket_mode_request_listeners[:] = [
        lambda client, req: handle_once(app, once, client, req)]
    return handler


def handle_once(app: Any, ledger: EnvelopeLedger, client: Any, req: Any) -> None:
    """Dispatch a new envelope to Bolt and send its ack; a repeat gets the first ack again, or nothing."""
    from slack_bolt.request import BoltRequest
    from slack_sdk.socket_mode.response import SocketModeResponse

    keys = keys_of(req.envelope_id, req.payload)
    seen = ledger.claim(keys)
    if seen.state == "running":
        log.info("envelope re-sent while its first run is going; dropped", envelope=req.envelope_id, type=req.type)
        return
    if seen.state == "done":
        log.info("envelope re-sent after it was handled; acked again, not run again", envelope=req.envelope_id,
                 type=req.type)
        if seen.acked:
            client.send_socket_mode_response(SocketModeResponse(envelope_id=req.envelope_id,
                                                                payload=dict(seen.ack) if seen.ack else None))
        return
    try:
        response = app.dispatch(BoltRequest(mode="socket_mode", body=req.payload))
    except BaseException:
        ledger.forget(keys)
        raise
    acked, payload = ack_of(response.status, response.body, response.headers)
    ledger.finish(keys, payload, acked)
    if acked:
        client.send_socket_mode_response(SocketModeResponse(envelope_id=req.envelope_id, payload=payload))
    else:
        log.warning("envelope not acked: the bot had no answer", envelope=req.envelope_id, type=req.type,
                    status=response.status)


def ack_of(status: int, body: str | None, headers: Mapping[str, Any]) -> tuple[bool, dict[str, Any] | None]:
    """What Bolt's adapter would ack for a response: (ack at all, the ack's payload)."""
    import json

    if status != 200:
        return False, None
    if not body:
        return True, None
    content_type = (headers.get("content-type") or [""])[0]
    if content_type.startswith("application/json"):
        return True, json.loads(body)
    return True, {"text": body}


def connect_now(handler: Any) -> None:
    """Connect, or raise a BabysitError that says why (for `babysit bot --socket`, run by a person)."""
    try:
        handler.connect()
    except Exception as exc:
        error = delivery_error(exc, "apps.connections.open")
        hint = (APP_TOKEN_HINT if isinstance(error, PermanentDeliveryError)
                else "Slack is unreachable from here: check the network, then start the bot again")
        raise BabysitError(f"the bot cannot open Socket Mode: {error}", hint=hint) from None
    log.info("slack bot connected", mode="socket")


def connect_in_background(handler: Any, stop: threading.Event) -> threading.Event:
    """Connect now, or keep trying from a thread while Slack is unreachable: the daemon babysits on.

    A refused app token (invalid_auth, not_allowed_token_type, …) is not retried; it is logged with
    what to do. Returns an event set once connected; from then on Bolt's adapter reconnects by itself.
    """
    connected = threading.Event()

    def attempt() -> bool | None:
        """True: connected; False: try again (OpenBackoff spaces the tries); None: never."""
        try:
            handler.connect()
        except Stopped:
            return None
        except Exception as exc:
            error = delivery_error(exc, "apps.connections.open")
            if isinstance(error, PermanentDeliveryError):
                log.error("slack bot not started: Slack refused the app-level token", error=str(error),
                          hint=APP_TOKEN_HINT)
                return None
            log.warning("slack bot cannot reach Slack yet; retrying", error=str(error))
            return False
        connected.set()
        log.info("slack bot connected", mode="socket")
        return True

    def keep_trying() -> None:
        while attempt() is False:
            pass

    if attempt() is False:
        threading.Thread(target=keep_trying, name="babysit-bot-connect", daemon=True).start()
    return connected
