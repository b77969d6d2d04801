"""The pure verdict: bands, exact rounding, status, amendments' rules, corroboration, the seed's own numbers."""

from __future__ import annotations

from fractions import Fraction
from itertools import pairwise
from pathlib import Path

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from babysit.core.spec import expr
from babysit.core.spec.amendment import parse_amendment, what_if
from babysit.core.spec.prereg import AMBIGUOUS_BY_INSTRUMENT, Band, Prereg
from babysit.core.spec.run_toml import load_spec
from babysit.core.verdict import (
    FINAL,
    NO_READ,
    PROVISIONAL,
    Rule,
    RuleBand,
    build_rules,
    corroborate,
    evaluate,
    fixture_result,
    scale_bands,
    shown_bound,
)

FIXTURES = Path(__file__).parent / "fixtures" / "verdict"
SEED_REFS = {"demosonly": 2.0317, "mixedv2": 2.3319, "run2_pooled": 0.4640, "rigonly": 0.6929}
SCALE_TOML = """title = "measurement-scale calibration"
rationale = "units changed"
scale = "12.5087 / 3.4623"
combine = "agree"
"""


def seed_prereg(**changes) -> Prereg:
    base = dict(
        question="q", metric="eval_chunk_mae", baseline_step=500, read_step=1000, precision=4,
        train_metric="train_chunk_mae", references=SEED_REFS, otherwise="AMBIGUOUS",
        bands=(Band("HEALTHY", max=expr.parse(0.30)), Band("SAME-DRIFT", min=expr.parse("0.5 * demosonly"))),
        interpretation={"HEALTHY": "convicted", "SAME-DRIFT": "exonerated", "AMBIGUOUS": "escalate"},
    )
    base.update(changes)
    return Prereg(**base)


def series_with_delta(delta: float, baseline: float = 3.4623) -> tuple[tuple[int, float], ...]:
    return ((250, baseline + 0.5), (500, baseline), (750, baseline + delta / 2), (1000, baseline + delta))


def scale_amendment(n: int = 1):
    return what_if(parse_amendment(SCALE_TOML, "amendment.toml"), n)


# -- the seed's own numbers --------------------------------------------------------------------------------


def test_seed_scale_is_the_exact_ratio_and_scaled_bounds_match_the_seed():
    rules = build_rules(seed_prereg(), [scale_amendment()])
    original, amended = rules
    assert amended.scale == Fraction("12.5087") / Fraction("3.4623")
    assert round(float(amended.scale), 4) == 3.6128
    assert original.bands[0].max == Fraction("0.3")
    assert original.bands[1].min == Fraction("1.01585")  # 0.5 x 2.0317, exactly
    assert round(float(amended.bands[0].max), 4) == 1.0838
    assert round(float(amended.bands[1].min), 4) == 3.6701


def test_seed_bounds_show_as_spec_section_5_writes_them():
    rules = build_rules(seed_prereg(), [scale_amendment()])
    shown = [float(shown_bound(rules[0].bands[0].max, 4, "max")[0]),
             float(shown_bound(rules[0].bands[1].min, 4, "min")[0]),
             float(shown_bound(rules[1].bands[0].max, 4, "max")[0]),
             float(shown_bound(rules[1].bands[1].min, 4, "min")[0])]
    assert shown == [0.3, 1.01585, 1.0838, 3.6701]


def test_rigonly_fixture_reads_ambiguous():
    spec = load_spec(FIXTURES / "run.toml")
    from babysit.verdict.reading import run_fixture

    result = run_fixture(spec.prereg)
    assert result.ok
    assert (result.got_delta, result.got_label) == (0.6929, "AMBIGUOUS")


def test_demosonly_delta_is_same_drift_raw_but_ambiguous_scaled_so_ambiguous_by_instrument():
    prereg = seed_prereg()
    v = evaluate(prereg, [scale_amendment()], ((500, 3.4623), (1000, 5.4940)))
    assert v.status == FINAL and v.delta == 2.0317
    assert [r.label for r in v.rules] == ["SAME-DRIFT", "AMBIGUOUS"]
    assert v.label == AMBIGUOUS_BY_INSTRUMENT
    assert "original says SAME-DRIFT" in v.interpretation
    # without the amendment the original rule alone decides
    assert evaluate(prereg, (), ((500, 3.4623), (1000, 5.4940))).label == "SAME-DRIFT"


@pytest.mark.parametrize(("delta", "original", "scaled", "label"), [
    (0.2000, "HEALTHY", "HEALTHY", "HEALTHY"),
    (0.6929, "AMBIGUOUS", "HEALTHY", AMBIGUOUS_BY_INSTRUMENT),
    (1.0838, "SAME-DRIFT", "HEALTHY", AMBIGUOUS_BY_INSTRUMENT),
    (1.0839, "SAME-DRIFT", "AMBIGUOUS", AMBIGUOUS_BY_INSTRUMENT),
    (3.6701, "SAME-DRIFT", "SAME-DRIFT", "SAME-DRIFT"),
    (3.6700, "SAME-DRIFT", "AMBIGUOUS", AMBIGUOUS_BY_INSTRUMENT),
])
def test_seed_table_of_deltas_under_both_rules(delta, original, scaled, label):
    v = evaluate(seed_prereg(), [scale_amendment()], ((500, 1.0), (1000, 1.0 + delta)))
    assert v.delta == delta
    assert [r.label for r in v.rules] == [original, scaled]
    assert v.label == label


def test_bound_is_exact_not_rounded_a_delta_of_1_0158_is_not_same_drift():
    v = evaluate(seed_prereg(), (), ((500, 1.0), (1000, 2.0158)))
    assert v.delta == 1.0158 and v.label == "AMBIGUOUS"  # 1.0158 < 1.01585
    assert evaluate(seed_prereg(), (), ((500, 1.0), (1000, 2.0159))).label == "SAME-DRIFT"


# -- rounding: once, exact, half-to-even -------------------------------------------------------------------


@pytest.mark.parametrize(("read", "delta", "label"), [
    (3.76234, 0.3000, "HEALTHY"),  # 0.30004 -> 0.3000 meets max 0.30
    (3.76235, 0.3000, "HEALTHY"),  # 0.30005 is an exact tie: half-to-even -> 0.3000 (pinned)
    (3.76236, 0.3001, "AMBIGUOUS"),
    (3.76245, 0.3002, "AMBIGUOUS"),  # 0.30015 tie -> 0.3002 (even)
])
def test_delta_rounded_once_half_to_even_on_the_exact_decimal_difference(read, delta, label):
    v = evaluate(seed_prereg(), (), ((500, 3.4623), (1000, read)))
    assert v.delta == delta
    assert v.label == label


def test_float_noise_never_decides_a_label():
    # 0.1 + 0.2 in floats is 0.30000000000000004; as written it is 0.3
    prereg = seed_prereg(bands=(Band("HEALTHY", max=expr.parse("0.1 + 0.2")),
                                Band("SAME-DRIFT", min=expr.parse("0.5 * demosonly"))))
    assert evaluate(prereg, (), ((500, 0.1), (1000, 0.4))).label == "HEALTHY"
    prereg2 = seed_prereg(bands=(Band("SAME-DRIFT", min=expr.parse("0.1 + 0.2")),))
    assert evaluate(prereg2, (), ((500, 0.1), (1000, 0.4))).label == "SAME-DRIFT"


@given(st.integers(min_value=-10**6, max_value=10**6), st.integers(min_value=-10**6, max_value=10**6))
def test_printed_delta_is_the_compared_delta(base_units, diff_units):
    baseline = base_units / 10**4
    read = (base_units + diff_units) / 10**4
    v = evaluate(seed_prereg(), (), ((500, baseline), (1000, read)))
    assert v.delta_exact == Fraction(f"{v.delta:.4f}")
    assert v.delta == diff_units / 10**4


# -- properties of bands and scaling -----------------------------------------------------------------------

bound_values = st.fractions(min_value=-100, max_value=100, max_denominator=10**4)


@given(st.lists(bound_values, min_size=2, max_size=5, unique=True), st.data())
def test_label_never_changes_while_the_delta_moves_inside_a_band(cuts, data):
    cuts = sorted(cuts)
    # contiguous bands [c0, c1], [c1, c2] ...: the first that holds wins, so c1 belongs to B0
    bands = tuple(RuleBand(f"B{i}", max=hi, min=lo) for i, (lo, hi) in enumerate(pairwise(cuts)))
    rule = Rule("r", bands, "OTHER")
    i = data.draw(st.integers(min_value=0, max_value=len(bands) - 1))
    lo, hi = bands[i].min, bands[i].max
    a = data.draw(st.fractions(min_value=lo, max_value=hi))
    b = data.draw(st.fractions(min_value=lo, max_value=hi))
    assume(i == 0 or lo not in (a, b))
    assert rule.classify(a) == rule.classify(b) == f"B{i}"
    # and outside every band: the otherwise label
    assert rule.classify(cuts[-1] + 1) == rule.classify(cuts[0] - 1) == "OTHER"


@given(st.lists(bound_values, min_size=1, max_size=6), st.fractions(min_value=Fraction(1, 1000), max_value=1000))
def test_a_positive_scale_keeps_band_order(values, scale):
    values = sorted(values)
    bands = tuple(RuleBand(f"B{i}", max=v) for i, v in enumerate(values))
    scaled = scale_bands(bands, scale)
    assert [b.max for b in scaled] == sorted(b.max for b in scaled)
    assert [b.label for b in scaled] == [b.label for b in bands]
    assert all(s.max == b.max * scale for s, b in zip(scaled, bands, strict=True))


@given(st.fractions(min_value=-50, max_value=50, max_denominator=10**6), st.sampled_from(["max", "min"]),
       st.integers(min_value=-500000, max_value=500000))
def test_shown_bound_judges_every_rounded_delta_like_the_exact_bound(bound, side, delta_units):
    shown, _ = shown_bound(bound, 4, side)
    d = Fraction(delta_units, 10**4)
    if side == "max":
        assert (d <= shown) == (d <= bound)
    else:
        assert (d >= shown) == (d >= bound)


# -- status ------------------------------------------------------------------------------------------------


def test_final_when_the_read_step_eval_exists():
    v = evaluate(seed_prereg(), (), series_with_delta(0.1))
    assert v.status == FINAL and v.at_step == 1000 and v.label == "HEALTHY"


def test_provisional_before_the_read_step_uses_the_latest_eval_at_or_before_at_step():
    v = evaluate(seed_prereg(), (), series_with_delta(2.0), at_step=900)
    assert v.status == PROVISIONAL and v.at_step == 750 and v.delta == 1.0
    assert v.to_json("r", "h")["status"] == PROVISIONAL


def test_provisional_while_the_log_has_not_reached_the_read_step():
    v = evaluate(seed_prereg(), (), series_with_delta(2.0)[:3])
    assert v.status == PROVISIONAL and v.at_step == 750


def test_at_step_past_the_read_step_still_reads_at_the_read_step():
    v = evaluate(seed_prereg(), (), (*series_with_delta(0.1), (1250, 99.0)), at_step=1500)
    assert v.status == FINAL and v.at_step == 1000 and v.delta == 0.1


def test_no_read_when_the_baseline_eval_is_missing():
    v = evaluate(seed_prereg(), (), ((250, 3.0), (750, 3.5), (1000, 4.0)))
    assert v.status == NO_READ and v.label is None
    assert "baseline_step 500" in v.reason and "interpolate" in v.reason
    assert v.to_json("r", "h")["reason"] == v.reason


def test_no_read_before_the_baseline_step():
    v = evaluate(seed_prereg(), (), series_with_delta(0.1), at_step=400)
    assert v.status == NO_READ and "before baseline_step" in v.reason


def test_no_read_when_the_read_eval_is_missing_but_later_evals_exist():
    v = evaluate(seed_prereg(), (), ((500, 3.0), (750, 3.5), (1250, 4.0)))
    assert v.status == NO_READ and "read_step 1000" in v.reason


def test_no_interpolation_an_eval_next_to_the_baseline_does_not_count():
    v = evaluate(seed_prereg(), (), ((499, 3.0), (1000, 3.1)))
    assert v.status == NO_READ


# -- corroboration -----------------------------------------------------------------------------------------


def test_train_delta_and_monotone_rise():
    train = ((500, 3.6862), (1000, 5.5962))
    v = evaluate(seed_prereg(), (), ((500, 3.4623), (750, 4.0), (1000, 5.4940)), train_series=train)
    assert v.corroboration.train_delta == 1.91 and v.corroboration.monotone_rise is True
    flat = evaluate(seed_prereg(), (), ((500, 3.4623), (750, 3.4623), (1000, 5.4940)))
    assert flat.corroboration.monotone_rise is False and flat.corroboration.train_delta is None


def test_monotone_rise_is_not_measured_with_fewer_than_two_evals():
    assert corroborate(seed_prereg(), {500: 3.0}, {}, 500).monotone_rise is None


@pytest.mark.parametrize("at_step", [None, 500, 600])
def test_no_provisional_read_at_the_baseline_step(at_step):
    """With only the baseline eval, Δ is 0 by construction: no read, never 'PROVISIONAL @500: Δ +0 → FLAT'."""
    v = evaluate(seed_prereg(), (), ((250, 3.9), (500, 3.0)), at_step=at_step)
    assert v.status == NO_READ and v.label is None and v.delta is None
    assert v.reason.startswith("only the baseline eval so far (step 500)")
    assert evaluate(seed_prereg(), (), ((500, 3.0), (750, 3.2))).status == PROVISIONAL  # the next eval reads


def test_corroboration_never_changes_the_label():
    a = evaluate(seed_prereg(), (), ((500, 1.0), (1000, 1.1)), train_series=((500, 1.0), (1000, 9.0)))
    b = evaluate(seed_prereg(), (), ((500, 1.0), (1000, 1.1)))
    assert a.label == b.label == "HEALTHY"


# -- JSON --------------------------------------------------------------------------------------------------

SPEC_KEYS = ["run", "status", "metric", "baseline_step", "read_step", "at_step", "baseline", "read", "delta",
             "rules", "label", "interpretation", "corroboration", "prereg_sha256", "amendments"]


def test_json_has_exactly_the_spec_section_5_shape():
    v = evaluate(seed_prereg(), [scale_amendment()], ((500, 3.4623), (1000, 5.4940)),
                 train_series=((500, 3.6862), (1000, 5.5962)))
    body = v.to_json("run", "abc")
    assert list(body) == SPEC_KEYS
    assert body["rules"] == [
        {"name": "original", "bounds": {"HEALTHY": {"max": 0.3}, "SAME-DRIFT": {"min": 1.01585}},
         "label": "SAME-DRIFT"},
        {"name": "amendment-1", "scale": 3.6128, "bounds": {"HEALTHY": {"max": 1.0838}, "SAME-DRIFT": {"min": 3.6701}},
         "label": "AMBIGUOUS"},
    ]
    assert body["corroboration"] == {"train_delta": 1.91, "monotone_rise": True}
    assert body["amendments"][0]["provenance_checked"] is False
    assert list(body["amendments"][0]) == ["n", "declared_at", "data_seen_through_step", "sha256",
                                           "provenance_checked"]


def test_json_numbers_are_rounded_to_precision():
    v = evaluate(seed_prereg(), (), ((500, 3.46234567), (1000, 3.66239999)))
    body = v.to_json("run", "abc")
    assert (body["baseline"], body["read"], body["delta"]) == (3.4623, 3.6624, 0.2001)


def test_fixture_result_compares_rounded_delta_and_label():
    from babysit.core.spec.prereg import Fixture

    prereg = seed_prereg(fixture=Fixture(Path("x"), 0.69294, "AMBIGUOUS"))
    ok = fixture_result(prereg, ((500, 1.2345), (1000, 1.9274)))
    assert ok.ok and ok.expected_delta == 0.6929
    bad = fixture_result(prereg, ((500, 1.2345), (1000, 1.9275)))
    assert not bad.ok and bad.got_delta == 0.693


# -- values at the edge of a float ------------------------------------------------------------------------


def test_a_delta_beyond_a_float_is_no_read_with_the_reason_never_an_overflow():
    verdict = evaluate(seed_prereg(), [scale_amendment()], ((500, -1.7e308), (1000, 1.7e308)))
    assert verdict.status == NO_READ and verdict.label is None and verdict.delta is None
    assert "beyond the range of a float" in verdict.reason and "1.7e+308" in verdict.reason
    assert verdict.to_json("r", None)["reason"] == verdict.reason


def test_huge_and_subnormal_values_that_subtract_to_a_float_are_read_exactly():
    assert evaluate(seed_prereg(), (), ((500, 1.7e308), (1000, 1.7e308))).label == "HEALTHY"
    tiny = evaluate(seed_prereg(), (), ((500, 1e-320), (1000, 2e-320)), train_series=((500, -1.7e308),
                                                                                       (1000, 1.7e308)))
    assert (tiny.status, tiny.delta, tiny.label) == (FINAL, 0.0, "HEALTHY")
    assert tiny.corroboration.train_delta is None, "a train delta beyond a float is not measured, not a crash"
