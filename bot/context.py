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

from babysit import registry
from babysit.db.url import open_store
from babysit.store import Store


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


def wait_result(store: Store, request_id: int, wait_s: float) -> str | None:
    """The answer to a control request, waited for up to `wait_s` (None: no daemon answered yet)."""
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
