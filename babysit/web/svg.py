"""The run page's chart as inline SVG: the metric curve with the train metric beside it, and the delta
from baseline against the frozen bands, with the baseline/read steps and amendments marked.

Pure: a frozen `CurveChart` in, a string out. No CDN, no script, nothing fetched: the page works
offline and the chart is testable as XML. Every text that reaches the SVG (metric names, band labels,
amendment titles) is escaped here. Values that are not finite or beyond ±CLIP are left off the axes
and counted in the caption, as the PNG chart does (babysit/verdict/chart.py).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from html import escape
from typing import Any

Point = tuple[int, float]
CLIP = 1e15
WIDTH, PANEL_H, GAP, LEFT, RIGHT, TOP = 960, 220, 46, 70, 250, 30
REF_GAP = 11  # a reference's mark starts this far right of the panel: past the read's circle (r 8) on its edge
BAND_COLOURS = ("#2ca02c", "#d62728", "#1f77b4", "#9467bd", "#8c564b", "#e377c2")
AMENDMENT_COLOURS = ("#ff7f0e", "#17becf", "#bcbd22", "#7f7f7f")


@dataclass(frozen=True)
class Band:
    label: str
    low: float | None  # delta >= low
    high: float | None  # delta <= high


@dataclass(frozen=True)
class AmendedRule:
    name: str
    scale: float
    bands: tuple[Band, ...]


@dataclass(frozen=True)
class Mark:
    """An amendment, drawn at the last step whose data it had seen when declared."""

    n: int
    title: str
    step: int | None


@dataclass(frozen=True)
class CurveChart:
    metric: str
    series: tuple[Point, ...]
    train_metric: str | None = None
    train_series: tuple[Point, ...] = ()
    baseline_step: int | None = None
    read_step: int | None = None
    bands: tuple[Band, ...] = ()
    otherwise: str | None = None
    amended: tuple[AmendedRule, ...] = ()
    references: tuple[tuple[str, float], ...] = ()
    marks: tuple[Mark, ...] = ()
    status: str | None = None  # FINAL | PROVISIONAL | NO-READ | None (no prereg)
    at_step: int | None = None
    delta: float | None = None
    label: str | None = None


def as_float(value: float | int | Fraction | None) -> float | None:
    if value is None:
        return None
    try:
        return float(value)
    except OverflowError:
        return math.inf if value > 0 else -math.inf


def fits(value: float | None) -> bool:
    return value is not None and math.isfinite(value) and abs(value) <= CLIP


def chart_of(prereg: Any, verdict: Any, series: Sequence[Point], train: Sequence[Point],
             marks: Sequence[Mark] = ()) -> CurveChart:
    """The chart of a pre-registered run from its prereg, its verdict (babysit.core.verdict) and series."""
    original = verdict.rules[0]
    bands = tuple(Band(b.label, as_float(b.min), as_float(b.max)) for b in original.bands)
    amended = tuple(AmendedRule(r.name, as_float(r.scale) or 0.0,
                                tuple(Band(b.label, as_float(b.min), as_float(b.max)) for b in r.bands))
                    for r in verdict.rules[1:])
    return CurveChart(
        metric=prereg.metric, series=tuple(series), train_metric=prereg.train_metric, train_series=tuple(train),
        baseline_step=prereg.baseline_step, read_step=prereg.read_step, bands=bands,
        otherwise=original.otherwise, amended=amended,
        references=tuple((k, float(v)) for k, v in prereg.references.items()), marks=tuple(marks),
        status=verdict.status, at_step=verdict.at_step, delta=verdict.delta, label=verdict.label)


def nice_ticks(lo: float, hi: float, count: int = 5) -> list[float]:
    """Round tick values (1, 2 or 5 × 10^k apart) covering [lo, hi]."""
    span = hi - lo
    if not span > 0 or not math.isfinite(span):
        return [lo]
    raw = span / max(1, count)
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 5, 10) if m * mag >= raw)
    first = math.ceil(lo / step) * step
    return [round(first + i * step, 12) for i in range(int((hi - first) / step + 1e-9) + 1)]


def _range(values: Sequence[float], pad: float = 0.06) -> tuple[float, float]:
    good = [v for v in values if fits(v)]
    if not good:
        return -1.0, 1.0
    lo, hi = min(good), max(good)
    span = hi - lo
    if not span > 1e-300:
        return lo - 0.5, hi + 0.5
    return lo - pad * span, hi + pad * span


class _Panel:
    """One panel's pixel box and its data-to-pixel maps."""

    def __init__(self, top: float, x_lo: float, x_hi: float, y_lo: float, y_hi: float) -> None:
        self.top, self.bottom = top, top + PANEL_H
        self.left, self.right = LEFT, WIDTH - RIGHT
        self.x_lo, self.x_hi, self.y_lo, self.y_hi = x_lo, x_hi, y_lo, y_hi

    def x(self, step: float) -> float:
        return self.left + (step - self.x_lo) / ((self.x_hi - self.x_lo) or 1) * (self.right - self.left)

    def y(self, value: float) -> float:
        clamped = min(max(value, self.y_lo), self.y_hi)
        return self.bottom - (clamped - self.y_lo) / ((self.y_hi - self.y_lo) or 1) * (self.bottom - self.top)


def _n(v: float) -> str:
    return f"{v:.1f}"


def _text(x: float, y: float, text: str, cls: str, anchor: str = "start", fill: str | None = None) -> str:
    colour = f' fill="{fill}"' if fill else ""
    return (f'<text x="{_n(x)}" y="{_n(y)}" class="{cls}" text-anchor="{anchor}"{colour}>'
            f"{escape(text)}</text>")


def _axes(p: _Panel, ylabel: str) -> list[str]:
    out = [f'<rect class="frame" x="{p.left}" y="{_n(p.top)}" width="{p.right - p.left}" height="{PANEL_H}" '
           'fill="none" stroke="#bbb"/>']
    for t in nice_ticks(p.y_lo, p.y_hi):
        y = p.y(t)
        out.append(f'<line x1="{p.left}" x2="{p.right}" y1="{_n(y)}" y2="{_n(y)}" stroke="#eee"/>')
        out.append(_text(p.left - 6, y + 4, f"{t:.6g}", "tick", "end"))
    out.append(_text(14, p.top + PANEL_H / 2, ylabel, "axis-label", "middle").replace(
        "<text ", f'<text transform="rotate(-90 14 {_n(p.top + PANEL_H / 2)})" ', 1))
    return out


def _curve(p: _Panel, points: Sequence[Point], cls: str, colour: str, name: str, dashed: bool = False) -> list[str]:
    pts = [(s, v) for s, v in points if fits(v)]
    if not pts:
        return []
    path = " ".join(f"{_n(p.x(s))},{_n(p.y(v))}" for s, v in pts)
    dash = ' stroke-dasharray="5 3"' if dashed else ""
    out = [f'<polyline class="curve {cls}" points="{path}" fill="none" stroke="{colour}" stroke-width="2"{dash}/>']
    if len(pts) <= 200:  # a dot with a tooltip per eval; a long train curve stays a line
        out += [f'<circle class="point {cls}" cx="{_n(p.x(s))}" cy="{_n(p.y(v))}" r="3" fill="{colour}">'
                f"<title>{escape(name)} step {s}: {v:.6g}</title></circle>" for s, v in pts]
    return out


def _step_lines(c: CurveChart, p: _Panel, labelled: bool) -> list[str]:
    out = []
    for step, name in ((c.baseline_step, "baseline"), (c.read_step, "read")):
        if step is None:
            continue
        x = p.x(step)
        out.append(f'<line class="step-line {name}" x1="{_n(x)}" x2="{_n(x)}" y1="{_n(p.top)}" y2="{_n(p.bottom)}" '
                   'stroke="#555" stroke-dasharray="2 3"/>')
        if labelled:
            out.append(_text(x, p.top - 6, f"{name} {step}", "step-label", "middle"))
    for i, m in enumerate(c.marks):
        if m.step is None:
            continue
        x, colour = p.x(m.step), AMENDMENT_COLOURS[i % len(AMENDMENT_COLOURS)]
        out.append(f'<line class="amendment-mark" x1="{_n(x)}" x2="{_n(x)}" y1="{_n(p.top)}" y2="{_n(p.bottom)}" '
                   f'stroke="{colour}" stroke-dasharray="6 3"><title>amendment {m.n}: {escape(m.title)} '
                   f"(declared with data through step {m.step})</title></line>")
        if labelled:
            out.append(_text(x + 3, p.top + 12 + 12 * i, f"A{m.n}", "amendment-label", fill=colour))
    return out


def deltas(series: Sequence[Point], baseline_step: int | None) -> list[Point]:
    """Each value minus the value at baseline_step (empty without a finite baseline value)."""
    values = dict(series)
    base = values.get(baseline_step) if baseline_step is not None else None
    if base is None or not fits(base):
        return []
    return [(s, v - base) for s, v in sorted(values.items()) if fits(v)]


def render(c: CurveChart) -> str:
    """The whole chart: one panel without a prereg, two with one (the delta against the bands)."""
    steps = [s for s, _ in c.series] + [s for s, _ in c.train_series]
    steps += [s for s in (c.baseline_step, c.read_step, *(m.step for m in c.marks)) if s is not None]
    x_lo, x_hi = (min(steps), max(steps)) if steps else (0, 1)
    if x_hi == x_lo:
        x_lo, x_hi = x_lo - 1, x_hi + 1
    two = c.baseline_step is not None and c.read_step is not None
    height = TOP + PANEL_H + (GAP + PANEL_H if two else 0) + 60
    dropped = sum(1 for _, v in (*c.series, *c.train_series) if not fits(v))
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" class="chart" viewBox="0 0 {WIDTH} {height}" '
             f'role="img" aria-label="{escape(c.metric)} over steps">']

    top = _Panel(TOP, x_lo, x_hi, *_range([v for _, v in c.series]))
    parts += _axes(top, c.metric)
    if c.train_metric and c.train_series:  # its own scale, on the right: a train loss is not an eval error
        train_panel = _Panel(TOP, x_lo, x_hi, *_range([v for _, v in c.train_series]))
        parts += _curve(train_panel, c.train_series, "train", "#888888", c.train_metric, dashed=True)
        for t in nice_ticks(train_panel.y_lo, train_panel.y_hi):
            parts.append(_text(train_panel.right + 6, train_panel.y(t) + 4, f"{t:.4g}", "tick train-tick",
                               fill="#888888"))
    parts += _curve(top, c.series, "metric", "#000000", c.metric)
    parts += _step_lines(c, top, labelled=True)
    legend = [(c.metric, "#000000")] + ([(f"{c.train_metric} (right axis)", "#888888")]
                                        if c.train_metric and c.train_series else [])
    for i, (name, colour) in enumerate(legend):
        parts.append(_text(top.right + 50, top.top + 14 + 16 * i, name, "legend", fill=colour))
    if not c.series:
        parts.append(_text((top.left + top.right) / 2, top.top + PANEL_H / 2, f"no {c.metric} data in the log yet",
                           "empty", "middle"))

    bottom_y = TOP + PANEL_H
    if two:
        parts += _delta_panel(c, x_lo, x_hi)
        bottom_y += GAP + PANEL_H
    parts.append(_text((LEFT + WIDTH - RIGHT) / 2, bottom_y + 30, "step", "axis-label", "middle"))
    for t in nice_ticks(x_lo, x_hi, 8):
        parts.append(_text(top.x(t), bottom_y + 14, f"{t:g}", "tick", "middle"))
    if dropped:
        parts.append(_text(LEFT, bottom_y + 50, f"{dropped} value(s) not finite or beyond ±{CLIP:.0e}: not drawn",
                           "clipped-note", fill="#d62728"))
    parts.append("</svg>")
    return "\n".join(parts)


def _delta_panel(c: CurveChart, x_lo: float, x_hi: float) -> list[str]:
    ds = deltas(c.series, c.baseline_step)
    marks = [0.0, *(v for _, v in ds), *(v for _, v in c.references)]
    for b in (*c.bands, *(b for r in c.amended for b in r.bands)):
        marks += [v for v in (b.low, b.high) if v is not None]
    if c.delta is not None:
        marks.append(c.delta)
    p = _Panel(TOP + PANEL_H + GAP, x_lo, x_hi, *_range(marks, pad=0.12))
    out = _axes(p, f"Δ {c.metric}")
    labels: list[tuple[float, str, str]] = []
    for i, b in enumerate(c.bands):
        colour = BAND_COLOURS[i % len(BAND_COLOURS)]
        hi = p.y(b.high) if fits(b.high) else p.top
        lo = p.y(b.low) if fits(b.low) else p.bottom
        out.append(f'<rect class="band" data-label="{escape(b.label)}" x="{p.left}" y="{_n(hi)}" '
                   f'width="{p.right - p.left}" height="{_n(max(0.0, lo - hi))}" fill="{colour}" fill-opacity="0.13">'
                   f"<title>{escape(b.label)}{_bounds(b)}</title></rect>")
        for v, sign in ((b.high, "≤"), (b.low, "≥")):
            if fits(v):
                out.append(f'<line class="bound" x1="{p.left}" x2="{p.right}" y1="{_n(p.y(v))}" y2="{_n(p.y(v))}" '
                           f'stroke="{colour}"/>')
                labels.append((p.y(v), f"{b.label} {sign} {v:+.6g}", colour))
    for j, rule in enumerate(c.amended):
        colour = AMENDMENT_COLOURS[j % len(AMENDMENT_COLOURS)]
        for b in rule.bands:
            for v, sign in ((b.high, "≤"), (b.low, "≥")):
                if fits(v):
                    out.append(f'<line class="bound amended" x1="{p.left}" x2="{p.right}" y1="{_n(p.y(v))}" '
                               f'y2="{_n(p.y(v))}" stroke="{colour}" stroke-dasharray="6 3"/>')
                    text = f"{b.label} {sign} {v:+.4g} ({_short(rule.name)} ×{rule.scale:.3g})"
                    labels.append((p.y(v), text, colour))
    out.append(f'<line class="zero" x1="{p.left}" x2="{p.right}" y1="{_n(p.y(0))}" y2="{_n(p.y(0))}" stroke="#999"/>')
    # a banked reference Δ: a mark in the margin pointing at its height, clear of the curve and of the read's
    # circle (drawn at the read step, it sat on the final point whenever the run read what was banked)
    for name, v in c.references:
        if fits(v):
            y, x = p.y(v), p.right + REF_GAP
            out.append(f'<path class="reference" d="M {_n(x + 7)} {_n(y - 4)} L {_n(x)} {_n(y)} L {_n(x + 7)} '
                       f'{_n(y + 4)} Z" fill="#444"><title>reference {escape(name)} {v:+.6g}</title></path>')
            labels.append((y, f"ref {name} {v:+.4g}", "#444444"))
    out += _curve(p, ds, "delta", "#000000", f"Δ {c.metric}")
    if c.delta is not None and c.at_step is not None and fits(c.delta):
        tag = f"{c.status} " if c.status else ""
        x, y = p.x(c.at_step), p.y(c.delta)
        out.append(f'<circle class="verdict-point" cx="{_n(x)}" cy="{_n(y)}" r="8" fill="none" stroke="#d62728" '
                   f'stroke-width="2"><title>{escape(tag)}Δ {c.delta:+.6g}: {escape(c.label or "")}</title></circle>')
        out.append(_text(x - 10, y - 12, f"{tag}Δ {c.delta:+.4g} {c.label or ''}", "verdict-label", "end",
                         fill="#d62728"))
    out += _step_lines(c, p, labelled=False)
    out += _margin(labels, p)
    return out


def _short(rule_name: str) -> str:
    """amendment-2 -> A2: the margin is narrow."""
    return "A" + rule_name.rsplit("-", 1)[-1] if rule_name.startswith("amendment-") else rule_name


def _bounds(b: Band) -> str:
    parts = [f"Δ ≥ {b.low:+.6g}" if b.low is not None else "", f"Δ ≤ {b.high:+.6g}" if b.high is not None else ""]
    shown = " and ".join(x for x in parts if x)
    return f": {shown}" if shown else ""


def _margin(labels: list[tuple[float, str, str]], p: _Panel) -> list[str]:
    """Bound labels in the right margin at their height, pushed apart so none overlaps."""
    out, last = [], -math.inf
    for y, text, colour in sorted(labels):
        y = max(y, last + 13)
        last = y
        out.append(_text(p.right + REF_GAP + 10, y + 4, text, "bound-label", fill=colour))
    return out
