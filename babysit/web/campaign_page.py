"""A campaign's page (docs/campaigns.md): the suspect table, its runs, the banked references, the decision
log and the saga as SVG — every run's delta from its baseline on one axis, the bands shaded, the banked
references as lines. Pure: a `babysit.campaign.history.View` in, HTML out; every value escaped.

As in the PNG saga, a run read under an amendment's scale is drawn in its own units and says so.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from html import escape
from typing import Any
from urllib.parse import quote

from babysit.web import svg
from babysit.web.pages import campaign_href, esc, layout, run_href, utc

RUN_COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#7f7f7f")
BAND_FILL = ("#2ca02c", "#d62728", "#1f77b4", "#9467bd")


def saga_svg(view: Any) -> str:
    """Every run's delta curve on one panel, the first run's bands shaded, banked references as lines."""
    runs = [r for r in view.runs if r.curve]
    marks = [v for r in runs for _, v in r.curve] + [b.delta for b in view.campaign.banked] + [0.0]
    bands = next((r.bands for r in view.runs if r.bands), ())
    marks += [v for _, low, high in bands for v in (low, high) if v is not None]
    steps = [s for r in runs for s, _ in r.curve] or [0, 1]
    x_lo, x_hi = min(steps), max(steps)
    if x_lo == x_hi:
        x_lo, x_hi = x_lo - 1, x_hi + 1
    lo, hi = svg._range(marks, pad=0.12)
    p = svg._Panel(svg.TOP, x_lo, x_hi, lo, hi)
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" class="chart saga" viewBox="0 0 {svg.WIDTH} '
           f'{svg.TOP + svg.PANEL_H + 60}" role="img" aria-label="the saga of {escape(view.campaign.name)}">']
    out += svg._axes(p, "Δ from baseline")
    for i, (label, low, high) in enumerate(bands):
        top = p.y(high) if svg.fits(high) else p.top
        bottom = p.y(low) if svg.fits(low) else p.bottom
        out.append(f'<rect class="band" data-label="{escape(label)}" x="{p.left}" y="{top:.1f}" '
                   f'width="{p.right - p.left}" height="{max(0.0, bottom - top):.1f}" '
                   f'fill="{BAND_FILL[i % len(BAND_FILL)]}" fill-opacity="0.12"><title>{escape(label)}</title></rect>')
    labels: list[tuple[float, str, str]] = []
    for b in view.campaign.banked:
        if svg.fits(b.delta):
            y = p.y(b.delta)
            out.append(f'<line class="banked" x1="{p.left}" x2="{p.right}" y1="{y:.1f}" y2="{y:.1f}" stroke="#444" '
                       f'stroke-dasharray="8 4"><title>banked {escape(b.name)} {b.delta:+.4g}</title></line>')
            labels.append((y, f"banked {b.name} {b.delta:+.4g}", "#444444"))
    for i, r in enumerate(runs):
        colour = RUN_COLOURS[i % len(RUN_COLOURS)]
        held = r.outcome in ("pending", "suspended")  # its grid does not stand (yet): said, and drawn faded
        if r.outcome == "suspended":
            colour = "#999999"
        out += svg._curve(p, r.curve, f"run {r.outcome}" if held else "run", colour, r.name,
                          dashed=r.verdict_status != "FINAL" or held)
        last_value = r.curve[-1][1]
        if svg.fits(last_value):
            unit = f" (×{r.scale:.3g} units)" if r.scale else ""
            said = f" — {r.outcome.upper()}" if held else ""
            labels.append((p.y(last_value), f"{r.name}: {r.label or 'no read'}{unit}{said}", colour))
    out += svg._margin(labels, p)
    bottom_y = svg.TOP + svg.PANEL_H
    for t in svg.nice_ticks(x_lo, x_hi, 8):
        out.append(svg._text(p.x(t), bottom_y + 14, f"{t:g}", "tick", "middle"))
    out.append(svg._text((p.left + p.right) / 2, bottom_y + 30, "step", "axis-label", "middle"))
    if not runs:
        out.append(svg._text((p.left + p.right) / 2, p.top + svg.PANEL_H / 2, "no run has a delta yet", "empty",
                             "middle"))
    out.append("</svg>")
    return "\n".join(out)


def campaign_fragment(view: Any, has_png: bool, now: float) -> str:
    data = view.to_json()
    parts = [f'<h1>campaign <span class="run-name">{esc(data["campaign"])}</span></h1>',
             f'<blockquote class="question">{esc(data["question"])}</blockquote>',
             '<section id="saga"><h2>Saga</h2>', saga_svg(view)]
    if has_png:
        parts.append(f'<details id="saga-png"><summary>the saga chart the daemon drew (PNG)</summary>'
                     f'<img class="verdict-chart" alt="saga chart" src="{esc(campaign_href(view.campaign.name))}'
                     '/saga.png"></details>')
    parts.append("</section>")
    held = [r for r in data["runs"] if r["outcome"] in ("pending", "suspended")]
    if held:  # said before any table: a conclusion that does not stand must not be read as one
        items = "".join(f'<li class="{esc(r["outcome"])}"><strong>{esc(r["name"])}</strong> ({esc(r["label"])}): '
                        f'outcome {esc(r["outcome"].upper())} — {esc(r["outcome_why"])}</li>' for r in held)
        parts.append(f'<section id="outcomes"><h2>Outcomes that do not stand</h2><ul>{items}</ul></section>')
    parts.append(_table("suspects", ("suspect", "status", "declared", "moved by run", "by label", "held"),
                        [(s["name"], s["status"], s["declared"], s["by_run"], s["by_label"], "; ".join(s["held"]))
                         for s in data["suspects"]], links={3}))
    parts.append(_table("runs", ("run", "parent", "suspect", "what it changed", "state", "read", "label", "Δ", "scale",
                                 "outcome"),
                        [(r["name"], r["parent"], r["suspect"], r["changed"], r["state"], r["status"], r["label"],
                          None if r["delta"] is None else f"{r['delta']:+.4f}", r["scale"],
                          r["outcome"] and r["outcome"].upper()) for r in data["runs"]],
                        links={0, 1}))
    parts.append(_table("banked", ("reference", "Δ", "note"),
                        [(b["name"], f"{b['delta']:+.4f}", b["note"]) for b in data["banked"]]))
    parts.append(_table("decisions", ("run", "question", "options", "decision", "by", "at", "result"),
                        [(d["run"], d["question"], " / ".join(d["options"]), d["decision"] or "(open)",
                          d["decided_by"], utc(d["decided_at"]) if d["decided_at"] else None, d["result"])
                         for d in data["decisions"]], links={0}))
    parts.append(f'<p class="as-of">as of <time>{esc(utc(now))}</time></p>')
    return "".join(parts)


def campaign_page(view: Any, has_png: bool, footer: str) -> str:
    now = time.time()
    return layout(f"campaign {view.campaign.name}", campaign_fragment(view, has_png, now),
                  stream="/events?page=campaign&run=" + quote(view.campaign.name, safe=""), footer=footer)


def _table(name: str, headers: Sequence[str], rows: Sequence[Sequence[Any]],
           links: frozenset[int] | set[int] = frozenset()) -> str:
    if not rows:
        return f'<section id="{name}"><h2>{esc(name.capitalize())}</h2><p class="empty">none</p></section>'
    body = []
    for row in rows:
        cells = []
        for i, value in enumerate(row):
            text = "—" if value is None or value == "" else str(value)
            cells.append(f'<td><a href="{esc(run_href(text))}">{esc(text)}</a></td>' if i in links and text != "—"
                         else f"<td>{esc(text)}</td>")
        body.append(f"<tr>{''.join(cells)}</tr>")
    head = "".join(f"<th>{esc(h)}</th>" for h in headers)
    return (f'<section id="{name}"><h2>{esc(name.capitalize())}</h2><table class="{name}"><thead><tr>{head}</tr>'
            f"</thead><tbody>{''.join(body)}</tbody></table></section>")
