"""Errors met while handling one run: a BabysitError (the store failing, a refused read) is logged and
the job comes again; anything else is an `internal-error` incident, once per attempt, place and error,
with its traceback in the daemon log. One run's bad data never stops the daemon or the other runs.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any

import structlog

from babysit.core.errors import BabysitError

log = structlog.get_logger("babysit.run.supervisor")


def short_error(exc: BaseException) -> str:
    """`Type: message`, cut short: for incidents and messages (the traceback goes to the daemon log)."""
    return f"{type(exc).__name__}: {exc}"[:300]


class RunErrors:
    """One run's error sink; `incident` records and posts an incident, `attempt_n` says the current attempt."""

    def __init__(self, run: str, incident: Callable[..., Any], attempt_n: Callable[[], int | None]) -> None:
        self.run, self.incident, self.attempt_n = run, incident, attempt_n
        self.logged: set[str] = set()  # digests of the internal errors already logged: one traceback each

    def failed(self, where: str, exc: BaseException) -> None:
        """An error met on this run by a job. Never raises."""
        if isinstance(exc, BabysitError):
            log.error(f"{where} failed", run=self.run, error=exc.message, exc_info=exc)
        else:
            self.internal_error(where, exc)

    def internal_error(self, where: str, exc: BaseException) -> None:
        """Record an exception met while handling this run: the traceback to the daemon log, an
        `internal-error` incident (once per attempt, place and error) to the channel. Never raises."""
        error = short_error(exc)
        digest = hashlib.sha256(f"{self.attempt_n()}\n{where}\n{error}".encode()).hexdigest()[:16]
        if digest in self.logged:  # a job meeting the same error every tick: one traceback per daemon is enough
            return
        self.logged.add(digest)
        log.error("internal error", run=self.run, where=where, error=error, exc_info=exc)
        try:
            self.incident("internal-error", f"babysit failed while {where}: {error} (traceback in daemon.log); "
                          "the daemon and the other runs go on", {"where": where, "error": error},
                          key=f"{self.run}:internal-error:{digest}")
        except Exception:
            self.logged.discard(digest)  # recorded next time it happens
            log.exception("could not record the internal error", run=self.run, where=where)
