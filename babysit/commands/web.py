"""`babysit web [--port 8765] [--bind 127.0.0.1]`: a read-only page of every run, and /metrics (docs/web.md)."""

from __future__ import annotations

import argparse

from babysit.core.errors import BadInput
from babysit.runtime import registry
from babysit.web.server import WebServer, settings_for


def run(args: argparse.Namespace) -> int:
    path = registry.resolve_registry_path(args.registry)
    registry.load(path)  # a broken babysit.toml is refused here, by field, not on the first page
    settings = settings_for(args.bind, args.port, refresh_s=args.refresh)
    try:
        server = WebServer(path, settings).start()
    except OSError as exc:
        raise BadInput(f"--bind {args.bind} --port {args.port}: cannot listen: {exc.strerror or exc}",
                       hint="another process holds the port: pick another with --port, or --port 0 for any free one")
    print(f"babysit web: serving {server.url} (read-only{', token required' if settings.token else ''}; "
          "Ctrl-C stops it)", flush=True)
    try:
        server.wait()
    except KeyboardInterrupt:
        server.stop()
    return 0


