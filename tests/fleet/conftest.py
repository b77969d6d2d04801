"""Fixtures the fleet tests share (the PostgreSQL server itself is tests/conftest.py's `postgres`)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest


@pytest.fixture
def outage(postgres: Any) -> Iterator[Callable[[], None]]:
    """Stops this worker's server on call (`pg_ctl stop -m fast`: every connection cut, the socket gone); it
    is always started again afterwards (the other tests of the worker share it)."""
    try:
        yield lambda: postgres.stop("fast")
    finally:
        if not postgres.running():
            postgres.start()


@pytest.fixture
def frozen(postgres: Any) -> Iterator[Any]:
    """This worker's server, to freeze with `.freeze()` (SIGSTOP: it keeps its connections and answers
    nothing) and `.thaw()`; always thawed afterwards (tests/postgres.py `Freezer`)."""
    from tests.postgres import Freezer

    freezer = Freezer(postgres)
    try:
        yield freezer
    finally:
        freezer.thaw()
