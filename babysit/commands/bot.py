"""`babysit bot`: the Slack bot alone (slash commands and the abort button) against the registry's state.

Socket Mode (`--socket`, SLACK_APP_TOKEN) is the default: it needs only outbound connections, so it
works on a GPU box behind a firewall. `--http PORT` serves Bolt's /slack/events for a host Slack can
reach. bot/app.py imports slack_bolt only when the bot starts.
"""

from __future__ import annotations

import argparse
import sys
import threading

from babysit.runtime import logs, registry
from bot.app import start
from bot.context import BotConfig


def run(args: argparse.Namespace) -> int:
    path = registry.resolve_registry_path(args.registry)
    reg = registry.load(path)
    logs.configure(reg.state_dir)
    cfg = BotConfig(path.resolve(), request_wait_s=args.request_wait)
    bot = start(cfg, http_port=args.http, host=args.host)
    if bot.port is not None:
        print(f"babysit bot: serving http://{args.host}:{bot.port}/slack/events", flush=True)
    else:
        print("babysit bot: connected to Slack over Socket Mode", flush=True)
    stop = threading.Event()
    try:
        stop.wait()
    except KeyboardInterrupt:
        print("babysit bot: stopping", file=sys.stderr)
    finally:
        bot.stop()
    return 0
