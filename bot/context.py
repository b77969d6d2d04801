"""What every handler of the bot reads: its configuration, and the registry and store as they are now.

Apart from bot/handlers.py so that bot/owner_calls.py (which handlers.py dispatches to) can use them
without importing the handlers back.
"""

from __future__ import annotations

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
