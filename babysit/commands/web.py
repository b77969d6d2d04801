"""`babysit web [--port 8765] [--bind 127.0.0.1]`: a read-only page of every run, and /metrics (docs/web.md)."""

from __future__ import annotations

import argparse


def add_parser(sub: argparse._SubParsersAction) -> None:
    from babysit.cli import add_registry_option, positive_seconds

    p = sub.add_parser("web", help="serve a read-only web page of runs, curves and verdicts, and /metrics",
                       description="Serve the runs table (refreshing itself), a page a run (its curve against the "
                                   "frozen bands, incidents, attempts, verdict, pre-registration) and /metrics for "
                                   "Prometheus, read from the state database. Read-only; works with or without a "
                                   "daemon. Binds 127.0.0.1; any other --bind needs BABYSIT_WEB_TOKEN (docs/web.md).")
    p.add_argument("--port", type=int, default=8765, help="TCP port (default 8765; 0: any free port, printed)")
    p.add_argument("--bind", default="127.0.0.1", metavar="ADDR",
                   help="address to listen on (default 127.0.0.1; another needs BABYSIT_WEB_TOKEN)")
    p.add_argument("--refresh", type=positive_seconds, default=2.0, metavar="S",
                   help="seconds between re-reads of a page a browser is watching (default 2)")
    add_registry_option(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from babysit import registry
    from babysit.web.server import WebServer, settings_for

    path = registry.resolve_registry_path(args.registry)
    registry.load(path)  # a broken babysit.toml is refused here, by field, not on the first page
    settings = settings_for(args.bind, args.port, refresh_s=args.refresh)
    try:
        server = WebServer(path, settings).start()
    except OSError as exc:
        from babysit.core.errors import BadInput

        raise BadInput(f"--bind {args.bind} --port {args.port}: cannot listen: {exc.strerror or exc}",
                       hint="another process holds the port: pick another with --port, or --port 0 for any free one")
    print(f"babysit web: serving {server.url} (read-only{', token required' if settings.token else ''}; "
          "Ctrl-C stops it)", flush=True)
    try:
        server.wait()
    except KeyboardInterrupt:
        server.stop()
    return 0


