"""`babysit abort RUN`: ask the daemon to stop a run gracefully (SIGTERM, grace, SIGKILL)."""

from __future__ import annotations

import argparse
import getpass
import time


def add_parser(sub: argparse._SubParsersAction) -> None:
    from babysit.cli import add_registry_option

    p = sub.add_parser("abort", help="stop a run gracefully (the trainer checkpoints); no retry follows")
    p.add_argument("run", metavar="RUN")
    p.add_argument("--wait", type=float, default=10.0, metavar="SECONDS",
                   help="how long to wait for the daemon to take the request (default 10)")
    add_registry_option(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from babysit import registry
    from babysit.store import Store

    reg = registry.load(registry.resolve_registry_path(args.registry))
    reg.get(args.run)
    store = Store.in_dir(reg.state_dir)
    request = store.request(args.run, "abort", f"cli:{getpass.getuser()}", time.time())
    deadline = time.monotonic() + args.wait
    while time.monotonic() < deadline:
        result = store.request_result(request)
        if result is not None:
            print(f"abort {args.run}: {result}")
            return 0 if result in ("stopping", "not running") else 1
        time.sleep(0.2)
    print(f"abort {args.run}: queued (request {request}); no daemon took it within {args.wait:g}s — "
          "it runs when `babysit up` does")
    return 0
