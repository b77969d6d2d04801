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

from collections.abc import Iterable, Mapping
from typing import Any

from babysit.client import is_nonfinite, plain

EXIT_DIVERGED = 11  # babysit's classifier (classify.EXIT_DIVERGED) and the reference trainer's code
DEFAULT_WATCH = ("loss", "grad_norm")


class Diverged(SystemExit):
    """Training stopped on a non-finite value; exits the process with code 11 (babysit: `diverged`)."""

    def __init__(self, message: str, code: int = EXIT_DIVERGED) -> None:
        super().__init__(code)
        self.message = message

    def __str__(self) -> str:
        return self.message


def nonfinite_watched(values: Mapping[str, Any], watch: Iterable[str] = DEFAULT_WATCH) -> dict[str, float]:
    """The watched keys (a key containing one of `watch`, case-insensitive) whose value is NaN or ±inf."""
    needles = [w.lower() for w in watch]
    bad: dict[str, float] = {}
    for key, value in values.items():
        if any(n in key.lower() for n in needles):
            number = plain(value)
            if is_nonfinite(number):
                bad[key] = number
    return bad


def describe(bad: Mapping[str, float]) -> str:
    """`loss=nan, grad_norm=inf`: what the stderr line and the diverged record say."""
    return ", ".join(f"{k}={v}" for k, v in bad.items())
