"""Amendments (docs/verdicts.md, Amendments): declared before the data they touch, appended, never edits of the prereg.

An amendment file adds a rule (today: the original bounds × `scale`) and says how the rules combine
(today: `agree`, i.e. AMBIGUOUS-BY-INSTRUMENT when they disagree). Everything here is pure;
`record_amendment` (babysit/commands/amend.py) is the one place that reads the log and writes the
store, because the record must say what data had been seen when the amendment was declared
("declared with eval data seen only through step 250").
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from fractions import Fraction
from pathlib import Path

from babysit.core.errors import SpecError
from babysit.core.spec import expr, tomlfile
from babysit.core.spec.expr import exact_value
from babysit.core.spec.prereg import Prereg

COMBINE_MODES = ("agree",)


@dataclass(frozen=True)
class AmendmentSpec:
    """A parsed amendment file; `text` is kept verbatim because its hash is what the chain covers."""

    title: str
    rationale: str
    scale: expr.Expr
    combine: str
    text: str
    display: str


@dataclass(frozen=True)
class AmendmentRecord:
    """An amendment as a verdict sees it: the parsed file plus its provenance.

    `provenance_checked` is False for an offline what-if (`--amendment FILE`): nobody recorded when it
    was declared or what data had been seen, so the verdict JSON says so.
    """

    n: int
    spec: AmendmentSpec
    declared_at: str | None
    data_seen_through_step: int | None
    sha256: str | None
    provenance_checked: bool = True

    @property
    def name(self) -> str:
        return f"amendment-{self.n}"


def parse_amendment(text: str, display: str) -> AmendmentSpec:
    """Parse an amendment TOML; every error is a SpecError (exit 2) naming the file and the field."""
    top = tomlfile.Table(tomlfile.loads(text, display), display)
    title = top.str("title", check=lambda v: bool(v.strip()), expected="a non-empty title")
    rationale = top.str("rationale", check=lambda v: bool(v.strip()), expected="a non-empty rationale")
    raw_scale = top.raw("scale")
    try:
        scale = expr.parse(raw_scale)
    except expr.ExprError as exc:
        raise top.error("scale", f"a number or arithmetic over numbers and reference names ({exc})", raw_scale)
    if not scale.names:  # a plain-number scale can be checked now; one over references at record time
        _positive_scale(scale, {}, display)
    combine = top.str("combine", check=lambda v: v in COMBINE_MODES,
                      expected="one of " + " | ".join(f'"{m}"' for m in COMBINE_MODES)
                      + ' ("agree": every rule must give the same label, else AMBIGUOUS-BY-INSTRUMENT)')
    top.finish()
    return AmendmentSpec(title=title.strip(), rationale=rationale.strip(), scale=scale, combine=combine,
                         text=text, display=display)


def load_amendment(path: Path | str, display: str | None = None) -> AmendmentSpec:
    path = Path(path)
    shown = display or str(path)
    return parse_amendment(tomlfile.read(path, shown, "amendment TOML file"), shown)


def scale_value(spec: AmendmentSpec, references: Mapping[str, float]) -> Fraction:
    """The scale as an exact rational over the decimal literals written (no float noise)."""
    return _positive_scale(spec.scale, references, spec.display)


def check_against(spec: AmendmentSpec, prereg: Prereg) -> Fraction:
    """Refuse a scale naming references the prereg does not declare, or one that is not > 0."""
    unknown = sorted(spec.scale.names - set(prereg.references))
    if unknown:
        raise SpecError(spec.display, "scale", "arithmetic over numbers and names from [prereg.references] ("
                        + (", ".join(sorted(prereg.references)) or "none declared") + ")", spec.scale.source)
    return scale_value(spec, prereg.references)


def what_if(spec: AmendmentSpec, n: int) -> AmendmentRecord:
    """An offline amendment: numbered after the recorded ones, marked not provenance-checked."""
    return AmendmentRecord(n=n, spec=spec, declared_at=None, data_seen_through_step=None,
                           sha256=amendment_sha256(spec.text, None), provenance_checked=False)


def last_metric_step(series: tuple[tuple[int, float], ...]) -> int | None:
    """The last step with `metric` data: what the declarer could have seen."""
    return max((step for step, _ in series), default=None)


def utc_now_iso(now: datetime) -> str:
    """ISO 8601 UTC with a Z, to the second: the declared_at format."""
    return now.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _positive_scale(scale: expr.Expr, references: Mapping[str, float], display: str) -> Fraction:
    try:
        value = exact_value(scale, references)
    except expr.ExprError as exc:
        raise SpecError(display, "scale", f"arithmetic that evaluates ({exc})", scale.source)
    if value <= 0:
        raise SpecError(display, "scale", "a positive scale (bounds × scale must keep the bands' order)",
                        scale.source)
    return value


def amendment_sha256(text: str, prev_sha256: str | None) -> str:
    return hashlib.sha256(((prev_sha256 or "") + "\n" + text).encode("utf-8")).hexdigest()
