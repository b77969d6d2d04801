"""Helpers the fleet tests share (their fixtures are in tests/fleet/conftest.py)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def wait_for(what: str, check: Callable[[], Any], timeout: float = 30.0, every: float = 0.1) -> Any:
    """`check()`'s first truthy answer, asked every `every` s; an AssertionError naming `what` after `timeout`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")
