"""`babysit up`: the daemon."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from babysit.watch import Watcher


def add_parser(sub: argparse._SubParsersAction) -> None:
    from babysit.cli import add_registry_option

    p = sub.add_parser("up", help="run the daemon: launch registered runs and babysit them",
                       description="Launch every registered run that is not finished and babysit it: polls, "
                                   "guards, retries, verdicts, messages. Ctrl-C stops the daemon, not the runs; "
                                   "a restarted daemon re-adopts them. On a terminal it shows a live table of "
                                   "every run (step, s/step, ETA, GPU, last incident, verdict) with messages and "
                                   "warnings printed above it; otherwise a line per run whenever it changes.")
    p.add_argument("--accelerated", action="store_true",
                   help="declared minutes become seconds (demos and tests)")
    p.add_argument("--exit-when-idle", action="store_true",
                   help="return once no run is running, pending or retrying and every message is delivered")
    p.add_argument("--bot", action="store_true", help="host the Slack bot in-process (Socket Mode or --bot-http)")
    p.add_argument("--bot-http", type=int, metavar="PORT", help="with --bot: serve slash commands over HTTP")
    p.add_argument("--gpu-probe", default=None, metavar="nvml|file:PATH|none",
                   help="where GPU readings come from (default: $BABYSIT_GPU_PROBE or nvml)")
    p.add_argument("--no-view", action="store_true",
                   help="no live table and no progress lines: only messages and warnings")
    p.add_argument("--web", type=int, metavar="PORT",
                   help="also serve the read-only web page and /metrics on PORT (docs/web.md); its failure is "
                        "logged and never stops babysitting")
    p.add_argument("--web-bind", default="127.0.0.1", metavar="ADDR",
                   help="with --web: the address (default 127.0.0.1; another needs BABYSIT_WEB_TOKEN)")
    add_registry_option(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from babysit import logs, registry
    from babysit.daemon import Daemon
    from babysit.notify import open_channel
    from babysit.probes.gpu import open_gpu_probe

    path = registry.resolve_registry_path(args.registry)
    reg = registry.load(path)
    web_settings = None
    if args.web is not None:  # a bind without its token is bad input (exit 2) before anything starts
        from babysit.web.server import settings_for

        web_settings = settings_for(args.web_bind, args.web)
    watcher = None if args.no_view else _start_view(path, reg.state_dir, args.accelerated)
    # With the live table up, console lines (messages, warnings) go through the stream that prints
    # above it; without it, stdout and stderr as always. daemon.log gets everything either way.
    out = watcher.view.out if watcher is not None and watcher.view.live else None
    ok = False
    try:
        logs.configure(reg.state_dir, stream=out)
        probe = open_gpu_probe(args.gpu_probe)
        daemon = Daemon(path, gpu_probe=probe, channel=open_channel(reg.state_dir, out),
                        accelerated=args.accelerated, exit_when_idle=args.exit_when_idle)
        if args.bot:
            from bot.app import start_in_background

            start_in_background(path, http_port=args.bot_http)
        web = _start_web(path, web_settings, out) if web_settings is not None else None
        try:
            code = daemon.run()
        finally:
            if web is not None:
                web.stop()
        ok = True
        return code
    finally:
        if watcher is not None:
            watcher.stop(erase=not ok)  # refused (another daemon holds the state): no table left behind


def _start_web(path: Path, settings: Any, out: Any) -> Any:
    """The web server in a thread of the daemon; any failure to start it is a warning, never a stop."""
    import structlog

    log = structlog.get_logger("babysit.web")
    try:
        from babysit.web.server import WebServer

        server = WebServer(path, settings).start()
    except Exception as exc:  # a port in use, aiohttp missing: babysitting goes on without the page
        log.warning("web server not started; babysitting goes on without it", port=settings.port,
                    error=f"{type(exc).__name__}: {exc}", hint="pick another --web PORT; docs/web.md")
        return None
    log.info("web page up", url=server.url, read_only=True)
    print(f"babysit web: serving {server.url} (read-only)", file=out or sys.stdout, flush=True)
    return server


def _start_view(path: Path, state_dir: Path, accelerated: bool) -> Watcher:
    """The live table on a terminal (every 2 s), else a line per change (checked every declared minute)."""
    from babysit.watch import Watcher, open_view

    view = open_view(sys.stdout)
    live = sys.stdout.isatty()
    # not a terminal (nohup, a service's journal): a line per changed run at most every 5 minutes; each
    # look reads every run's newest records, the largest cost of a daemon babysitting a few runs if it
    # came every minute (bench/README.md, Daemon overhead); `status --watch` shows more, from elsewhere
    interval = (1.0 if accelerated else 2.0) if live else (1.0 if accelerated else 300.0)
    footer = f"babysit up · {state_dir} · Ctrl-C stops the daemon, not the runs · log: {state_dir / 'daemon.log'}"
    watcher = Watcher(path, view, interval=interval, footer=footer)
    watcher.start()
    return watcher
