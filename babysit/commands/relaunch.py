"""`babysit relaunch RUN`: run an ended run again, its run.toml re-read (docs/spec.md, Relaunching)."""

from __future__ import annotations

import argparse
import getpass
import sys
import time

from babysit.commands.register import say
from babysit.db.url import open_store
from babysit.register import relaunch
from babysit.runtime import registry


def run(args: argparse.Namespace) -> int:
    path = registry.resolve_registry_path(args.registry)
    prepared = relaunch.prepare(path, args.run, accelerated=args.accelerated)
    done = prepared.registration
    say(done)
    for text in prepared.warnings[len(done.warnings):]:
        print(f"WARNING: {text}", file=sys.stderr)
    for c in done.changed:
        print(f"  {c}")
    print(f"relaunching {args.run} after attempt {prepared.after}: run.toml re-read"
          + (f" ({len(done.changed)} field(s) changed since the last register)" if done.changed else "")
          + f"; {prepared.gpu_hours_used:.2f} of {done.spec.guards.gpu_hours_cap:g} GPU-hours used so far")
    reg = registry.load(path)
    request = relaunch.request(reg, args.run, f"cli:{getpass.getuser()}", resume=args.resume)
    store = open_store(reg)  # the configured store (a fleet's PostgreSQL), where the daemon answers
    try:
        deadline = time.monotonic() + args.wait
        while time.monotonic() < deadline:
            result = store.request_result(request)
            if result is not None:
                print(f"relaunch {args.run}: {result}")
                return 0 if result.startswith("launched") else 1
            time.sleep(0.2)
    finally:
        store.close()
    print(f"relaunch {args.run}: queued (request {request}); no daemon took it within {args.wait:g}s — "
          "it runs when `babysit up` does")
    return 0
