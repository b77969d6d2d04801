"""The pre-registered verdict, computed purely: prereg + amendments + eval series in, a Verdict out.

No I/O and no clock here, so the same inputs give the same verdict anywhere, and a stranger can
re-derive it from the JSON. Decisions (docs/verdicts.md says why):

* Arithmetic is exact. Logged values, references and bound literals are taken as the decimals they
  print as (`Fraction(repr(x))`) and bounds are evaluated as rationals, so "0.5 * demosonly" is
  exactly 1.01585 and float noise never decides a label.
* The delta is rounded ONCE, to `precision` decimals, half-to-even on the exact decimal difference,
  before it meets any bound: a delta that prints +0.3000 is 0.3000 (0.30005 -> 0.3000, 0.30015 ->
  0.3002). What is printed is what was compared.
* Bounds are NOT rounded before comparison: SAME-DRIFT at min 1.01585 needs delta >= 1.01585, so a
  delta of +1.0158 is not SAME-DRIFT although the example pre-registration (docs/verdicts.md) wrote
  the bound as +1.0158. Bounds are shown (JSON, card, chart) rounded to `precision`, with more
  decimals only where rounding would mislead (`shown_bound`): every rounded delta meets the shown
  bound exactly when it meets the exact one.
* An eval exactly at baseline_step and at read_step is required; nothing is interpolated.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from itertools import pairwise
from typing import Any

from babysit.core.errors import SpecError
from babysit.core.spec.amendment import AmendmentRecord
from babysit.core.spec.expr import decimal_of, exact_value
from babysit.core.spec.prereg import AMBIGUOUS_BY_INSTRUMENT, Prereg

FINAL = "FINAL"
PROVISIONAL = "PROVISIONAL"
NO_READ = "NO-READ"

Series = Sequence[tuple[int, float]]


@dataclass(frozen=True)
class RuleBand:
    """One band with its exact bounds (already scaled for an amendment's rule)."""

    label: str
    max: Fraction | None = None  # delta <= max
    min: Fraction | None = None  # delta >= min

    def holds(self, delta: Fraction) -> bool:
        return (self.max is None or delta <= self.max) and (self.min is None or delta >= self.min)


@dataclass(frozen=True)
class Rule:
    """The original rule, or an amendment's rule; `label` is None when there is nothing to read."""

    name: str
    bands: tuple[RuleBand, ...]
    otherwise: str
    scale: Fraction | None = None  # None: the original rule
    label: str | None = None

    def classify(self, delta: Fraction) -> str:
        """The first band that holds names the label, else the otherwise label."""
        return next((b.label for b in self.bands if b.holds(delta)), self.otherwise)


@dataclass(frozen=True)
class Corroboration:
    """Reported beside the verdict, never a gate."""

    train_delta: float | None = None  # train_metric at the read step minus at baseline, rounded
    monotone_rise: bool | None = None  # every eval from baseline to the read above the previous one


@dataclass(frozen=True)
class Verdict:
    status: str  # FINAL | PROVISIONAL | NO-READ
    metric: str
    baseline_step: int
    read_step: int
    precision: int
    rules: tuple[Rule, ...]
    label: str | None
    interpretation: str | None
    corroboration: Corroboration
    amendments: tuple[AmendmentRecord, ...] = ()
    requested_step: int | None = None  # --at-step as asked (None: all data)
    at_step: int | None = None  # the eval step the delta was read at
    baseline: float | None = None
    read: float | None = None
    delta: float | None = None  # rounded to precision: exactly what met the bounds
    delta_exact: Fraction | None = None  # the same value as an exact rational
    reason: str | None = None  # why NO-READ (which eval is missing)

    @property
    def provisional(self) -> bool:
        return self.status == PROVISIONAL

    def to_json(self, run: str, prereg_sha256: str | None, amendments: Sequence[Any] | None = None) -> dict[str, Any]:
        """The verdict JSON (docs/verdicts.md), keys in a fixed order; numbers rounded to precision
        (bounds: see shown_bound)."""
        p = self.precision
        records = self.amendments if amendments is None else tuple(amendments)
        out: dict[str, Any] = {
            "run": run,
            "status": self.status,
            "metric": self.metric,
            "baseline_step": self.baseline_step,
            "read_step": self.read_step,
            "at_step": self.at_step if self.at_step is not None else self.requested_step,
            "baseline": _round(self.baseline, p),
            "read": _round(self.read, p),
            "delta": self.delta,
            "rules": [_rule_json(r, p) for r in self.rules],
            "label": self.label,
            "interpretation": self.interpretation,
            "corroboration": {"train_delta": self.corroboration.train_delta,
                              "monotone_rise": self.corroboration.monotone_rise},
            "prereg_sha256": prereg_sha256,
            "amendments": [_amendment_json(a) for a in records],
        }
        if self.status == NO_READ:
            out["reason"] = self.reason
        return out


@dataclass(frozen=True)
class FixtureResult:
    ok: bool
    expected_delta: float
    got_delta: float | None
    expected_label: str
    got_label: str | None
    verdict: Verdict


def evaluate(prereg: Prereg, amendments: Iterable[AmendmentRecord] = (), series: Series = (), *,
             train_series: Series = (), at_step: int | None = None) -> Verdict:
    """Read the verdict as of `at_step` (None: everything in `series`); see the module docstring."""
    records = tuple(amendments)
    rules = build_rules(prereg, records)
    evals = _upto(series, at_step)
    p = prereg.precision
    base = dict(metric=prereg.metric, baseline_step=prereg.baseline_step, read_step=prereg.read_step,
                precision=p, amendments=records, requested_step=at_step)

    def no_read(reason: str) -> Verdict:
        return Verdict(status=NO_READ, rules=rules, label=None, interpretation=None,
                       corroboration=Corroboration(), reason=reason, **base)

    if at_step is not None and at_step < prereg.baseline_step:
        return no_read(f"at_step {at_step} is before baseline_step {prereg.baseline_step}: nothing to read yet")
    if prereg.baseline_step not in evals:
        return no_read(f"no {prereg.metric} eval at baseline_step {prereg.baseline_step} (an eval exactly at "
                       "the step is required; babysit does not interpolate)")
    if prereg.read_step in evals:
        status, step = FINAL, prereg.read_step
    elif (at_step is not None and at_step >= prereg.read_step) or max(evals) > prereg.read_step:
        return no_read(f"no {prereg.metric} eval at read_step {prereg.read_step} (an eval exactly at the step "
                       "is required; babysit does not interpolate)")
    elif max(evals) == prereg.baseline_step:  # Δ would be 0 by construction: not a read of anything
        return no_read(f"only the baseline eval so far (step {prereg.baseline_step}): the first provisional "
                       "read comes with the next eval after it")
    else:
        status, step = PROVISIONAL, max(evals)

    baseline_v, read_v = evals[prereg.baseline_step], evals[step]
    delta = round(decimal_of(read_v) - decimal_of(baseline_v), p)
    if _as_float(delta) is None:  # e.g. -1.7e308 -> +1.7e308: no JSON number, no chart, no measurement
        return no_read(f"the delta {prereg.metric}({step}) {read_v:.6g} - {prereg.metric}({prereg.baseline_step}) "
                       f"{baseline_v:.6g} is beyond the range of a float (about ±1.8e308): not a measurement "
                       "babysit can report")
    labelled = tuple(_with_label(r, r.classify(delta)) for r in rules)
    labels = {r.label for r in labelled}
    label = labelled[0].label if len(labels) == 1 else AMBIGUOUS_BY_INSTRUMENT
    return Verdict(
        status=status, rules=labelled, label=label, interpretation=interpret(prereg, labelled, label),
        corroboration=corroborate(prereg, evals, _upto(train_series, at_step), step),
        at_step=step, baseline=baseline_v, read=read_v, delta=_as_float(delta), delta_exact=delta, **base,
    )


def build_rules(prereg: Prereg, amendments: Iterable[AmendmentRecord] = ()) -> tuple[Rule, ...]:
    """The original rule with exact bounds, then one rule per amendment: every bound × its scale."""
    refs = prereg.references
    original = tuple(
        RuleBand(b.label, None if b.max is None else exact_value(b.max, refs),
                 None if b.min is None else exact_value(b.min, refs))
        for b in prereg.bands
    )
    rules = [Rule("original", original, prereg.otherwise)]
    for a in amendments:
        scale = exact_value(a.spec.scale, refs)
        if scale <= 0:
            raise SpecError(a.spec.display, "scale", "a positive scale", a.spec.scale.source)
        rules.append(Rule(a.name, scale_bands(original, scale), prereg.otherwise, scale=scale))
    return tuple(rules)


def scale_bands(bands: Iterable[RuleBand], scale: Fraction) -> tuple[RuleBand, ...]:
    """Every bound × scale; a positive scale keeps the bands' order (the frozen bands are not edited)."""
    return tuple(RuleBand(b.label, None if b.max is None else b.max * scale,
                          None if b.min is None else b.min * scale) for b in bands)


def corroborate(prereg: Prereg, evals: Mapping[int, float], train: Mapping[int, float], step: int) -> Corroboration:
    """Train-slice delta over the same window and the strictly-rising flag; None where not measured."""
    train_delta = None
    if prereg.train_metric is not None and prereg.baseline_step in train and step in train:
        d = round(decimal_of(train[step]) - decimal_of(train[prereg.baseline_step]), prereg.precision)
        train_delta = _as_float(d)  # beyond a float's range: not measured, never a crash
    window = [evals[s] for s in sorted(evals) if prereg.baseline_step <= s <= step]
    rise = None if len(window) < 2 else all(b > a for a, b in pairwise(window))
    return Corroboration(train_delta, rise)


def interpret(prereg: Prereg, rules: Sequence[Rule], label: str) -> str:
    """The pre-registered meaning of the label; AMBIGUOUS-BY-INSTRUMENT says which rule said what."""
    written = prereg.interpretation.get(label)
    if label != AMBIGUOUS_BY_INSTRUMENT:
        return written or f"{label} (the prereg gives no interpretation for this label)"
    said = ", ".join(f"{r.name} says {r.label}" for r in rules)
    return (written + f" ({said})") if written else (
        f"The rules disagree ({said}): no conclusion is claimed; both numbers go to the owner and the "
        "instrument is disambiguated before any recipe conclusion.")


def fixture_result(prereg: Prereg, series: Series, train_series: Series = ()) -> FixtureResult:
    """The instrument (original rule only) on the fixture's series must reproduce its delta and label."""
    fixture = prereg.fixture
    if fixture is None:
        raise ValueError("the prereg has no [prereg.fixture]")
    verdict = evaluate(prereg, (), series, train_series=train_series)
    p = prereg.precision
    expected = float(round(decimal_of(fixture.expect_delta), p))
    got_label = verdict.rules[0].label if verdict.status == FINAL else None
    ok = verdict.status == FINAL and verdict.delta == expected and got_label == fixture.expect_label
    return FixtureResult(ok, expected, verdict.delta, fixture.expect_label, got_label, verdict)


def shown_bound(value: Fraction, precision: int, side: str) -> tuple[Fraction, int]:
    """A bound rounded for showing, and its decimals: `precision`, or more where rounding would lie.

    Rounding a bound to `precision` can only mislead at one delta: the rounded value itself, when it
    moved the bound inward (a `min` of 1.01585 shown as 1.0158: a delta of +1.0158 would look like it
    meets it, and does not). Then one more decimal at a time is shown until no rounded delta is judged
    differently by the shown bound than by the exact one. So the example's bounds show as 0.3,
    1.01585, 1.0838 and 3.6701 (docs/verdicts.md, the worked example).
    """
    for digits in range(precision, precision + 16):
        shown = round(value, digits)
        on_grid = round(shown, precision) == shown
        if not (on_grid and ((side == "max" and shown > value) or (side == "min" and shown < value))):
            return shown, digits
    return value, precision + 16


def fmt_bound(value: Fraction, precision: int, side: str, *, exact: bool = True) -> str:
    """The shown bound, and (with `exact`) the exact value beside it when they differ."""
    shown, digits = shown_bound(value, precision, side)
    text = f"{float(shown):+.{digits}f}"
    return text if shown == value or not exact else f"{text} (exact {float(value):+.{precision + 6}g})"


def _as_float(value: Fraction) -> float | None:
    """The exact value as a finite float, or None when it is beyond a float's range."""
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


def _upto(series: Series, at_step: int | None) -> dict[int, float]:
    """Only evals at steps <= at_step count; the last value logged for a step wins."""
    return {s: v for s, v in series if at_step is None or s <= at_step}


def _with_label(rule: Rule, label: str) -> Rule:
    from dataclasses import replace

    return replace(rule, label=label)


def _round(value: float | None, precision: int) -> float | None:
    return None if value is None else float(round(decimal_of(value), precision))


def _rule_json(rule: Rule, precision: int) -> dict[str, Any]:
    bounds: dict[str, dict[str, float]] = {}
    for b in rule.bands:
        entry: dict[str, float] = {}
        if b.max is not None:
            entry["max"] = float(shown_bound(b.max, precision, "max")[0])
        if b.min is not None:
            entry["min"] = float(shown_bound(b.min, precision, "min")[0])
        bounds[b.label] = entry
    out: dict[str, Any] = {"name": rule.name}
    if rule.scale is not None:
        out["scale"] = float(round(rule.scale, precision))
    out["bounds"] = bounds
    out["label"] = rule.label
    return out


def _amendment_json(a: Any) -> dict[str, Any]:
    """An AmendmentRecord or a store.Amendment (recorded ones are provenance-checked)."""
    out: dict[str, Any] = {"n": a.n, "declared_at": a.declared_at,
                           "data_seen_through_step": a.data_seen_through_step, "sha256": a.sha256}
    if not getattr(a, "provenance_checked", True):
        out["provenance_checked"] = False
    return out
