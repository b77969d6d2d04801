"""Which metrics going NaN/inf mean the run diverged: one rule for the live guard, the exit
classifier and the framework hooks (HF, Lightning), so the three never disagree on a run.

The run's `[guards] nonfinite_metrics` names them exactly; without it, every metric whose name
contains `loss` or `grad_norm`. The grad norm is in the default because HF's `logging_nan_inf_filter`
(on by default) keeps a NaN out of the logged training loss: the grad norm is where it shows. The
daemon hands the run's declaration to the trainer in `$BABYSIT_NONFINITE_METRICS` (a JSON list), so a
hook inside the trainer honours what run.toml says without reading it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence

DEFAULT_SUBSTRINGS = ("loss", "grad_norm")  # matched case-insensitively when nothing is declared
ENV = "BABYSIT_NONFINITE_METRICS"


def watched(name: str, declared: Sequence[str] | None) -> bool:
    """Whether a NaN/inf of `name` is divergence: a declared name, else a name containing loss/grad_norm."""
    if declared is not None:
        return name in declared
    lowered = name.lower()
    return any(s in lowered for s in DEFAULT_SUBSTRINGS)


def is_nonfinite(value: object) -> bool:
    return isinstance(value, float) and not math.isfinite(value)


def bad_values(values: Mapping[str, object], declared: Sequence[str] | None) -> dict[str, float]:
    """The watched keys of one record whose value is NaN or ±inf, in the record's order."""
    return {k: v for k, v in values.items() if is_nonfinite(v) and watched(k, declared)}  # type: ignore[misc]


def first_bad(values: Mapping[str, object], declared: Sequence[str] | None) -> tuple[str, float] | None:
    """The first watched metric of a record that is a non-finite number, or None."""
    return next(iter(bad_values(values, declared).items()), None)


def describe(bad: Mapping[str, float]) -> str:
    """`grad_norm = nan, loss = inf`: how every message names what went non-finite."""
    return ", ".join(f"{k} = {v}" for k, v in bad.items())


def to_env(declared: Iterable[str] | None) -> str | None:
    """The declaration as the trainer's environment carries it; None: nothing declared (the default)."""
    return None if declared is None else json.dumps(list(declared))


def from_env(text: str | None) -> tuple[str, ...] | None:
    """The declaration back from `$BABYSIT_NONFINITE_METRICS`; None (the default rule) when unset or not
    a JSON list of strings (a hook never fails a training run over it)."""
    if not text:
        return None
    try:
        names = json.loads(text)
    except ValueError:
        return None
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        return None
    return tuple(names)
