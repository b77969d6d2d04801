"""What every handler of the bot reads: its configuration, and the registry and store as they are now.

Apart from bot/handlers.py so that bot/owner_calls.py (which handlers.py dispatches to) can use them
without importing the handlers back.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from babysit.core.render import Rendered
from babysit.db.store import Store
from babysit.db.url import open_store
from babysit.runtime import registry
from babysit.view import runview
from bot import messages as msg


@dataclass(frozen=True)
class BotConfig:
    registry_path: Path
    request_wait_s: float = 10.0  # how long /babysit poll and abort wait for the daemon's answer
    gpu_probe: str | None = None  # None: $BABYSIT_GPU_PROBE or nvml


@contextmanager
def opened(cfg: BotConfig) -> Iterator[tuple[registry.Registry, Store]]:
    """The registry as it is now (new registrations show at once) and a store handle on its state."""
    reg = registry.load(cfg.registry_path)
    store = open_store(reg)
    try:
        yield reg, store
    finally:
        store.close()


def wait_result(store: Store, request_id: int, wait_s: float, run: str | None = None) -> str | None:
    """The answer to a control request, waited for up to `wait_s` (None: no daemon answered yet). In a
    fleet, a request for a run (`run`) whose box is lost or stopped is not waited for: no daemon can answer it
    before that box is back (`unanswered` says so)."""
    if run is not None and runview.box_away(store, run) is not None:
        return store.request_result(request_id)
    deadline = time.monotonic() + wait_s
    while True:
        result = store.request_result(request_id)
        if result is not None or time.monotonic() >= deadline:
            return result
        time.sleep(0.1)


def owner_elsewhere(store: Store, run: str) -> str | None:
    """The box that owns `run` when it is another box of the fleet (its files are there), else None."""
    if store.host is None:
        return None
    owner = store.run_hosts().get(run)
    if owner is None or owner == store.host:
        return None
    return owner


def unanswered(store: Store, run: str, action: str, request_id: int, wait_s: float,
               shown: str | None = None) -> Rendered:
    """What the asker is told when no daemon answered: the box out of sight named with its staleness (the
    request waits for it), else that no daemon took it within the wait."""
    away = runview.box_away(store, run)
    if away is not None:
        return msg.request_for_away_box(shown or run, action, request_id, *away)
    return msg.request_unanswered(shown or run, action, request_id, wait_s)
