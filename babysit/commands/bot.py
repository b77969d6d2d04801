"""`babysit bot`: the Slack bot alone (slash commands and the abort button) against the registry's state.

Socket Mode (`--socket`, SLACK_APP_TOKEN) is the default: it needs only outbound connections, so it
works on a GPU box behind a firewall. `--http PORT` serves Bolt's /slack/events for a host Slack can
reach. slack_bolt is imported inside `run` so `babysit --help` stays fast.
"""

from __future__ import annotations

import argparse
import sys
import threading


def add_parser(sub: argparse._SubParsersAction) -> None:
    from babysit.cli import add_registry_option

    p = sub.add_parser("bot", help="run the Slack bot (slash commands): Socket Mode, or HTTP with --http PORT",
                       description="Answer /verdict and /babysit from the registry's state. Needs SLACK_BOT_TOKEN, "
                                   "and SLACK_APP_TOKEN (Socket Mode) or SLACK_SIGNING_SECRET (HTTP). "
                                   "See docs/slack.md.")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--socket", action="store_true", help="Socket Mode (default): outbound websocket only")
    mode.add_argument("--http", type=int, metavar="PORT",
                      help="serve /slack/events on PORT (0: any free port, printed on stdout)")
    p.add_argument("--host", default="0.0.0.0", help="with --http: the address to bind (default 0.0.0.0)")
    p.add_argument("--request-wait", type=float, default=10.0, metavar="SECONDS",
                   help="how long /babysit poll and abort wait for the daemon's answer (default 10)")
    add_registry_option(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from babysit import logs, registry
    from bot.app import start
    from bot.handlers import BotConfig

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
