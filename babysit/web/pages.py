"""The web pages as HTML strings: pure functions of what babysit/web/data.py read.

Every value that came from a run (its name, profile, log values, incident texts, prereg, verdict
JSON) goes through `esc` here, and the server sends a Content-Security-Policy that forbids inline
script: a run name with `<script>` in it is shown as text. The cells are the ones `babysit status`
prints (babysit/view/runtable.py), so the page and the terminal say the same thing the same way.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from html import escape
from typing import Any
from urllib.parse import quote

from babysit.core.fmt import MISSING, fmt_delta, fmt_gib
from babysit.core.verdict import AMBIGUOUS_BY_INSTRUMENT
from babysit.db.store import Attempt
from babysit.view.runtable import NONE, cells, fmt_duration
from babysit.view.runview import RunRow
from babysit.web import svg
from babysit.web.data import IncidentEntry, RunDetail

COLUMNS = (("RUN", "run"), ("STATE", "state"), ("ATTEMPT", "attempt"), ("STEP", "step"), ("S/STEP", "sps"),
           ("ETA", "eta"), ("GPU", "gpu"), ("GPU-H", "gpu-hours"), ("LAST POLL", "last-poll"),
           ("LAST INCIDENT / END", "last-incident"), ("VERDICT", "verdict"))
HEADERS = {"RUN": "run", "STATE": "state", "ATTEMPT": "attempt · profile", "STEP": "step", "S/STEP": "s/step",
           "ETA": "ETA", "GPU": "GPU util", "GPU-H": "GPU-hours / cap", "LAST POLL": "last poll",
           "LAST INCIDENT / END": "last incident / end", "VERDICT": "verdict"}


def esc(value: Any) -> str:
    return escape("" if value is None else str(value), quote=True)


def run_href(name: str) -> str:
    return "/run/" + quote(name, safe="")


def campaign_href(name: str) -> str:
    return "/campaign/" + quote(name, safe="")


def utc(at: float | None) -> str:
    return NONE if at is None else time.strftime("%Y-%m-%d %H:%M:%SZ", time.gmtime(at))


def layout(title: str, body: str, *, stream: str | None = None, footer: str = "") -> str:
    """A whole page; with `stream`, app.js replaces <main> with each update the server sends there."""
    live = f' data-stream="{esc(stream)}"' if stream else ""
    return (
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
        f"<title>{esc(title)} · babysit</title>"
        "<link rel=\"stylesheet\" href=\"/static/app.css\"><script src=\"/static/app.js\" defer></script>"
        "</head><body>"
        "<header><a class=\"home\" href=\"/\">babysit</a> <span class=\"ro\">read-only</span>"
        " <a href=\"/metrics\">/metrics</a>"
        f" <span id=\"conn\" class=\"conn\">{'live' if stream else ''}</span></header>"
        f"<main id=\"live\"{live}>{body}</main>"
        f"<footer>{esc(footer)}</footer></body></html>\n"
    )


# -- the runs table ------------------------------------------------------------------------------------
def verdict_html(row: RunRow, text: str) -> str:
    """The verdict cell with its status as a badge: a PROVISIONAL read never looks like the verdict."""
    v = row.verdict
    if v is None or not v.status or text == NONE:
        return NONE
    rest = text[len(v.status):] if text.startswith(v.status) else text
    return badge(v.status, v.label) + esc(rest)


def badge(status: str, label: str | None) -> str:
    """A read's status as a badge: green only for a FINAL read that concludes; a FINAL AMBIGUOUS-BY-INSTRUMENT
    (the rules disagree: nothing is claimed) is grey, as is said on hover."""
    kind = {"FINAL": "final", "PROVISIONAL": "provisional"}.get(status, "noread")
    if status == "FINAL" and label == AMBIGUOUS_BY_INSTRUMENT:
        return (f'<span class="badge final undecided" title="the FINAL read: the rules disagree, so it concludes '
                f'nothing">{esc(status)}</span>')
    return f'<span class="badge {kind}">{esc(status)}</span>'


def degraded_html(banner: str | None) -> str:
    """The banner above a page read from the box's mirror (PostgreSQL unreachable): since when, and that
    other boxes' runs are not shown (babysit/db/mirror_view.py words it, for `babysit status` too)."""
    return f'<div class="degraded" role="alert">{esc(banner)}</div>' if banner else ""


def runs_fragment(rows: Sequence[RunRow], now: float, campaigns: Sequence[str] = (),
                  quarantined: Sequence[str] = (), banner: str | None = None) -> str:
    """What the runs page streams: the mirror's banner (PostgreSQL unreachable), the campaigns (when there
    are), quarantined GPUs, the table and when it was read."""
    above = degraded_html(banner)
    if campaigns:
        links = ", ".join(f'<a href="{esc(campaign_href(n))}">{esc(n)}</a>' for n in campaigns)
        above = f'<p class="campaigns">campaigns: {links}</p>'
    if quarantined:
        items = "".join(f"<li>{esc(line)}</li>" for line in quarantined)
        above += (f'<div class="quarantine"><p>quarantined GPUs (<code>babysit gpu release UUID</code> lifts one):'
                  f"</p><ul>{items}</ul></div>")
    if not rows:
        return (f"<h1>Runs</h1>{above}<p class=\"empty\">no runs registered yet; <code>babysit register RUN.toml"
                "</code> adds one</p>" + _as_of(now))
    head = "".join(f'<th class="{css}">{esc(HEADERS[col])}</th>' for col, css in COLUMNS)
    body = []
    for row in rows:
        c = cells(row, now)
        tds = []
        for col, css in COLUMNS:
            if col == "RUN":
                inner = f'<a href="{esc(run_href(row.run))}">{esc(row.run)}</a>'
                if row.note:
                    inner += f'<div class="note">{esc(row.note)}</div>'
            elif col == "VERDICT":
                inner = verdict_html(row, c[col])
            elif col == "STATE":
                inner = f'<span class="state {esc(row.status)}">{esc(row.status)}</span>'
            else:
                inner = esc(c[col])
            tds.append(f'<td class="{css}">{inner}</td>')
        step = "" if row.step is None else f' data-step="{row.step}"'
        body.append(f'<tr data-run="{esc(row.run)}"{step}>{"".join(tds)}</tr>')
    return (f"<h1>Runs <small>{len(rows)}</small></h1>{above}<table id=\"runs\"><thead><tr>{head}</tr></thead>"
            f"<tbody>{''.join(body)}</tbody></table>" + _as_of(now))


def runs_page(rows: Sequence[RunRow], now: float, footer: str, campaigns: Sequence[str] = (),
              quarantined: Sequence[str] = (), banner: str | None = None) -> str:
    return layout("runs", runs_fragment(rows, now, campaigns, quarantined, banner), stream="/events?page=runs",
                  footer=footer)


def _as_of(now: float) -> str:
    return f'<p class="as-of">as of <time>{esc(utc(now))}</time></p>'


# -- one run -------------------------------------------------------------------------------------------
def run_fragment(d: RunDetail, now: float) -> str:
    row = d.row
    c = cells(row, now)
    facts = "".join(f"<tr><th>{esc(HEADERS[col])}</th><td class=\"{css}\">"
                    f"{verdict_html(row, c[col]) if col == 'VERDICT' else esc(c[col])}</td></tr>"
                    for col, css in COLUMNS[1:])
    parts = [f'<h1><span class="run-name">{esc(row.run)}</span> '
             f'<span class="state {esc(row.status)}">{esc(row.status)}</span></h1>{degraded_html(d.banner)}']
    if row.note:
        parts.append(f'<p class="note">{esc(row.note)}</p>')
    parts.append(f'<table class="facts">{facts}</table>')
    parts.append("<section id=\"curve\"><h2>Curve</h2>")
    if d.chart is not None:
        parts.append(svg.render(d.chart))
    if d.chart_note:
        parts.append(f'<p class="note">{esc(d.chart_note)}</p>')
    parts.append("</section>")
    parts.append(_nodes_section(d))
    parts.append(_verdict_section(d))
    parts.append(_incidents_section(d.incidents, now))
    parts.append(_attempts_section(d.attempts, now))
    parts.append(_prereg_section(d))
    parts.append(_as_of(now))
    return "".join(parts)


def run_page(d: RunDetail, now: float, footer: str) -> str:
    return layout(d.row.run, run_fragment(d, now), stream="/events?page=run&run=" + quote(d.row.run, safe=""),
                  footer=footer)


def _nodes_section(d: RunDetail) -> str:
    """A job across nodes: one row a node, as its latest poll saw it (the poll's node lines, as a table)."""
    if not d.nodes or d.nodes_poll is None:
        return ""
    rows = []
    for n in d.nodes:
        util = "" if not n.gpus else MISSING if n.gpu_util_pct is None else f"{n.gpu_util_pct:.0f} %"
        quiet = "" if n.quiet_seconds is None or n.seconds_per_step is None or \
            n.quiet_seconds <= max(10.0, 10 * n.seconds_per_step) else f"no step for {fmt_duration(n.quiet_seconds)}"
        rows.append(f'<tr data-node="{esc(n.node)}"><td class="node">{esc(n.node)}</td>'
                    f"<td>{esc(', '.join(map(str, n.ranks)) or MISSING)}</td>"
                    f"<td>{esc(MISSING if n.step is None else n.step)}</td>"
                    f"<td>{esc(MISSING if n.seconds_per_step is None else f'{n.seconds_per_step:.3g}')}</td>"
                    f'<td class="gpu">{esc(util)}</td><td class="ram">{esc(fmt_gib(n.available_ram_bytes))}</td>'
                    f'<td class="note">{esc(quiet)}</td></tr>')
    head = "".join(f"<th>{h}</th>" for h in ("node", "ranks", "step", "s/step", "GPU util", "free RAM", ""))
    when = f"attempt {d.nodes_poll.attempt}, poll of {utc(d.nodes_poll.at)}"
    return (f'<section id="nodes"><h2>Nodes <small>{len(d.nodes)}</small></h2><p class="note">{esc(when)}</p>'
            f'<table class="nodes"><thead><tr>{head}</tr></thead><tbody>{"".join(rows)}</tbody></table></section>')


def _verdict_section(d: RunDetail) -> str:
    out = ['<section id="verdict"><h2>Verdict</h2>']
    v = d.verdict
    if v is None:
        out.append('<p class="empty">no read yet</p></section>')
        return "".join(out)
    status = str(v.get("status") or "")
    where = f" at step {v.get('at_step')}" if v.get("at_step") is not None else ""
    out.append(f'<p class="read">{badge(status, v.get("label"))} '
               f'<strong>{esc(v.get("label") or "no read")}</strong>{esc(where)}'
               + (f" · Δ {esc(fmt_delta(v['delta']))}" if isinstance(v.get("delta"), (int, float)) else "")
               + "</p>")  # signed, 4 decimals: as the runs table and `babysit status` show it
    if status == "PROVISIONAL":
        out.append('<p class="note">PROVISIONAL: read before the read step; the verdict is the FINAL read</p>')
    if v.get("interpretation"):
        out.append(f'<p class="interpretation">{esc(v["interpretation"])}</p>')
    if v.get("reason"):
        out.append(f'<p class="note">{esc(v["reason"])}</p>')
    if d.has_chart_png:
        out.append(f'<img class="verdict-chart" alt="the FINAL verdict chart" '
                   f'src="{esc(run_href(d.row.run))}/verdict.png">')
    out.append(f'<details id="verdict-json"><summary>verdict JSON</summary><pre class="json">'
               f"{esc(json.dumps(v, indent=2, ensure_ascii=False))}</pre></details></section>")
    return "".join(out)


def _incidents_section(items: Sequence[IncidentEntry], now: float) -> str:
    if not items:
        return '<section id="incidents"><h2>Incidents</h2><p class="empty">none</p></section>'
    lis = "".join(
        f'<li class="incident" data-kind="{esc(i.kind)}"><time>{esc(utc(i.at))}</time> '
        f'<span class="ago">({esc(fmt_duration(max(0.0, now - i.at)))} ago)</span> '
        f'<span class="attempt">{"attempt " + esc(i.attempt) if i.attempt is not None else "run"}</span> '
        f'<span class="kind">{esc(i.kind)}</span><div class="text">{esc(i.text)}</div></li>'
        for i in items)
    return (f'<section id="incidents"><h2>Incidents <small>{len(items)}</small></h2>'
            f'<ol class="timeline">{lis}</ol></section>')


def _attempts_section(attempts: Sequence[Attempt], now: float) -> str:
    if not attempts:
        return '<section id="attempts"><h2>Attempts</h2><p class="empty">none launched</p></section>'
    rows = []
    for a in attempts:
        exit_ = NONE if a.exit_code is None and a.exit_signal is None else (
            f"signal {a.exit_signal}" if a.exit_signal is not None else f"exit {a.exit_code}")
        took = None if a.started_at is None else (a.ended_at or now) - a.started_at
        reason = a.detail.get("reason") or a.detail.get("message") or ""
        rows.append(
            f'<tr data-attempt="{a.n}"><td>{a.n}</td><td class="profile">{esc(a.profile)}</td>'
            f"<td>{esc(a.status)}</td><td class=\"outcome\">{esc(a.outcome or NONE)}</td><td>{esc(exit_)}</td>"
            f"<td>{esc(utc(a.started_at))}</td><td>{esc(utc(a.ended_at))}</td><td>{esc(fmt_duration(took))}</td>"
            f"<td>{esc(a.executor)}{' ' + esc(a.job_id) if a.job_id else ''}</td><td>{a.gpus}</td>"
            f"<td><code>{esc(' '.join(a.argv))}</code>{'<div class=note>' + esc(reason) + '</div>' if reason else ''}"
            "</td></tr>")
    head = "".join(f"<th>{h}</th>" for h in ("#", "profile", "status", "outcome", "exit", "started", "ended",
                                              "took", "executor", "GPUs", "command"))
    return (f'<section id="attempts"><h2>Attempts</h2><table class="attempts"><thead><tr>{head}</tr></thead>'
            f"<tbody>{''.join(rows)}</tbody></table></section>")


def _prereg_section(d: RunDetail) -> str:
    out = ['<section id="prereg"><h2>Pre-registration</h2>']
    info = d.prereg
    if info is None:
        out.append(f'<p class="empty">{esc(d.prereg_note or "no [prereg]")}</p></section>')
        return "".join(out)
    question = (info.get("prereg") or {}).get("question")
    if question:
        out.append(f'<blockquote class="question">{esc(question)}</blockquote>')
    state = ('<span class="badge final">FROZEN</span> the run.toml\'s [prereg] still hashes to what '
             "<code>register</code> recorded" if info["matches"] else
             '<span class="badge tampered">TAMPERED</span> the [prereg] was edited after registration: '
             "no verdict is read from it")
    out.append(f"<p>{state}</p><table class=\"hashes\">"
               f"<tr><th>registered sha256</th><td><code>{esc(info['prereg_sha256_registered'] or NONE)}</code>"
               "</td></tr>"
               f"<tr><th>current sha256</th><td><code>{esc(info['prereg_sha256_current'] or NONE)}</code></td></tr>"
               f"<tr><th>registered at</th><td>{esc(info['registered_at'])}</td></tr></table>")
    out.append("<details id=\"prereg-json\"><summary>[prereg] as canonical JSON</summary><pre class=\"json\">"
               f"{esc(json.dumps(info['prereg'], indent=2, sort_keys=True, ensure_ascii=False))}</pre></details>")
    chain = info.get("amendments") or []
    if not chain:
        out.append('<p class="empty">amendments: none</p>')
    else:
        items = []
        for a in chain:
            ok = '<span class="badge final">chain ok</span>' if a["chain_ok"] else (
                '<span class="badge tampered">CHAIN BROKEN</span> ' + esc("; ".join(a["problems"])))
            seen = a["data_seen_through_step"]
            items.append(
                f'<li class="amendment" data-n="{esc(a["n"])}">'
                f'<strong>amendment {esc(a["n"])}: {esc(a["title"])}</strong>'
                f" {ok}<div>declared {esc(a['declared_at'])}, data seen through step "
                f"{esc(seen if seen is not None else NONE)}</div>"
                f"<div class=\"hash\">sha256 <code>{esc(a['sha256'])}</code> ← prev "
                f"<code>{esc(a['prev_sha256'] or '(none)')}</code></div><pre>{esc(a['text'])}</pre></li>")
        out.append(f'<h3>Amendments (hash chain)</h3><ol class="chain">{"".join(items)}</ol>')
    out.append('<p class="note">re-derive: sha256(canonical) must equal the registered sha; amendment k\'s sha256 '
               "is sha256(prev_sha256 + '\\n' + text), prev_sha256 of amendment 1 empty (docs/verdicts.md)</p>")
    out.append("</section>")
    return "".join(out)


def not_found(what: str, footer: str) -> str:
    return layout("not found", f'<h1>Not found</h1><p class="empty">{esc(what)}</p><p><a href="/">all runs</a></p>',
                  footer=footer)


def error_fragment(message: str) -> str:
    return f'<p class="error">{esc(message)}</p>'


def unreachable_fragment(message: str, hint: str | None) -> str:
    """The store cannot be read at all (PostgreSQL unreachable and this box has no mirror): said, not a 500."""
    return (f'<h1>Runs</h1><div class="degraded" role="alert">{esc(message)}</div>'
            + (f'<p class="note">{esc(hint)}</p>' if hint else ""))

