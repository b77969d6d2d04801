"""Every user-facing message babysit posts, rendered from plain event payloads.

One module for all of them, so the console, Slack and the slash commands say the same thing the same
way. `render(kind, payload)` gives the plain text (the console, and Slack's notification fallback)
and, where Slack shows more, Block Kit blocks. Pure: no I/O, no Slack imports.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

GIB = 2**30


@dataclass(frozen=True)
class Rendered:
    text: str
    blocks: list[dict[str, Any]] = field(default_factory=list)


def render(kind: str, payload: Mapping[str, Any]) -> Rendered:
    renderer = _RENDERERS.get(kind)
    if renderer is None:
        return Rendered(f"[{kind}] {payload}")
    return renderer(payload)


def fmt_duration(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    seconds = round(seconds)
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    if h:
        return f"{h}h{m:02d}m"
    if m:
        return f"{m}m{s:02d}s"
    return f"{s}s"


def fmt_gib(n: float | None) -> str:
    return "?" if n is None else f"{n / GIB:.1f} GiB"


def fmt_delta(x: float | None, precision: int = 4) -> str:
    return "?" if x is None else f"{x:+.{precision}f}"


def snapshot_line(s: Mapping[str, Any]) -> str:
    """The live header: step, s/step, ETA, GPU-hours, util, provisional read."""
    parts = [f"step {s.get('step') if s.get('step') is not None else '—'}"]
    if s.get("seconds_per_step") is not None:
        parts.append(f"{s['seconds_per_step']:.3g} s/step")
    if s.get("eta_seconds") is not None:
        parts.append(f"ETA {fmt_duration(s['eta_seconds'])}")
    cap = s.get("gpu_hours_cap")
    if s.get("gpu_hours_used") is not None and (cap is not None or s.get("gpus")):
        used = f"{s['gpu_hours_used']:.2f}"
        parts.append(f"GPU-h {used}/{cap:g}" if cap else f"GPU-h {used}")
    utils = [g.get("util_pct") for g in s.get("gpus") or () if g.get("util_pct") is not None]
    if utils:
        parts.append("util " + "/".join(f"{u:.0f}%" for u in utils))
    if s.get("gpu_note"):
        parts.append(s["gpu_note"])
    if s.get("available_ram_bytes") is not None:
        parts.append(f"free RAM {fmt_gib(s['available_ram_bytes'])}")
    prov = s.get("provisional")
    if prov:
        parts.append(_read_phrase(prov))
    return " · ".join(parts)


def _read_phrase(v: Mapping[str, Any]) -> str:
    status = v.get("status")
    if status == "NO-READ":
        return "read: NO-READ"
    delta = fmt_delta(v.get("delta"), v.get("precision", 4))
    if status == "PROVISIONAL":
        return f"PROVISIONAL read @{v.get('at_step')}: Δ {delta} → {v.get('label')} (not a verdict)"
    return f"FINAL: Δ {delta} → {v.get('label')}"


def _launch(p: Mapping[str, Any]) -> Rendered:
    head = f"🚀 {p['run']} — attempt {p['attempt']}/{p.get('max_attempts', '?')} launched"
    lines = [head, f"profile: {p.get('profile')}  ·  executor: {p.get('executor')}  ·  "
             + (f"GPUs {p['gpus']}" if p.get("gpus") else "CPU run")]
    if p.get("selected_by"):
        lines.append(f"profile selected by: {p['selected_by']}")
    if p.get("note"):
        lines.append(p["note"])
    lines.append("$ " + " ".join(p.get("argv", [])))
    if p.get("question"):
        lines.append(f"question: {p['question']}  (read at step {p.get('read_step')})")
    return Rendered("\n".join(lines))


def _header(p: Mapping[str, Any]) -> Rendered:
    return Rendered(f"{p['run']} attempt {p['attempt']}: " + snapshot_line(p["snapshot"]))


def _poll(p: Mapping[str, Any]) -> Rendered:
    s = p["snapshot"]
    title = {"first": "first poll", "periodic": "poll", "on-demand": "poll (on demand)"}.get(s.get("kind"), "poll")
    lines = [f"📊 {s['run']} {title}: " + snapshot_line(s)]
    for flag in s.get("flags") or ():
        lines.append(f"⚠️ {FLAG_TEXT.get(flag, flag)}")
    if s.get("latest_eval"):
        evals = ", ".join(f"{k}={v:.4g}" for k, v in list(s["latest_eval"].items())[:4])
        lines.append(f"latest eval @{s.get('latest_eval_step')}: {evals}")
    return Rendered("\n".join(lines))


FLAG_TEXT = {
    "input-starvation": "input starvation suspected: GPU util under threshold while steps advance "
                        "— raise --num-workers/--prefetch-factor before letting it ride",
    "host-memory-pressure": "host memory pressure: free RAM under the guard",
    "gpu-unseen": "no GPU visible to babysit: GPU guards cannot see this run's GPUs",
}


def _incident(p: Mapping[str, Any]) -> Rendered:
    mention = " ".join(f"<@{u}>" for u in p.get("mention") or ())
    lines = [f"🚨 {p['run']} attempt {p.get('attempt')}: {p['incident']} — {p['message']}"]
    if mention:
        lines[0] += f"  {mention}"
    tail = (p.get("detail") or {}).get("stderr_tail")
    if tail:
        lines.append("last stderr lines:")
        lines.extend("  " + line for line in tail.splitlines()[-8:])
    return Rendered("\n".join(lines))


def _ended(p: Mapping[str, Any]) -> Rendered:
    icon = {"completed": "✅", "stopped": "⏹"}.get(p.get("outcome"), "❌")
    return Rendered(f"{icon} {p['run']} attempt {p['attempt']} ended: {p.get('outcome')} — {p.get('summary', '')}")


def _provisional(p: Mapping[str, Any]) -> Rendered:
    v = p["verdict"]
    return Rendered(f"🔎 {v['run']}: " + _read_phrase({**v, "precision": p.get("precision", 4)}))


def verdict_text(v: Mapping[str, Any], precision: int = 4) -> str:
    status = v.get("status")
    lines = []
    if status == "PROVISIONAL":
        lines.append(f"⏳ PROVISIONAL — read as of step {v.get('at_step')}, before read step {v.get('read_step')}:"
                     " NOT a verdict")
    if status == "NO-READ":
        lines.append(f"∅ {v['run']}: NO-READ — {v.get('reason', '')}")
        return "\n".join(lines)
    lines.append(f"⚖️ {v['run']}: {v.get('label')}  ({status})")
    lines.append(f"{v.get('metric')}: {v.get('baseline')} @{v.get('baseline_step')} → {v.get('read')} "
                 f"@{v.get('at_step')}  Δ {fmt_delta(v.get('delta'), precision)}")
    for rule in v.get("rules") or ():
        bounds = ", ".join(
            f"{label} " + " & ".join(f"{'≤' if k == 'max' else '≥'} {b:+.{precision}f}" for k, b in bs.items())
            for label, bs in rule.get("bounds", {}).items()
        )
        scale = f" (×{rule['scale']:.4g})" if rule.get("scale") else ""
        lines.append(f"  rule {rule['name']}{scale}: {bounds} → {rule.get('label')}")
    if v.get("interpretation"):
        lines.append(f"means: {v['interpretation']}")
    corr = v.get("corroboration") or {}
    if corr:
        lines.append(f"corroboration (not a gate): train Δ {fmt_delta(corr.get('train_delta'), precision)}, "
                     f"monotone rise {corr.get('monotone_rise')}")
    return "\n".join(lines)


def _verdict(p: Mapping[str, Any]) -> Rendered:
    text = verdict_text(p["verdict"], p.get("precision", 4))
    if p.get("chart_path"):
        text += f"\nchart: {p['chart_path']}"
    return Rendered(text)


def _amendment(p: Mapping[str, Any]) -> Rendered:
    return Rendered(f"📝 {p['run']}: amendment {p['n']} declared — {p['title']} "
                    f"(data seen through step {p.get('data_seen_through_step')}; sha256 {p['sha256'][:12]}…)")


def _text(p: Mapping[str, Any]) -> Rendered:
    return Rendered(str(p.get("text", "")))


_RENDERERS = {
    "launch": _launch,
    "header": _header,
    "poll": _poll,
    "incident": _incident,
    "ended": _ended,
    "provisional": _provisional,
    "verdict": _verdict,
    "amendment": _amendment,
    "text": _text,
}


def status_table(rows: list[Mapping[str, Any]], now: float) -> str:
    """`babysit status` and `/babysit status`: one line a run."""
    header = f"{'RUN':<34} {'STATUS':<10} {'ATT':>3} {'STEP':>6} {'S/STEP':>7} {'ETA':>7} {'GPU-H':>6}  " \
             f"{'LAST POLL':>9}  LAST INCIDENT / VERDICT"
    lines = [header]
    for r in rows:
        sps = f"{r['seconds_per_step']:.3g}" if r.get("seconds_per_step") else "—"
        ago = fmt_duration(now - r["last_poll_at"]) + " ago" if r.get("last_poll_at") else "—"
        tail = []
        if r.get("last_incident"):
            tail.append(f"{r['last_incident']['kind']} ({fmt_duration(now - r['last_incident']['at'])} ago)")
        v = r.get("verdict")
        if v and v.get("label"):
            mark = "" if v.get("status") == "FINAL" else f" {v.get('status')}@{v.get('at_step')}"
            tail.append(f"{v['label']}{mark} Δ {fmt_delta(v.get('delta'))}")
        lines.append(f"{r['run'][:34]:<34} {r['status']:<10} {r.get('attempt') or '—':>3} "
                     f"{r.get('step') if r.get('step') is not None else '—':>6} {sps:>7} "
                     f"{fmt_duration(r['eta_seconds']) if r.get('eta_seconds') else '—':>7} "
                     f"{r.get('gpu_hours', 0):>6.2f}  {ago:>9}  {' · '.join(tail) or '—'}")
    return "\n".join(lines)
