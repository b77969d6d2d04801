"""The saga chart (PNG): every run of the campaign as delta vs step from its baseline, the bands shaded,
the banked references as lines, an amended run with its own scale annotation, provisional parts dashed.

matplotlib is imported inside `render_saga` (Agg, no display) so `babysit --help` stays fast. The
chart never pretends unit comparability it does not have: a run read under an amendment's scale is
drawn in its own units, labelled with the scale, beside the bands × scale it is read against.
"""

from __future__ import annotations

from pathlib import Path

from babysit.campaign.history import RunView, View

_RUN_COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#7f7f7f")
_BAND_FILL = {"HEALTHY": "#2ca02c", "SAME-DRIFT": "#d62728"}


def render_saga(view: View, path: Path | str) -> Path:
    """Draw the saga to `path` (parents created); returns the path."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(12, 6.5))
    fig.subplots_adjust(left=0.08, right=0.70, top=0.84, bottom=0.1)
    drawn = [r for r in view.runs if r.curve]
    bands_of = next((r for r in reversed(drawn) if r.bands), None)
    ylo, yhi = _limits(view, drawn)
    ax.set_ylim(ylo, yhi)
    _shade_bands(ax, bands_of, ylo, yhi)
    for name, delta in sorted(view.campaign.references.items(), key=lambda kv: -kv[1]):
        ax.axhline(delta, color="#555555", lw=1, ls=":", zorder=1)
        ax.annotate(f"{name} {delta:+.4f} (banked)", xy=(1.0, delta), xycoords=("axes fraction", "data"),
                    xytext=(6, 0), textcoords="offset points", va="center", fontsize=8.5, color="#333333",
                    annotation_clip=False)
    for i, run in enumerate(drawn):
        _draw_run(ax, run, _RUN_COLOURS[i % len(_RUN_COLOURS)])
    ax.axhline(0, color="black", lw=0.8)
    ax.set_xlabel("step")
    metric = next((r.metric for r in drawn if r.metric), "metric")
    base = next((r.baseline_step for r in drawn if r.baseline_step is not None), None)
    ax.set_ylabel(f"Δ {metric} from step {base}" if base is not None else f"Δ {metric}")
    ax.grid(alpha=0.3)
    if drawn:
        ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.1), ncol=2, fontsize=8.5, framealpha=0.9)
    else:
        ax.text(0.5, 0.5, "no run of the campaign has a baseline eval yet", ha="center", va="center",
                transform=ax.transAxes, color="#777777")
    fig.text(0.02, 0.975, f"campaign {view.campaign.name}", ha="left", va="top", fontsize=11, color="#333333")
    fig.text(0.02, 0.945, view.campaign.question, ha="left", va="top", fontsize=13, fontweight="bold", wrap=True)
    table = "  ·  ".join(f"{s.name}: {s.status}" + "".join(f" ({h.split(' — ', 1)[0]})" for h in s.held)
                         for s in view.suspects)
    fig.text(0.02, 0.895, "suspects — " + table, ha="left", va="top", fontsize=9, color="#333333", wrap=True)
    fig.savefig(path, dpi=110, bbox_inches="tight", pad_inches=0.25)
    plt.close(fig)
    return path


def _limits(view: View, drawn: list[RunView]) -> tuple[float, float]:
    """The y range: every curve, banked reference and band edge (scaled ones too), padded."""
    values = [v for r in drawn for _, v in r.curve] + list(view.campaign.references.values()) + [0.0]
    for r in drawn:
        for _, lo, hi in r.bands:
            values += [e * (r.scale or 1.0) for e in (lo, hi) if e is not None]
            values += [e for e in (lo, hi) if e is not None]
    lo, hi = min(values), max(values)
    pad = 0.08 * ((hi - lo) or 1.0)
    return lo - pad, hi + pad


def _shade_bands(ax: object, run: RunView | None, ylo: float, yhi: float) -> None:
    if run is None:
        return
    for label, lo, hi in run.bands:
        colour = _BAND_FILL.get(label, "#1f77b4")
        if hi is not None and lo is None:
            ax.axhspan(ylo, hi, color=colour, alpha=0.08, zorder=0)  # type: ignore[attr-defined]
            ax.axhline(hi, color=colour, lw=1, ls="--", alpha=0.6)  # type: ignore[attr-defined]
        elif lo is not None and hi is None:
            ax.axhspan(lo, yhi, color=colour, alpha=0.08, zorder=0)  # type: ignore[attr-defined]
            ax.axhline(lo, color=colour, lw=1, ls="--", alpha=0.6)  # type: ignore[attr-defined]
        elif lo is not None and hi is not None:
            ax.axhspan(lo, hi, color=colour, alpha=0.08, zorder=0)  # type: ignore[attr-defined]
        edge = hi if hi is not None else lo
        ax.annotate(f"{label} band", xy=(0.0, edge), xycoords=("axes fraction", "data"), xytext=(4, 3),  # type: ignore[attr-defined]
                    textcoords="offset points", fontsize=8, color=colour)


def _draw_run(ax: object, run: RunView, colour: str) -> None:
    """Solid up to a FINAL read; dashed where the read is provisional; an amended run keeps its units."""
    steps = [s for s, _ in run.curve]
    values = [v for _, v in run.curve]
    final = run.verdict_status == "FINAL"
    read = run.read_step
    label = f"{run.name}"
    if run.label:
        label += f" → {run.label}" + ("" if final else " (PROVISIONAL)")
    if run.outcome in ("pending", "suspended"):  # its grid does not stand (yet): said, and drawn faded
        label += f"\n  {outcome_label(run)}"
        colour = "#999999" if run.outcome == "suspended" else colour
    if run.scale is not None:
        label += f"\n  own units: read against bands × {run.scale:.4g} (amendment scale)"
    cut = [i for i, s in enumerate(steps) if read is None or s <= read]
    solid = cut if final else []
    dashed = [i for i in range(len(steps)) if i not in solid or not final]
    if solid:
        ax.plot([steps[i] for i in solid], [values[i] for i in solid], "o-", color=colour, lw=2, ms=4,  # type: ignore[attr-defined]
                label=label, zorder=4)
    if dashed and not final:
        ax.plot([steps[i] for i in dashed], [values[i] for i in dashed], "o--", color=colour, lw=1.6, ms=3,  # type: ignore[attr-defined]
                alpha=0.9, label=label, zorder=4)
    elif final and len(cut) < len(steps):  # evals past the read step: shown, not part of the read
        tail = [cut[-1], *range(cut[-1] + 1, len(steps))] if cut else list(range(len(steps)))
        ax.plot([steps[i] for i in tail], [values[i] for i in tail], "--", color=colour, lw=1, alpha=0.6)  # type: ignore[attr-defined]
    if run.scale is not None and run.bands:
        for band_label, lo, hi in run.bands:
            for edge in (lo, hi):
                if edge is not None:
                    ax.axhline(edge * run.scale, color=colour, lw=1, ls="-.", alpha=0.7)  # type: ignore[attr-defined]
                    ax.annotate(f"{run.name}: {band_label} × {run.scale:.4g}", xy=(0.0, edge * run.scale),  # type: ignore[attr-defined]
                                xycoords=("axes fraction", "data"), xytext=(4, -10), textcoords="offset points",
                                fontsize=7.5, color=colour)
    if steps and run.delta is not None:
        ax.annotate(f"{run.delta:+.4f}", xy=(steps[cut[-1]] if cut else steps[-1],  # type: ignore[attr-defined]
                                             values[cut[-1]] if cut else values[-1]),
                    xytext=(6, 4), textcoords="offset points", fontsize=8.5, color=colour, fontweight="bold")


def outcome_label(run: RunView) -> str | None:
    """What the chart says of a run whose grid does not stand (yet); None: it stands or has none."""
    if run.outcome not in ("pending", "suspended"):
        return None
    return f"outcome {run.outcome.upper()}: {_short(run.outcome_why or '')}"


def _short(text: str, width: int = 60) -> str:
    return text if len(text) <= width else text[:width - 1] + "…"
