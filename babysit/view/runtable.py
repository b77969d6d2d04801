"""How runs are shown, in one place: the `status` table, the live table, the one-line change.

All three are built from the same cells (`cells`), so `babysit status`, `/babysit status`,
`status --watch` and the live view of `babysit up` say the same thing the same way. Plain text here;
rich is imported only by `live_table`, so `babysit status` stays fast.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from babysit.core import progress
from babysit.core.fmt import fmt_duration, hours
from babysit.view.runview import RunRow

NONE = "—"
COLUMNS = ("RUN", "STATE", "ATTEMPT", "STEP", "S/STEP", "ETA", "GPU", "GPU-H", "LAST INCIDENT / END", "VERDICT")
_RIGHT = {"STEP", "S/STEP", "ETA", "GPU", "GPU-H", "LAST POLL"}
_STATE_STYLE = {"running": "green", "stopping": "yellow", "retrying": "yellow", "finished": "cyan",
                "failed": "bold red", "stopped": "magenta", "refused": "bold red"}



def _ago(at: float | None, now: float) -> str:
    return NONE if at is None else fmt_duration(max(0.0, now - at)) + " ago"


def cells(row: RunRow, now: float) -> dict[str, str]:
    """Every column of a run as text; "—" where nothing is known (never a zero that was not measured)."""
    attempt = NONE
    if row.attempt is not None:
        attempt = f"{row.attempt}/{row.max_attempts}" if row.max_attempts else str(row.attempt)
        if row.profile:
            attempt += f" {row.profile}"
    p = row.progress  # said in core/progress.py's words, as polls say it
    step, sps, eta = progress.step_text(p), progress.pace_text(p), progress.eta_text(p)
    if not row.gpus:  # a CPU run: no GPU to read, no GPU-hours to count
        gpu, gpu_h = "cpu", NONE
    else:
        gpu = "/".join(f"{u:.0f}%" for u in row.gpu_util_pct) or NONE
        gpu_h = progress.gpu_hours_text(p)
        if row.gpu_hours_cap_file is not None:  # run.toml edited since the daemon loaded it: say both
            gpu_h += f" (run.toml: {hours(row.gpu_hours_cap_file)})"
    if row.ended is not None:  # a run that is over shows how it ended, not a stale incident
        last = f"ended {row.ended.outcome}" + (f" {_ago(row.ended.at, now)}" if row.ended.at else "")
    elif row.last_incident is not None:
        last = f"{row.last_incident.kind} {_ago(row.last_incident.at, now)}"
    else:
        last = NONE
    return {"RUN": row.run, "STATE": row.status, "ATTEMPT": attempt, "STEP": step, "S/STEP": sps, "ETA": eta,
            "GPU": gpu, "GPU-H": gpu_h, "LAST POLL": _ago(row.last_poll_at, now),
            "LAST INCIDENT / END": last, "VERDICT": verdict_cell(row)}


def verdict_cell(row: RunRow) -> str:
    """The status first, so a PROVISIONAL read is never mistaken for the verdict."""
    v = row.verdict
    if v is None or not v.status:
        return NONE
    if v.status == "NO-READ":
        return "NO-READ"
    where = f"@{v.at_step}" if v.status != "FINAL" and v.at_step is not None else ""
    delta = f" Δ {v.delta:+.4f}" if isinstance(v.delta, (int, float)) else ""
    return f"{v.status}{where} {v.label}{delta}"


def status_table(rows: Sequence[RunRow], now: float) -> str:
    """`babysit status` and `/babysit status`: one line a run, columns as wide as their widest cell."""
    columns = (*COLUMNS[:-2], "LAST POLL", *COLUMNS[-2:])
    table = [{c: c for c in columns}, *(cells(r, now) for r in rows)]
    width = {c: max(len(t[c]) for t in table) for c in columns}
    lines = []
    for t in table:
        parts = [t[c].rjust(width[c]) if c in _RIGHT else t[c].ljust(width[c]) for c in columns]
        lines.append("  ".join(parts).rstrip())
    return "\n".join(lines)


def change_line(row: RunRow, now: float) -> str:
    """The non-tty view: one line saying where a run stands, the fields that are known only."""
    c = cells(row, now)
    parts = [f"{row.run}: {row.status}"]
    if c["ATTEMPT"] != NONE:
        parts.append(f"attempt {c['ATTEMPT']}")
    if c["STEP"] != NONE:
        parts.append(f"step {c['STEP']}")
    if c["S/STEP"] != NONE:
        parts.append(f"{c['S/STEP']} s/step")
    if c["ETA"] != NONE:
        parts.append(f"ETA {c['ETA']}")
    if row.gpus:
        parts.append(f"GPU {c['GPU']}, GPU-h {c['GPU-H']}")
    if c["LAST INCIDENT / END"] != NONE:
        parts.append(c["LAST INCIDENT / END"] if row.ended else "last incident " + c["LAST INCIDENT / END"])
    if c["VERDICT"] != NONE:
        parts.append(c["VERDICT"])
    if row.note:
        parts.append(row.note)
    return time.strftime("%H:%M:%S", time.localtime(now)) + " " + " · ".join(parts)


def live_table(rows: Sequence[RunRow] | None, now: float, footer: str = "") -> Any:
    """The live view's renderable: a compact rich table and a dim footer line (`rows` None: the state
    could not be read this time; the footer says why)."""
    from rich import box
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    if rows is None:
        return Text(footer, style="bold red")
    if not rows:
        return Group(Text("no runs registered yet; `babysit register RUN.toml` adds one"), Text(footer, style="dim"))
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False, header_style="bold")
    for column in COLUMNS:
        table.add_column(column, justify="right" if column in _RIGHT else "left", no_wrap=True,
                         overflow="ellipsis", min_width=min(len(column), 8))
    for row in rows:
        c = cells(row, now)
        verdict = Text(c["VERDICT"], style="bold" if row.verdict and row.verdict.status == "FINAL" else
                       "yellow" if c["VERDICT"] != NONE else "")
        table.add_row(*(Text(c[col], style=_STATE_STYLE.get(row.status, "") if col == "STATE" else "")
                        for col in COLUMNS[:-1]), verdict)
    return Group(table, Text(footer, style="dim")) if footer else table
