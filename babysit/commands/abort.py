"""`babysit abort RUN`: ask the daemon to stop a run gracefully (SIGTERM, grace, SIGKILL)."""

from __future__ import annotations

import argparse
import getpass
import time
from datetime import datetime, timezone

from babysit.core.run_machine import ALREADY_STOPPING
from babysit.core.status import ENDED_STATUSES
from babysit.db.url import fleet_owner, open_existing, open_store
from babysit.runtime import registry
from babysit.runtime.registry import utc_timestamp
from babysit.view import runview


def run(args: argparse.Namespace) -> int:
    reg = registry.load(registry.resolve_registry_path(args.registry))
    if not _in_fleet(reg, args.run):  # a fleet: any box may ask for any box's run (its box carries it out)
        reg.get(args.run)  # an unknown run: exit 2, the registered runs listed
    over = ended(reg, args.run)
    if over is not None:  # nothing will take a request for a run that is over: say so now, not in 10 s
        print(f"{args.run} {over}; nothing to abort")
        return 0
    store = open_store(reg)
    request = store.request(args.run, "abort", f"cli:{getpass.getuser()}", time.time())
    away = runview.box_away(store, args.run)
    if away is not None:  # no daemon answers before that box is back: say so now, with its staleness
        box, staleness = away
        print(f"abort {args.run}: queued (request {request}) for box {box}, out of sight now ({staleness}); "
              f"it is carried out when box {box} is back (its daemon takes its requests up when it starts). "
              "`babysit status` shows the fleet's boxes.")
        return 0
    deadline = time.monotonic() + args.wait
    while time.monotonic() < deadline:
        result = store.request_result(request)
        if result is not None:
            print(f"abort {args.run}: {result}")
            return 0 if result in ("stopping", ALREADY_STOPPING, "not running") else 1
        time.sleep(0.2)
    print(f"abort {args.run}: queued (request {request}); no daemon took it within {args.wait:g}s — "
          "it runs when `babysit up` does")
    return 0


def ended(reg: registry.Registry, run: str) -> str | None:
    """'already finished (completed at …)' for a run no daemon will act on again, else None; read-only."""
    store = open_existing(reg)
    if store is None:
        return None
    try:
        status, facts = store.run_state(run)
        attempts = store.attempts(run)
    finally:
        store.close()
    if status not in ENDED_STATUSES or not attempts:  # no daemon acts on these again
        return None
    last = attempts[-1]
    outcome = facts.get("ended") or last.outcome or status
    when = "" if last.ended_at is None else " at " + utc_timestamp(datetime.fromtimestamp(last.ended_at, timezone.utc))
    return f"already {status} ({outcome}{when}, attempt {last.n})"


def _in_fleet(reg: registry.Registry, run: str) -> bool:
    """Whether the run belongs to a box of this box's fleet (never on SQLite)."""
    return fleet_owner(reg, run) is not None
