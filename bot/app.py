"""The Slack bot on slack_bolt: `/verdict`, `/babysit …` and the abort button, over HTTP or Socket Mode.

`build_app` wires listeners to bot/handlers.py; `App.dispatch` needs no HTTP, so the transports are
thin: bot/http.py for `--http PORT`, bot/socket_mode.py for `--socket` (Bolt's SocketModeHandler,
each envelope handled once; outbound websocket only — the right default for a GPU box behind a
firewall). `start_in_background` is what
`babysit up --bot` calls to host the bot inside the daemon; `babysit bot` runs it alone against
the same registry and state. The daemon itself never imports this module's dependencies.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog

from babysit.core.errors import BabysitError, BadInput
from babysit.slack.client import TOKEN_ENV, web_client
from bot import handlers, owner_calls
from bot.context import BotConfig
from bot.http import make_server, serve_in_thread
from bot.messages import ABORT_ACTION_ID
from bot.predicates import parse_babysit, parse_verdict
from bot.reads import close_readers
from bot.socket_mode import connect_in_background, connect_now, socket_handler

log = structlog.get_logger("babysit.bot")

SIGNING_SECRET_ENV = "SLACK_SIGNING_SECRET"
APP_TOKEN_ENV = "SLACK_APP_TOKEN"


def build_app(cfg: BotConfig, *, socket_mode: bool = False, client: Any = None) -> Any:
    """A Bolt App on babysit's client factory (so BABYSIT_SLACK_API_URL applies) with every listener."""
    from slack_bolt import App


    if not os.environ.get(TOKEN_ENV):
        raise BadInput(f"{TOKEN_ENV} is not set: the bot needs the app's bot token (xoxb-…)",
                       hint="export it from the Slack app's OAuth page; docs/slack.md has the manifest")
    secret = os.environ.get(SIGNING_SECRET_ENV)
    if not socket_mode and not secret:
        raise BadInput(f"{SIGNING_SECRET_ENV} is not set: HTTP mode must verify that requests come from Slack",
                       hint="export the app's signing secret (Basic Information page), or use --socket")
    app = App(client=client or web_client(retries=True), signing_secret=secret or "",
              request_verification_enabled=not socket_mode, token_verification_enabled=False,
              process_before_response=False)
    register(app, cfg)
    return app


def register(app: Any, cfg: BotConfig) -> None:
    @app.command("/babysit")
    def babysit_command(ack: Any, command: dict[str, Any], respond: Any, client: Any) -> None:
        handlers.babysit(cfg, parse_babysit(command.get("text")), command, ack, respond, client)

    @app.command("/verdict")
    def verdict_command(ack: Any, command: dict[str, Any], respond: Any) -> None:
        handlers.verdict(cfg, parse_verdict(command.get("text")), command, ack, respond)

    @app.action(ABORT_ACTION_ID)
    def abort_clicked(ack: Any, body: dict[str, Any], respond: Any) -> None:
        handlers.abort_confirmed(cfg, body, ack, respond)

    owner_calls.register(app, cfg)  # launch / extend / hold on a campaign's owner call (docs/campaigns.md)


@dataclass
class RunningBot:
    """A started bot: `stop()` ends its transport (the HTTP server or the websocket)."""

    mode: str
    port: int | None
    _stop: Any

    def stop(self) -> None:
        self._stop()


def start(cfg: BotConfig, *, http_port: int | None = None, host: str = "0.0.0.0",
          keep_trying: bool = False) -> RunningBot:
    """Start serving in background threads and return at once.

    Socket Mode: `keep_trying` (the daemon's bot) keeps trying to connect while Slack is unreachable;
    without it (`babysit bot`, run by a person) a failed first connection is an error that says why.
    """
    if http_port is not None:

        server = make_server(build_app(cfg), host, http_port)
        serve_in_thread(server)
        port = server.server_address[1]
        log.info("slack bot serving", mode="http", port=port, path="/slack/events")
        return RunningBot("http", port, lambda: (server.shutdown(), server.server_close(), close_readers()))
    app_token = os.environ.get(APP_TOKEN_ENV)
    if not app_token:
        raise BadInput(f"{APP_TOKEN_ENV} is not set: Socket Mode needs the app-level token (xapp-…)",
                       hint="create one with the connections:write scope (Basic Information → App-Level "
                            "Tokens), or serve HTTP with --http PORT")

    stop = threading.Event()
    handler = socket_handler(build_app(cfg, socket_mode=True), app_token, stop)
    if keep_trying:
        connect_in_background(handler, stop)
    else:
        connect_now(handler)
    return RunningBot("socket", None, lambda: (stop.set(), handler.close(), close_readers()))


def start_in_background(registry_path: Path, http_port: int | None = None) -> RunningBot | None:
    """For `babysit up --bot [--bot-http PORT]`: the bot inside the daemon. A bot that cannot start is
    logged and skipped — the daemon babysits on without it (messages still go out through the outbox)."""

    try:
        return start(BotConfig(Path(registry_path)), http_port=http_port, keep_trying=True)
    except BabysitError as exc:
        log.error("slack bot not started", error=exc.message, hint=exc.hint)
    except Exception as exc:  # a Socket Mode connection refused at startup must not take the daemon down
        log.error("slack bot not started", error=f"{type(exc).__name__}")
    return None
