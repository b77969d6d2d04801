"""Framework hooks that write babysit's JSONL records: `huggingface.BabysitCallback`,
`lightning.BabysitLogger` (and `pytorch_lightning.BabysitLogger`). See docs/your-trainer.md.

This package imports no framework; each submodule imports its own (an optional extra).

How a diverged run ends (shared by every hook): at the first non-finite watched value the hook writes
a `{"event": "diverged"}` record (what the reference trainer writes), says so on stderr, asks the
framework to stop after the current step, and when training has ended raises `Diverged`, a
`SystemExit` with code 11. babysit classifies exit 11 as `diverged` before any other rule; the record
is the second witness when a launcher (torchrun) reports its own exit code instead of the worker's.
A `SystemExit` passes through `except Exception` in user code, and it ends the process without a
traceback; an interactive session can catch it (`except Diverged`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from babysit.client import plain
from babysit.core import nonfinite

EXIT_DIVERGED = 11  # babysit's classifier (classify.EXIT_DIVERGED) and the reference trainer's code


class Diverged(SystemExit):
    """Training stopped on a non-finite value; exits the process with code 11 (babysit: `diverged`)."""

    def __init__(self, message: str, code: int = EXIT_DIVERGED) -> None:
        super().__init__(code)
        self.message = message

    def __str__(self) -> str:
        return self.message


def declared_watch(watch: Sequence[str] | None) -> tuple[str, ...] | None:
    """The metric names a hook watches: its own `watch` argument, else the run's `[guards]
    nonfinite_metrics` (the daemon passes it in `$BABYSIT_NONFINITE_METRICS`), else None, babysit's
    default rule (`babysit.core.nonfinite`: every *loss* and *grad_norm*), the one the daemon applies."""
    if watch is not None:
        return tuple(watch)
    return nonfinite.from_env(os.environ.get(nonfinite.ENV))


class NonfiniteWatch:
    """A hook's view of divergence, record after record, by the daemon's one rule (babysit.core.nonfinite):
    a watched loss counts at once, a default-watched grad norm when non-finite twice in a row."""

    def __init__(self, watch: Sequence[str] | None = None) -> None:
        self.watch = watch
        self.pending: frozenset[str] = frozenset()

    def check(self, values: Mapping[str, Any]) -> dict[str, float]:
        """The watched keys of this record that mean divergence (numpy/torch scalars read as numbers).

        A record of plain finite numbers with nothing pending shows nothing and leaves nothing pending
        (`nonfinite.divergence`'s rule): said in one pass, not the generic path (a hook logging every
        step, bench/logger_cost.py)."""
        if not self.pending:
            for value in values.values():
                kind = type(value)
                if kind is float:
                    if value - value:  # NaN or an infinity
                        break
                elif kind is not int:
                    break
            else:
                return {}
        bad, self.pending = nonfinite.divergence({k: plain(v) for k, v in values.items()},
                                                 declared_watch(self.watch), self.pending)
        return bad


def describe(bad: Mapping[str, float]) -> str:
    """`loss = nan, grad_norm = inf`: what the stderr line and the diverged record say."""
    return nonfinite.describe(bad)
