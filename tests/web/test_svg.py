"""The run page's SVG chart, parsed as XML: bands, steps, amendments, train curve, hostile text, odd values."""

from __future__ import annotations

import math
import xml.etree.ElementTree as ET

from hypothesis import given
from hypothesis import strategies as st

from babysit.web import svg

NS = {"s": "http://www.w3.org/2000/svg"}


def chart(**over: object) -> svg.CurveChart:
    base = dict(metric="eval_mae", series=((50, 0.19), (100, 0.2), (150, 0.25)), train_metric="train_mae",
                train_series=((50, 0.5), (100, 0.4), (150, 0.3)), baseline_step=50, read_step=150,
                bands=(svg.Band("HEALTHY", None, 0.005), svg.Band("SAME-DRIFT", 0.02, None)), otherwise="AMBIGUOUS",
                amended=(svg.AmendedRule("amendment-1", 2.5, (svg.Band("HEALTHY", None, 0.0125),)),),
                references=(("drift_ref", 0.04),), marks=(svg.Mark(1, "scale", 100),), status="FINAL",
                at_step=150, delta=0.06, label="SAME-DRIFT")
    base.update(over)
    return svg.CurveChart(**base)  # type: ignore[arg-type]


def parse(text: str) -> ET.Element:
    return ET.fromstring(text)


def by_class(root: ET.Element, cls: str) -> list[ET.Element]:
    return [e for e in root.iter() if cls in (e.get("class") or "").split()]


def test_a_prereg_chart_has_both_panels_the_bands_the_steps_and_the_read() -> None:
    root = parse(svg.render(chart()))
    assert [b.get("data-label") for b in by_class(root, "band")] == ["HEALTHY", "SAME-DRIFT"]
    assert len(by_class(root, "baseline")) == 2 and len(by_class(root, "read")) == 2  # a line on each panel
    assert by_class(root, "amendment-mark") and by_class(root, "amended")
    assert len(by_class(root, "verdict-point")) == 1
    texts = " ".join("".join(t.itertext()) for t in root.iter("{http://www.w3.org/2000/svg}text"))
    assert "baseline 50" in texts and "read 150" in texts and "FINAL Δ +0.06 SAME-DRIFT" in texts
    assert "ref drift_ref +0.04" in texts and "A1" in texts


def test_the_train_metric_is_drawn_beside_the_metric_on_its_own_axis() -> None:
    root = parse(svg.render(chart()))
    assert by_class(root, "metric") and by_class(root, "train") and by_class(root, "train-tick")
    assert "train_mae (right axis)" in svg.render(chart())


def test_the_delta_band_a_value_falls_in_is_the_one_drawn_around_it() -> None:
    """The SAME-DRIFT band (Δ ≥ 0.02) spans the read's circle; HEALTHY (Δ ≤ 0.005) lies below it."""
    root = parse(svg.render(chart()))
    point = by_class(root, "verdict-point")[0]
    cy = float(point.get("cy"))
    drift = next(b for b in by_class(root, "band") if b.get("data-label") == "SAME-DRIFT")
    healthy = next(b for b in by_class(root, "band") if b.get("data-label") == "HEALTHY")
    assert float(drift.get("y")) <= cy <= float(drift.get("y")) + float(drift.get("height"))
    assert float(healthy.get("y")) > cy  # lower on the page: a smaller delta


def test_every_text_is_escaped() -> None:
    hostile = '<script>alert(1)</script>&"'
    text = svg.render(chart(metric=hostile, bands=(svg.Band(hostile, 0.0, None),), marks=(svg.Mark(1, hostile, 60),),
                            references=((hostile, 0.1),), label=hostile))
    assert "<script>" not in text
    parse(text)  # still well-formed XML


def test_without_a_prereg_one_panel_and_no_bands() -> None:
    root = parse(svg.render(svg.CurveChart(metric="train_loss", series=((1, 2.0), (2, 1.5)))))
    assert not by_class(root, "band") and not by_class(root, "step-line")
    assert by_class(root, "metric")


def test_values_that_cannot_be_placed_are_counted_not_drawn() -> None:
    text = svg.render(chart(series=((50, 0.19), (100, math.nan), (120, 1e300), (150, 0.25))))
    assert "2 value(s) not finite or beyond ±1e+15: not drawn" in text
    parse(text)


def test_an_empty_series_says_so() -> None:
    assert "no eval_mae data in the log yet" in svg.render(chart(series=(), train_series=(), delta=None))


@given(st.lists(st.tuples(st.integers(-10**6, 10**6), st.floats(allow_nan=True, allow_infinity=True)), max_size=30),
       st.one_of(st.none(), st.floats()), st.one_of(st.none(), st.floats()))
def test_any_series_and_bounds_render_well_formed_svg(series: list, low: float | None, high: float | None) -> None:
    root = parse(svg.render(chart(series=tuple(series), bands=(svg.Band("B", low, high),), delta=None)))
    for element in root.iter():  # no NaN or infinite coordinate reaches an attribute
        for name, value in element.attrib.items():
            if name in ("x", "y", "x1", "x2", "y1", "y2", "cx", "cy", "width", "height"):
                assert math.isfinite(float(value)), (element.tag, name, value)
            if name == "points":
                assert all(math.isfinite(float(v)) for pair in value.split() for v in pair.split(","))


def test_nice_ticks_are_round_and_cover_the_range() -> None:
    assert svg.nice_ticks(0.0, 1.0) == [0.0, 0.2, 0.4, 0.6, 0.8, 1.0]
    assert svg.nice_ticks(3.0, 3.0) == [3.0]


def test_a_reference_is_marked_in_the_margin_not_on_the_read_s_point() -> None:
    """The run read exactly its banked reference (Δ +0.06, the drift reproduced): the reference's mark sat on
    the FINAL point at the read step, hiding it. It points from the margin now, right of the read's circle."""
    root = parse(svg.render(chart(references=(("drift_ref", 0.06),))))
    (point,) = by_class(root, "verdict-point")
    (ref,) = by_class(root, "reference")
    xs = [float(v) for v in ref.get("d").replace("M", " ").replace("L", " ").replace("Z", " ").split()[0::2]]
    right_of_circle = float(point.get("cx")) + float(point.get("r"))
    assert min(xs) > right_of_circle, (xs, right_of_circle)  # before: a line from cx - 10 to cx + 10
    texts = " ".join("".join(t.itertext()) for t in root.iter("{http://www.w3.org/2000/svg}text"))
    assert "ref drift_ref +0.06" in texts
