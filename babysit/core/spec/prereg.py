"""run.toml's [prereg]: the question, the metric, the bands a delta falls in, frozen before the run.

Its own module because the table is a contract, not a setting: `register` freezes its hash, every later
read checks it (babysit/verdict/prereg_record.py), and an amendment (amendment.py) is checked against it.
The rest of run.toml is run_toml.py's.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from babysit.core.campaign.spec import Campaign, merged_references
from babysit.core.errors import SpecError
from babysit.core.spec import expr
from babysit.core.spec.tomlfile import Table

AMBIGUOUS_BY_INSTRUMENT = "AMBIGUOUS-BY-INSTRUMENT"


@dataclass(frozen=True)
class Band:
    label: str
    max: expr.Expr | None = None  # delta <= max
    min: expr.Expr | None = None  # delta >= min


@dataclass(frozen=True)
class Fixture:
    log: Path
    expect_delta: float
    expect_label: str


@dataclass(frozen=True)
class Prereg:
    question: str
    metric: str
    baseline_step: int
    read_step: int
    bands: tuple[Band, ...]
    precision: int = 4
    train_metric: str | None = None
    references: MappingProxyType = field(default_factory=lambda: MappingProxyType({}))
    otherwise: str = "AMBIGUOUS"
    interpretation: MappingProxyType = field(default_factory=lambda: MappingProxyType({}))
    fixture: Fixture | None = None
    canonical: str = ""  # the canonical JSON of the [prereg] table as written
    sha256: str = ""  # sha256 of `canonical`: what `register` freezes

    @property
    def labels(self) -> tuple[str, ...]:
        return (*(b.label for b in self.bands), self.otherwise)


def canonical_prereg(table: dict[str, Any]) -> str:
    """The [prereg] table as canonical JSON: sorted keys, no whitespace, floats in repr form."""
    return json.dumps(table, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def prereg_sha256(table: dict[str, Any]) -> str:
    return hashlib.sha256(canonical_prereg(table).encode("utf-8")).hexdigest()


def _bound(t: Table, key: str) -> expr.Expr | None:
    """A band's `max` or `min`: a number or arithmetic over reference names; None when not written."""
    if not t.has(key):
        t.raw(key, None)
        return None
    value = t.raw(key)
    try:
        return expr.parse(value)
    except expr.ExprError as exc:
        raise t.error(key, f"a number or arithmetic over numbers and reference names ({exc})", value)


def parse_prereg(t: Table | None, base: Path, campaign: Campaign | None = None) -> Prereg | None:
    """[prereg], checked whole and hashed as written (with a campaign's banked deltas among its references)."""
    if t is None:
        return None
    raw = t.data
    question = t.str("question", "")
    metric = t.str("metric", check=bool, expected="the key of the eval metric in the log")
    baseline = t.int("baseline_step", minimum=0)
    read = t.int("read_step", minimum=1)
    if read <= baseline:
        raise t.error("read_step", f"a step after baseline_step ({baseline})", read)
    precision = t.int("precision", 4, minimum=0)
    if precision > 12:
        raise t.error("precision", "an integer between 0 and 12", precision)
    train_metric = t.str("train_metric", None, check=bool, expected="the key of the train-slice metric")

    refs_table = t.table("references")
    references: dict[str, float] = {}
    if refs_table is not None:
        for ref in list(refs_table.data):
            if not ref.isidentifier():
                raise refs_table.error(ref, "a reference name usable in a bound (letters, digits, _)", ref)
            references[ref] = refs_table.number(ref)
        refs_table.finish()
    if campaign is not None:  # a campaign's banked deltas are references by name, frozen in the hash
        references = merged_references(references, campaign, t.file)

    bands: list[Band] = []
    for bt in t.tables("bands"):
        label = bt.str("label", check=bool, expected="a non-empty label")
        band = Band(label=label, max=_bound(bt, "max"), min=_bound(bt, "min"))
        bt.finish()  # a typo ("mx") is named as such, before "no bound" is said
        if band.max is None and band.min is None:
            raise SpecError(bt.file, bt.path, "a band with max, min or both", "<neither>")
        for key, bound in (("max", band.max), ("min", band.min)):
            if bound is None:
                continue
            unknown = sorted(bound.names - set(references))
            if unknown:
                raise bt.error(key, "arithmetic over numbers and names from [prereg.references] ("
                               + (", ".join(sorted(references)) or "none declared") + ")", bound.source)
        bt.finish()
        bands.append(band)
    if not bands:
        raise t.missing("bands", "at least one [[prereg.bands]] table", "<none>")

    other = t.table("otherwise")
    otherwise = "AMBIGUOUS"
    if other is not None:
        otherwise = other.str("label", check=bool, expected="a non-empty label")
        other.finish()
    labels = [b.label for b in bands] + [otherwise]
    duplicates = sorted({lb for lb in labels if labels.count(lb) > 1})
    if duplicates:
        raise t.error("bands", "distinct labels for every band and [prereg.otherwise]", duplicates)
    if AMBIGUOUS_BY_INSTRUMENT in labels:
        raise t.error("bands", f"labels other than {AMBIGUOUS_BY_INSTRUMENT} (babysit reserves it)",
                      AMBIGUOUS_BY_INSTRUMENT)

    interpretation = t.str_map("interpretation", {})
    for label in interpretation:
        if label not in labels and label != AMBIGUOUS_BY_INSTRUMENT:
            raise t.error(f"interpretation.{label}", "a label of the bands, the otherwise label or "
                          + AMBIGUOUS_BY_INSTRUMENT + " (" + ", ".join(labels) + ")", "<unknown label>")

    fixture = None
    ft = t.table("fixture")
    if ft is not None:
        fixture = Fixture(
            log=(base / ft.str("log", check=bool, expected="a path to a train log")).resolve(),
            expect_delta=ft.number("expect_delta"),
            expect_label=ft.str("expect_label", check=lambda v: v in labels,
                                expected="one of the labels (" + ", ".join(labels) + ")"),
        )
        ft.finish()
    t.finish()
    try:
        canonical = canonical_prereg({**raw, "references": references} if campaign is not None else raw)
    except ValueError:
        raise SpecError(t.file, t.path, "finite numbers only", "<nan or inf>")
    return Prereg(
        question=question,
        metric=metric,
        baseline_step=baseline,
        read_step=read,
        bands=tuple(bands),
        precision=precision,
        train_metric=train_metric,
        references=MappingProxyType(references),
        otherwise=otherwise,
        interpretation=MappingProxyType(interpretation),
        fixture=fixture,
        canonical=canonical,
        sha256=hashlib.sha256(canonical.encode("utf-8")).hexdigest(),
    )
