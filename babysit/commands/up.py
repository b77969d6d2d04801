"""`babysit up`: the daemon."""

from __future__ import annotations

import argparse
import os
import sys
import threading
from pathlib import Path
from typing import Any

import structlog

from babysit.channels.notify import Channel, ConsoleChannel
from babysit.db.url import store_url
from babysit.probes.gpu import open_gpu_probe
from babysit.runtime import logs, registry
from babysit.service.daemon import Daemon
from babysit.slack.channel import SlackChannel
from babysit.view.watch import Watcher, open_view
from babysit.web.server import WebServer, settings_for
from bot.app import APP_TOKEN_ENV, start_in_background


def run(args: argparse.Namespace) -> int:
    path = registry.resolve_registry_path(args.registry)
    reg = registry.load(path)
    web_settings = None
    if args.web is not None:  # a bind without its token is bad input (exit 2) before anything starts
        web_settings = settings_for(args.web_bind, args.web)
    watcher = None if args.no_view else _start_view(path, reg.state_dir, args.accelerated)
    # With the live table up, console lines (messages, warnings) go through the stream that prints
    # above it; without it, stdout and stderr as always. daemon.log gets everything either way.
    out = watcher.view.out if watcher is not None and watcher.view.live else None
    ok = False
    try:
        logs.configure(reg.state_dir, stream=out, hide_posted=not slack_configured())  # each event shown once
        probe = open_gpu_probe(args.gpu_probe)
        # a fleet's Socket Mode bot opens only on the box holding the gateway lease (docs/fleet.md): one
        # connection for Slack to deliver each command to; one box, or the HTTP Request URL: as always
        # (without an app token no Socket Mode can open: the lease is not taken from a box that could)
        gate = (BotGate(path) if args.bot and args.bot_http is None and store_url(reg)
                and os.environ.get(APP_TOKEN_ENV) else None)
        daemon = Daemon(path, gpu_probe=probe, channel=open_channel(reg.state_dir, out, reg),
                        accelerated=args.accelerated, exit_when_idle=args.exit_when_idle,
                        on_gateway=gate.want if gate is not None else None,
                        report_probe=lambda: open_gpu_probe(args.gpu_probe, health_events=False))
        if args.bot and gate is None:
            start_in_background(path, http_port=args.bot_http)
        web = _start_web(path, web_settings, out) if web_settings is not None else None
        try:
            code = daemon.run()
        finally:
            if web is not None:
                web.stop()
            if gate is not None:
                gate.close()
        ok = True
        return code
    finally:
        if watcher is not None:
            watcher.stop(erase=not ok)  # refused (another daemon holds the state): no table left behind


class BotGate:
    """The Socket Mode bot of a fleet's box, opened while the box holds the gateway lease and closed when
    it loses it. The fleet thread only says what it wants: opening the websocket (which may wait on
    Slack) happens on this gate's thread, so a slow Slack never delays a lease renewal."""

    def __init__(self, registry_path: Path) -> None:
        self.registry_path = registry_path
        self._wanted = False
        self._closed = False
        self._bot: Any = None
        self._changed = threading.Condition()
        self._thread = threading.Thread(target=self._loop, name="babysit-bot-gate", daemon=True)
        self._thread.start()

    def want(self, held: bool) -> None:
        with self._changed:
            self._wanted = held
            self._changed.notify()

    def close(self) -> None:
        with self._changed:
            self._closed = True
            self._changed.notify()
        self._thread.join(timeout=10)

    def _loop(self) -> None:
        while True:
            with self._changed:
                while not self._closed and self._wanted == (self._bot is not None):
                    self._changed.wait()
                wanted = self._wanted and not self._closed
            if wanted and self._bot is None:
                self._bot = start_in_background(self.registry_path)
                if self._bot is None:  # not startable (a token missing): said in the log; not retried
                    return
            elif not wanted and self._bot is not None:
                self._bot.stop()
                self._bot = None
            if self._closed and self._bot is None:
                return


def _start_web(path: Path, settings: Any, out: Any) -> Any:
    """The web server in a thread of the daemon; any failure to start it is a warning, never a stop."""
    log = structlog.get_logger("babysit.web")
    try:
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


def slack_configured() -> bool:
    return bool(os.environ.get("SLACK_BOT_TOKEN"))


def open_channel(state_dir: Path, stream: Any = None, reg: registry.Registry | None = None) -> Channel:
    """Slack when SLACK_BOT_TOKEN is set, else the console channel. The Slack channel reads the box's
    store (a launch post re-rendered under a header update): on a fleet's box (`reg` names a PostgreSQL)
    the daemon's own, given when the daemon opens it (its mirror answers while the database is down)."""
    if slack_configured():
        return SlackChannel.from_env(state_dir, fleet=reg is not None and store_url(reg) is not None)
    return ConsoleChannel(state_dir, stream)
