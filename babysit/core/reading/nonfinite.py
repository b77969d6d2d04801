"""Which metrics going NaN/inf mean the run diverged: one rule for the live guard, the exit
classifier and the framework hooks (HF, Lightning), so the three never disagree on a run.

The run's `[guards] nonfinite_metrics` names them exactly; without it, every metric whose name
contains `loss` or `grad_norm`. The grad norm is in the default because HF's `logging_nan_inf_filter`
(on by default) keeps a NaN out of the logged training loss: the grad norm is where it shows. But a
mixed-precision run's loss scaler skips a step whose gradients overflowed, and that step's grad norm is
inf by design: so under the default rule a grad norm counts only when it is non-finite in two records
in a row that carry it (a skipped step is followed by a finite one; a diverged run stays NaN). A name
the run declares counts at its first non-finite value: the user said so.

The daemon hands the run's declaration to the trainer in `$BABYSIT_NONFINITE_METRICS` (a JSON list), so a
hook inside the trainer honours what run.toml says without reading it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence

DEFAULT_SUBSTRINGS = ("loss", "grad_norm")  # matched case-insensitively when nothing is declared
SKIP_TOLERANT = "grad_norm"  # under the default rule: counts when non-finite in two records in a row
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


def skip_tolerant(name: str, declared: Sequence[str] | None) -> bool:
    """A default-watched grad norm (not a loss): one non-finite value may be a loss scaler's skipped step."""
    lowered = name.lower()
    return declared is None and SKIP_TOLERANT in lowered and "loss" not in lowered


def divergence(values: Mapping[str, object], declared: Sequence[str] | None,
               pending: frozenset[str] = frozenset()) -> tuple[dict[str, float], frozenset[str]]:
    """What one record shows diverged, given `pending` (the skip-tolerant names non-finite in the last
    record that carried them), and the `pending` to hand the next record. A record without a name
    leaves its pending state as it was."""
    bad = bad_values(values, declared)
    counted = {k: v for k, v in bad.items() if not skip_tolerant(k, declared) or k in pending}
    now_bad = frozenset(k for k in bad if skip_tolerant(k, declared))
    carried = frozenset(k for k in pending if k not in values)
    return counted, now_bad | carried


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
