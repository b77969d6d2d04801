"""The verdict chart (PNG): the metric curve, and the delta from baseline against the frozen bands.

matplotlib is imported inside `render_chart` (Agg backend, no display) so `babysit --help` stays fast.
The chart never pretends unit comparability it does not have: each amendment's scaled bounds are drawn
as dashed lines with their scale written on them, and a read before read_step carries a PROVISIONAL
watermark.
"""

from __future__ import annotations

import textwrap
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from babysit.spec import Prereg
from babysit.verdict import FINAL, PROVISIONAL, Verdict, decimal_of, fmt_bound, fmt_delta

Series = Sequence[tuple[int, float]]

_BAND_COLOURS = ("#2ca02c", "#d62728", "#1f77b4", "#9467bd", "#8c564b", "#e377c2")
_AMENDMENT_COLOURS = ("#ff7f0e", "#17becf", "#bcbd22", "#7f7f7f")
_COMPARATOR_COLOURS = ("#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22")


def render_chart(path: Path | str, *, run: str, prereg: Prereg, series: Series, verdict: Verdict,
                 amendments: Sequence[Any] = (), comparators: Mapping[str, Series] | None = None,
                 train_series: Series = ()) -> Path:
    """Draw the two-panel verdict chart to `path` (parents created); returns the path."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    comparators = dict(comparators or {})
    p = prereg.precision
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(12, 8.5), sharex=True,
                                      gridspec_kw={"height_ratios": [1, 1.35], "hspace": 0.08})
    fig.subplots_adjust(left=0.08, right=0.74, top=0.83 if verdict.reason else 0.87, bottom=0.12)
    if verdict.requested_step is not None:  # as of step N: draw only what was known then
        series = [(s, v) for s, v in series if s <= verdict.requested_step]
        train_series = [(s, v) for s, v in train_series if s <= verdict.requested_step]

    _metric_panel(top, prereg, series, train_series, comparators, verdict)
    _delta_panel(bottom, prereg, series, comparators, verdict)
    for ax in (top, bottom):
        _step_lines(ax, prereg, verdict, labelled=ax is top)
    bottom.set_xlabel("step")
    steps = [s for s, _ in series] + [s for c in comparators.values() for s, _ in c]
    x_lo, x_hi = min([prereg.baseline_step, *steps]), max([prereg.read_step, *steps])
    margin = 0.04 * (x_hi - x_lo or 1)
    bottom.set_xlim(x_lo - margin, x_hi + margin)
    _band_legend(fig, bottom, verdict)

    status = verdict.status
    head = f"{verdict.label or 'no read'}  ({status})"
    if verdict.delta is not None:
        head += f"   Δ({verdict.at_step}) = {fmt_delta(verdict.delta, p)}"
    fig.text(0.02, 0.975, run, ha="left", va="top", fontsize=11, color="#333333")
    fig.text(0.02, 0.948, head, ha="left", va="top", fontsize=15, fontweight="bold",
             color="#d62728" if status != FINAL else "black")
    sub = f"Δ = {prereg.metric}(s) − {prereg.metric}({prereg.baseline_step}); read at step {prereg.read_step}"
    if verdict.reason:
        sub += "\n" + textwrap.fill(f"NO-READ: {verdict.reason}", 150)
    fig.text(0.02, 0.912, sub, ha="left", va="top", fontsize=9.5, color="#333333")
    if status == PROVISIONAL:
        fig.text(0.41, 0.5, "PROVISIONAL", fontsize=80, color="#d62728", alpha=0.13, rotation=28,
                 ha="center", va="center", fontweight="bold", zorder=0)
    fig.savefig(path, dpi=110, bbox_inches="tight", pad_inches=0.25)  # right-hand labels never clipped
    plt.close(fig)
    return path


def _metric_panel(ax: Any, prereg: Prereg, series: Series, train: Series, comparators: Mapping[str, Series],
                  verdict: Verdict) -> None:
    if series:
        xs, ys = zip(*series, strict=True)
        ax.plot(xs, ys, "o-", color="black", lw=2, ms=5, label=f"{prereg.metric} (this run)", zorder=5)
    if train:
        xs, ys = zip(*train, strict=True)
        ax.plot(xs, ys, "s--", color="#555555", lw=1, ms=3, alpha=0.7, label=f"{prereg.train_metric} (train slice)")
    for i, (name, comp) in enumerate(sorted(comparators.items())):
        if comp:
            xs, ys = zip(*comp, strict=True)
            ax.plot(xs, ys, "o-", color=_COMPARATOR_COLOURS[i % len(_COMPARATOR_COLOURS)], lw=1.3, ms=3,
                    alpha=0.85, label=f"{name} (compare)")
    if verdict.baseline is not None and verdict.read is not None and verdict.at_step is not None:
        ax.plot([verdict.at_step], [verdict.read], "o", ms=11, mfc="none", mec="#d62728", mew=2, zorder=6)
    ax.set_ylabel(prereg.metric)
    ax.grid(alpha=0.3)
    if not series:
        ax.text(0.5, 0.5, f"no {prereg.metric} data in the log", transform=ax.transAxes, ha="center",
                fontsize=12, color="#888888")
    handles, _ = ax.get_legend_handles_labels()
    if handles:
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8.5, frameon=False, borderaxespad=0)


def _delta_panel(ax: Any, prereg: Prereg, series: Series, comparators: Mapping[str, Series],
                 verdict: Verdict) -> None:
    p = prereg.precision
    original = verdict.rules[0]
    marks: list[float] = [0.0]
    for b in original.bands:
        marks += [float(v) for v in (b.max, b.min) if v is not None]
    for rule in verdict.rules[1:]:
        for b in rule.bands:
            marks += [float(v) for v in (b.max, b.min) if v is not None]
    marks += [float(v) for v in prereg.references.values()]
    deltas = _deltas(series, prereg.baseline_step)
    marks += [d for _, d in deltas]
    comp_deltas = {name: _deltas(c, prereg.baseline_step) for name, c in comparators.items()}
    for d in comp_deltas.values():
        marks += [v for _, v in d]
    lo, hi = min(marks), max(marks)
    pad = 0.12 * (hi - lo or 1.0)
    ylo, yhi = lo - pad, hi + pad
    ax.set_ylim(ylo, yhi)

    labels: list[tuple[float, str, str]] = []  # (y, text, colour) for the right margin
    for i, b in enumerate(original.bands):
        colour = _BAND_COLOURS[i % len(_BAND_COLOURS)]
        low = float(b.min) if b.min is not None else ylo
        high = float(b.max) if b.max is not None else yhi
        ax.axhspan(low, high, color=colour, alpha=0.12, lw=0, zorder=0)
        for key, side, v in (("≤", "max", b.max), ("≥", "min", b.min)):
            if v is not None:
                ax.axhline(float(v), color=colour, lw=1.4, zorder=1)
                labels.append((float(v), f"{b.label} {key} {fmt_bound(v, p, side)}", colour))
    for j, rule in enumerate(verdict.rules[1:]):
        colour = _AMENDMENT_COLOURS[j % len(_AMENDMENT_COLOURS)]
        n = rule.name.rsplit("-", 1)[-1]
        for b in rule.bands:
            for key, side, v in (("≤", "max", b.max), ("≥", "min", b.min)):
                if v is not None:
                    ax.axhline(float(v), color=colour, lw=1.4, ls="--", zorder=1)
                    shown = fmt_bound(v, p, side, exact=False)
                    labels.append((float(v), f"{b.label} {key} {shown}  ×{float(rule.scale):.3f} "
                                   f"(amendment {n})", colour))
    ax.axhline(0.0, color="#999999", lw=0.8)

    read_x = prereg.read_step
    for name, value in prereg.references.items():
        ax.plot([read_x], [value], marker="_", ms=22, mew=2.2, color="#444444", zorder=4, clip_on=False)
        labels.append((float(value), f"ref {name} {fmt_delta(value, p)}", "#444444"))

    if deltas:
        xs, ys = zip(*deltas, strict=True)
        ax.plot(xs, ys, "o-", color="black", lw=2, ms=5, zorder=5, label="Δ this run")
    for i, (name, d) in enumerate(sorted(comp_deltas.items())):
        if d:
            xs, ys = zip(*d, strict=True)
            ax.plot(xs, ys, "o-", color=_COMPARATOR_COLOURS[i % len(_COMPARATOR_COLOURS)], lw=1.3, ms=3,
                    alpha=0.85, label=f"Δ {name}")
    if verdict.delta is not None and verdict.at_step is not None:
        tag = "PROVISIONAL " if verdict.status == PROVISIONAL else ""
        ax.plot([verdict.at_step], [verdict.delta], "o", ms=11, mfc="none", mec="#d62728", mew=2, zorder=6)
        ax.annotate(f"{tag}Δ = {fmt_delta(verdict.delta, p)}\n{verdict.label}", (verdict.at_step, verdict.delta),
                    xytext=(-12, 12), textcoords="offset points", ha="right", fontsize=10, fontweight="bold",
                    color="#d62728", bbox={"boxstyle": "round,pad=0.3", "fc": "white", "ec": "#d62728", "alpha": 0.9},
                    zorder=7)
    ax.set_ylabel(f"Δ {prereg.metric} from step {prereg.baseline_step}")
    ax.grid(alpha=0.3)
    _margin_labels(ax, labels, ylo, yhi)


def _margin_labels(ax: Any, labels: list[tuple[float, str, str]], ylo: float, yhi: float) -> None:
    """Labels in the right margin at their y, nudged apart so none overlaps, each with a leader line."""
    if not labels:
        return
    span = yhi - ylo
    gap = 0.052 * span  # about one line of 8.5-pt text on this panel
    placed: list[float] = []
    for y, _, _ in sorted(labels):
        placed.append(max(y, placed[-1] + gap) if placed else y)
    overflow = placed[-1] - (yhi - gap / 2)
    if overflow > 0:  # pushed past the top: shift everything down, then re-space from the top
        placed = [y - overflow for y in placed]
        for i in range(len(placed) - 2, -1, -1):
            placed[i] = min(placed[i], placed[i + 1] - gap)
    trans = ax.get_yaxis_transform()  # x in axes fraction, y in data
    for (y, text, colour), ty in zip(sorted(labels), placed, strict=True):
        ax.annotate(text, xy=(1.0, y), xycoords=trans, xytext=(1.03, ty), textcoords=trans, va="center",
                    fontsize=8.5, color=colour, annotation_clip=False,
                    arrowprops={"arrowstyle": "-", "color": colour, "lw": 0.6})


def _band_legend(fig: Any, ax: Any, verdict: Verdict) -> None:
    """What the shading and the dashed lines mean, in one row under the chart."""
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    original = verdict.rules[0]
    handles = [Patch(color=_BAND_COLOURS[i % len(_BAND_COLOURS)], alpha=0.25, label=f"{b.label} (original rule)")
               for i, b in enumerate(original.bands)]
    handles.append(Patch(facecolor="white", edgecolor="#bbbbbb", label=f"{original.otherwise} (no band holds)"))
    for j, rule in enumerate(verdict.rules[1:]):
        handles.append(Line2D([], [], color=_AMENDMENT_COLOURS[j % len(_AMENDMENT_COLOURS)], ls="--",
                              label=f"{rule.name}: bounds ×{float(rule.scale):.3f}"))
    handles.append(Line2D([], [], color="#444444", marker="_", ms=14, mew=2, ls="none",
                          label="reference deltas (at read step)"))
    fig.legend(handles=handles, loc="lower center", bbox_to_anchor=(0.41, 0.0), ncol=min(len(handles), 3),
               fontsize=8.5, frameon=False)


def _step_lines(ax: Any, prereg: Prereg, verdict: Verdict, *, labelled: bool) -> None:
    trans = ax.get_xaxis_transform()
    for step, name in ((prereg.baseline_step, "baseline"), (prereg.read_step, "read")):
        ax.axvline(step, color="#555555", lw=1, ls=":", zorder=1)
        if labelled:
            ax.text(step, 1.01, f"{name} {step}", transform=trans, va="bottom", ha="center", fontsize=8.5,
                    color="#555555")
    if verdict.status != FINAL and verdict.at_step is not None and verdict.at_step != prereg.read_step:
        ax.axvline(verdict.at_step, color="#d62728", lw=1, ls="-.", alpha=0.6, zorder=1)


def _deltas(series: Series, baseline_step: int) -> list[tuple[int, float]]:
    """Each eval minus the eval at baseline_step, exactly; empty when there is no baseline eval."""
    values = dict(series)
    if baseline_step not in values:
        return []
    base = decimal_of(values[baseline_step])
    return [(s, float(decimal_of(v) - base)) for s, v in sorted(values.items())]
