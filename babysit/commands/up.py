"""`babysit up`: the daemon."""

from __future__ import annotations

import argparse
import os


def add_parser(sub: argparse._SubParsersAction) -> None:
    from babysit.cli import add_registry_option

    p = sub.add_parser("up", help="run the daemon: launch registered runs and babysit them",
                       description="Launch every registered run that is not finished and babysit it: polls, "
                                   "guards, retries, verdicts, messages. Ctrl-C stops the daemon, not the runs; "
                                   "a restarted daemon re-adopts them.")
    p.add_argument("--accelerated", action="store_true",
                   help="declared minutes become seconds (demos and tests)")
    p.add_argument("--exit-when-idle", action="store_true",
                   help="return once no run is running, pending or retrying and every message is delivered")
    p.add_argument("--bot", action="store_true", help="host the Slack bot in-process (Socket Mode or --bot-http)")
    p.add_argument("--bot-http", type=int, metavar="PORT", help="with --bot: serve slash commands over HTTP")
    p.add_argument("--gpu-probe", default=None, metavar="nvml|file:PATH|none",
                   help="where GPU readings come from (default: $BABYSIT_GPU_PROBE or nvml)")
    add_registry_option(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from babysit import logs, registry
    from babysit.daemon import Daemon
    from babysit.notify import open_channel
    from babysit.probes.gpu import open_gpu_probe

    path = registry.resolve_registry_path(args.registry)
    reg = registry.load(path)
    logs.configure(reg.state_dir)
    probe = open_gpu_probe(args.gpu_probe or os.environ.get("BABYSIT_GPU_PROBE") or "nvml")
    daemon = Daemon(path, gpu_probe=probe, channel=open_channel(reg.state_dir),
                    accelerated=args.accelerated, exit_when_idle=args.exit_when_idle)
    if args.bot:
        from bot.app import start_in_background

        start_in_background(path, http_port=args.bot_http)
    return daemon.run()
