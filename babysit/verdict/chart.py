"""The verdict chart (PNG): the metric curve, and the delta from baseline against the frozen bands.

matplotlib is imported inside `render_chart` (Agg backend, no display) so `babysit --help` stays fast.
The daemon draws its FINAL verdict's chart through `render_in_child` (`python -m babysit.verdict.chart`), so
matplotlib (~48 MB resident, never given back) never enters the long-lived daemon.
The chart never pretends unit comparability it does not have: each amendment's scaled bounds are drawn
as dashed lines with their scale written on them, and a read before read_step carries a PROVISIONAL
watermark.

A log can hold any number JSON can spell (1.7e308, 1e-320, 10**400). Matplotlib cannot place
1.7e308 and 1.0 on one axis (the span overflows), so every value is checked before it is drawn: one
beyond ±CLIP (or not finite) is drawn as a triangle at the panel's edge, labelled with its value, and
the subtitle says how many were clipped. The axes are set from the values that fit.
"""

from __future__ import annotations

import builtins
import copyreg
import io
import math
import os
import pickle
import subprocess
import sys
import textwrap
from collections.abc import Mapping, Sequence
from fractions import Fraction
from pathlib import Path
from types import MappingProxyType
from typing import Any

from babysit.core.fmt import fmt_delta
from babysit.core.render import scale_text
from babysit.core.spec.prereg import Prereg
from babysit.core.verdict import FINAL, PROVISIONAL, Verdict, decimal_of, fmt_bound

Series = Sequence[tuple[int, float]]
Point = tuple[int, float]

CLIP = 1e15  # |value| beyond this is drawn clipped at the panel's edge, never placed on the axis
TINY_SPAN = 1e-300  # a span under this (subnormals) is no span: the axis gets a unit one

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

    clipped = _metric_panel(top, prereg, series, train_series, comparators, verdict)
    clipped += _delta_panel(bottom, prereg, series, comparators, verdict)
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
        head += f"   Δ({verdict.at_step}) = {_fmt_delta(verdict.delta, p)}"
    fig.text(0.02, 0.975, run, ha="left", va="top", fontsize=11, color="#333333")
    fig.text(0.02, 0.948, head, ha="left", va="top", fontsize=15, fontweight="bold",
             color="#d62728" if status != FINAL else "black")
    sub = f"Δ = {prereg.metric}(s) − {prereg.metric}({prereg.baseline_step}); read at step {prereg.read_step}"
    if verdict.reason:
        sub += "\n" + textwrap.fill(f"NO-READ: {verdict.reason}", 150)
    if clipped:
        sub += (f"\n{clipped} value(s) beyond ±{CLIP:.0e} or not finite: drawn as triangles at the panel's edge, "
                "labelled with the logged value")
    fig.text(0.02, 0.912, sub, ha="left", va="top", fontsize=9.5, color="#333333")
    if status == PROVISIONAL:
        fig.text(0.41, 0.5, "PROVISIONAL", fontsize=80, color="#d62728", alpha=0.13, rotation=28,
                 ha="center", va="center", fontweight="bold", zorder=0)
    fig.savefig(path, dpi=110, bbox_inches="tight", pad_inches=0.25)  # right-hand labels never clipped
    plt.close(fig)
    return path


CHILD_TIMEOUT_SECONDS = 300.0  # matplotlib's import plus one chart: seconds; a wedged child is killed


class ChartError(Exception):
    """The chart child failed with an exception that is not a builtin one: `Type: message` as it said."""


def render_in_child(path: Path | str, *, timeout: float = CHILD_TIMEOUT_SECONDS, **kwargs: Any) -> Path:
    """`render_chart(path, **kwargs)` in a child process (`python -m babysit.verdict.chart`, the arguments
    pickled on its stdin), so matplotlib is never imported here. Raises what the child raised: a
    builtin exception as its own type (`IsADirectoryError: …`), else `ChartError('Type: message')`;
    the child's traceback is a note on it (the daemon log shows it)."""
    buf = io.BytesIO()
    pickler = pickle.Pickler(buf, protocol=pickle.HIGHEST_PROTOCOL)
    pickler.dispatch_table = {**copyreg.dispatch_table, MappingProxyType: _reduce_proxy}
    pickler.dump((str(path), kwargs))
    root = str(Path(__file__).resolve().parents[2])  # this babysit, whatever the child's cwd and sys.path
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")])),
           "MPLBACKEND": "Agg"}
    try:
        done = subprocess.run([sys.executable, "-m", "babysit.verdict.chart"], input=buf.getvalue(),
                              capture_output=True, timeout=timeout, env=env, check=False)
    except subprocess.TimeoutExpired as exc:
        raise ChartError(f"TimeoutExpired: the chart child ran over {timeout:.0f} s and was killed") from exc
    if done.returncode == 0:
        return Path(done.stdout.decode().strip() or path)
    try:
        name, message, trace = pickle.loads(done.stdout)
    except Exception:  # it died before it could say (killed, out of memory, an import that failed)
        tail = done.stderr.decode("utf-8", "replace").strip().splitlines()[-1:] or ["no output"]
        raise ChartError(f"the chart child exited {done.returncode}: {tail[0]}") from None
    kind = getattr(builtins, name, None)
    exc = kind(message) if isinstance(kind, type) and issubclass(kind, Exception) else ChartError(f"{name}: {message}")
    exc.add_note(f"in the chart child (python -m babysit.verdict.chart):\n{trace}")
    raise exc


def _reduce_proxy(proxy: MappingProxyType) -> tuple[Any, tuple[dict[Any, Any]]]:
    return _proxy, (dict(proxy),)  # the type itself is not importable by name: a function that makes one


def _proxy(items: dict[Any, Any]) -> MappingProxyType:
    return MappingProxyType(items)


def _child_main() -> int:
    """`python -m babysit.verdict.chart`: the pickled (path, arguments) of `render_chart` on stdin; prints the
    path, or pickles (type name, message, traceback) to stdout and exits 1."""
    import traceback

    path, kwargs = pickle.loads(sys.stdin.buffer.read())
    try:
        drawn = render_chart(path, **kwargs)
    except Exception as exc:
        sys.stdout.buffer.write(pickle.dumps((type(exc).__name__, str(exc), traceback.format_exc())))
        return 1
    sys.stdout.write(str(drawn))
    return 0


def _metric_panel(ax: Any, prereg: Prereg, series: Series, train: Series, comparators: Mapping[str, Series],
                  verdict: Verdict) -> int:
    """The metric over steps; returns how many values were clipped."""
    lines: list[tuple[list[Point], dict[str, Any]]] = [
        (_inside(series)[0], {"fmt": "o-", "color": "black", "lw": 2, "ms": 5, "zorder": 5,
                              "label": f"{prereg.metric} (this run)"}),
        (_inside(train)[0], {"fmt": "s--", "color": "#555555", "lw": 1, "ms": 3, "alpha": 0.7,
                             "label": f"{prereg.train_metric} (train slice)"}),
    ]
    for i, (name, comp) in enumerate(sorted(comparators.items())):
        lines.append((_inside(comp)[0], {"fmt": "o-", "color": _COMPARATOR_COLOURS[i % len(_COMPARATOR_COLOURS)],
                                         "lw": 1.3, "ms": 3, "alpha": 0.85, "label": f"{name} (compare)"}))
    outside = [pt for group in (series, train, *comparators.values()) for pt in _inside(group)[1]]
    read = None
    if verdict.baseline is not None and verdict.read is not None and verdict.at_step is not None:
        read = (verdict.at_step, verdict.read)
    ylo, yhi = _limits([v for pts, _ in lines for _, v in pts]
                       + ([read[1]] if read and _fits(read[1]) else []), pad=0.05)
    if outside or (read and not _fits(read[1])):
        ax.set_ylim(ylo, yhi)  # autoscale would take the clipped values into account: set it from the rest
    for pts, style in lines:
        if pts:
            xs, ys = zip(*pts, strict=True)
            fmt = style.pop("fmt")
            ax.plot(xs, ys, fmt, **style)
    if read is not None:
        ax.plot([read[0]], [_edge(read[1], ylo, yhi)], "o", ms=11, mfc="none", mec="#d62728", mew=2, zorder=6,
                clip_on=False)
    ax.set_ylabel(prereg.metric)
    ax.grid(alpha=0.3)
    if not series:
        ax.text(0.5, 0.5, f"no {prereg.metric} data in the log", transform=ax.transAxes, ha="center",
                fontsize=12, color="#888888")
    handles, _ = ax.get_legend_handles_labels()
    if handles:
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8.5, frameon=False, borderaxespad=0)
    _draw_clipped(ax, outside, ylo, yhi)
    return len(outside)


def _delta_panel(ax: Any, prereg: Prereg, series: Series, comparators: Mapping[str, Series],
                 verdict: Verdict) -> int:
    """Delta from baseline against the bands; returns how many deltas were clipped."""
    p = prereg.precision
    original = verdict.rules[0]
    marks: list[float] = [0.0]
    for rule in verdict.rules:
        for b in rule.bands:
            marks += [_float(v) for v in (b.max, b.min) if v is not None]
    marks += [_float(v) for v in prereg.references.values()]
    deltas, outside = _inside(_deltas(series, prereg.baseline_step))
    marks += [d for _, d in deltas]
    comp_deltas: dict[str, list[Point]] = {}
    for name, c in comparators.items():
        comp_deltas[name], more = _inside(_deltas(c, prereg.baseline_step))
        outside += more
    for d in comp_deltas.values():
        marks += [v for _, v in d]
    ylo, yhi = _limits([m for m in marks if _fits(m)], pad=0.12)
    ax.set_ylim(ylo, yhi)

    labels: list[tuple[float, str, str]] = []  # (y, text, colour) for the right margin
    for i, b in enumerate(original.bands):
        colour = _BAND_COLOURS[i % len(_BAND_COLOURS)]
        low = _edge(_float(b.min), ylo, yhi) if b.min is not None else ylo
        high = _edge(_float(b.max), ylo, yhi) if b.max is not None else yhi
        ax.axhspan(low, high, color=colour, alpha=0.12, lw=0, zorder=0)
        for key, side, v in (("≤", "max", b.max), ("≥", "min", b.min)):
            if v is not None and _fits(_float(v)):
                ax.axhline(float(v), color=colour, lw=1.4, zorder=1)
                labels.append((float(v), f"{b.label} {key} {fmt_bound(v, p, side)}", colour))
    for j, rule in enumerate(verdict.rules[1:]):
        colour = _AMENDMENT_COLOURS[j % len(_AMENDMENT_COLOURS)]
        n = rule.name.rsplit("-", 1)[-1]
        for b in rule.bands:
            for key, side, v in (("≤", "max", b.max), ("≥", "min", b.min)):
                if v is not None and _fits(_float(v)):
                    ax.axhline(float(v), color=colour, lw=1.4, ls="--", zorder=1)
                    shown = fmt_bound(v, p, side, exact=False)
                    labels.append((float(v), f"{b.label} {key} {shown}  ×{scale_text(float(rule.scale), p)} "
                                   f"(amendment {n})", colour))
    ax.axhline(0.0, color="#999999", lw=0.8)

    # a banked reference Δ: a mark on the right edge pointing at its height, never on the read's own point
    # (at the read step it hid the FINAL point whenever the run read what was banked)
    edge = ax.get_yaxis_transform()  # x in axes fraction, y in data
    for name, value in prereg.references.items():
        if not _fits(_float(value)):
            continue
        ax.plot([1.0], [value], marker="<", ms=8, color="#444444", zorder=4, clip_on=False, transform=edge)
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
        y = _edge(verdict.delta, ylo, yhi)
        ax.plot([verdict.at_step], [y], "o", ms=11, mfc="none", mec="#d62728", mew=2, zorder=6, clip_on=False)
        ax.annotate(f"{tag}Δ = {_fmt_delta(verdict.delta, p)}\n{verdict.label}", (verdict.at_step, y),
                    xytext=(-12, 12), textcoords="offset points", ha="right", fontsize=10, fontweight="bold",
                    color="#d62728", bbox={"boxstyle": "round,pad=0.3", "fc": "white", "ec": "#d62728", "alpha": 0.9},
                    zorder=7)
    ax.set_ylabel(f"Δ {prereg.metric} from step {prereg.baseline_step}")
    ax.grid(alpha=0.3)
    _margin_labels(ax, labels, ylo, yhi)
    _draw_clipped(ax, outside, ylo, yhi)
    return len(outside)


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
                              label=f"{rule.name}: bounds ×{scale_text(float(rule.scale), verdict.precision)}"))
    handles.append(Line2D([], [], color="#444444", marker="<", ms=8, ls="none",
                          label="banked reference deltas (right edge)"))
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


def _deltas(series: Series, baseline_step: int) -> list[tuple[int, float | Fraction]]:
    """Each eval minus the eval at baseline_step, exactly (a value that is not finite stays as it is);
    empty when there is no usable baseline eval."""
    values = dict(series)
    base_v = values.get(baseline_step)
    if base_v is None or not math.isfinite(_float(base_v)):
        return []
    base = decimal_of(base_v)
    return [(s, decimal_of(v) - base if math.isfinite(_float(v)) else _float(v)) for s, v in sorted(values.items())]


def _float(value: float | int | Fraction) -> float:
    """Any number as a float, never raising: ±inf beyond a float's range (10**400, an exact 3.4e308)."""
    try:
        return float(value)
    except OverflowError:
        return math.inf if value > 0 else -math.inf


def _fits(value: float) -> bool:
    """Drawable on an axis with ordinary values: finite and within ±CLIP."""
    return math.isfinite(value) and abs(value) <= CLIP


def _inside(series: Sequence[tuple[int, float | Fraction]]) -> tuple[list[Point], list[tuple[int, Any]]]:
    """(points that fit, as floats; points that are clipped, as logged: beyond ±CLIP, infinite or NaN)."""
    inside: list[Point] = []
    outside: list[tuple[int, Any]] = []
    for step, value in series:
        number = _float(value)
        if _fits(number):
            inside.append((step, number))
        else:
            outside.append((step, value))
    return inside, outside


def _limits(values: Sequence[float], *, pad: float) -> tuple[float, float]:
    """An axis range around values that fit: a span under TINY_SPAN (one value, subnormals) gets a unit one."""
    if not values:
        return -1.0, 1.0
    lo, hi = min(values), max(values)
    span = hi - lo
    if not span > TINY_SPAN:
        lo, hi, span = lo - 0.5, hi + 0.5, 1.0
    return lo - pad * span, hi + pad * span


def _edge(value: float | Fraction, ylo: float, yhi: float) -> float:
    """Where a value is drawn: itself when it fits, else the panel's edge on its side (NaN: the middle)."""
    number = _float(value)
    if _fits(number):
        return number
    if math.isnan(number):
        return (ylo + yhi) / 2
    return yhi if number > 0 else ylo


def _draw_clipped(ax: Any, points: Sequence[tuple[int, Any]], ylo: float, yhi: float) -> None:
    """Clipped values as triangles at the panel's edge, each labelled with the value logged."""
    for step, value in points:
        y = _edge(value, ylo, yhi)
        up = not value < 0  # NaN counts as up
        ax.plot([step], [y], "^" if up else "v", ms=9, color="#d62728", zorder=8, clip_on=False)
        ax.annotate(f"{_short(value)} (clipped)", (step, y), xytext=(6, -10 if up else 4),
                    textcoords="offset points", fontsize=8, color="#d62728", annotation_clip=False)


def _short(value: float | Fraction) -> str:
    """Three significant digits of any number, also of an exact one beyond a float's range (-3.4e+308)."""
    if isinstance(value, Fraction) and not math.isfinite(_float(value)):
        import decimal

        with decimal.localcontext() as ctx:
            ctx.prec = 3
            return f"{decimal.Decimal(value.numerator) / decimal.Decimal(value.denominator):.3g}"
    return f"{_float(value):.3g}"


def _fmt_delta(value: float, precision: int) -> str:
    """fmt_delta, but a huge delta in 4 significant digits rather than 300 digits across the chart."""
    return fmt_delta(value, precision) if abs(value) < CLIP else f"{value:+.4g}"


if __name__ == "__main__":
    sys.exit(_child_main())
