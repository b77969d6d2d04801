"""Every message babysit posts about a run, rendered from the plain event payloads in the outbox.

One module, so the console channel and the Slack channel say the same thing the same way (the slash
commands' replies live in bot/messages.py and reuse these lines). `render(kind, payload)` gives the
plain text (the console, and Slack's notification fallback) and, where Slack shows more, Block Kit
blocks. Pure: no I/O, no Slack imports. A poll's snapshot is read back from its payload once
(`Snapshot.from_dict`, the JSON boundary) and rendered from the frozen value itself.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

import babysit.core.campaign.render as campaign_words  # pure (tests/test_layering.py)
from babysit.core import progress
from babysit.core.blocks import code, context, divider, header, section
from babysit.core.fmt import MISSING, fmt_delta, fmt_duration, fmt_gib, fmt_rise
from babysit.core.nodes import node_line
from babysit.core.reading import tails
from babysit.core.snapshot import GpuRow, Snapshot


@dataclass(frozen=True)
class Rendered:
    """`text` is the whole message in plain text (console, notifications, screen readers); `blocks` is how
    Slack shows it. Both say the same thing, so a client that drops blocks loses nothing."""

    text: str
    blocks: list[dict[str, Any]] = field(default_factory=list)


def render(kind: str, payload: Mapping[str, Any]) -> Rendered:
    renderer = _RENDERERS.get(kind)
    if renderer is None:
        text = f"[{kind}] {payload}"
        return Rendered(text, [section(text)])
    return renderer(payload)


def snapshot_line(s: Snapshot) -> str:
    """The live header: step, s/step, ETA and its step, GPU-hours, util, provisional read. Progress is
    said as `babysit status`, the live view and the web page say it (core/progress.py's words)."""
    p = s.progress
    parts = [f"step {progress.step_text(p)}"]
    if p.seconds_per_step is not None:
        parts.append(f"{progress.pace_text(p)} s/step")
    if p.eta_seconds is not None:
        parts.append(f"ETA {progress.eta_text(p)}")
    if p.n_gpus:  # a CPU run costs no GPU-hours: say nothing
        parts.append(f"GPU-h {progress.gpu_hours_text(p)}")
    measured = s.measured
    if measured:
        parts.append("util " + "/".join(f"{g.util_pct:.0f}%" for g in measured) + _util_window(measured))
    if s.gpu_note:
        parts.append(s.gpu_note)
    if s.available_ram_bytes is not None:
        parts.append(f"free RAM {fmt_gib(s.available_ram_bytes)}")
    prov = s.provisional
    if prov:
        parts.append(_read_phrase(prov))
    return " · ".join(parts)


def _num(v: float) -> str:
    """A metric as a poll shows it: 4 significant digits; NaN and inf say so."""
    return f"{v:.4g}"


def _util_window(gpus: Sequence[GpuRow]) -> str:
    """"(min 12%, 1800 samples)": what the mean was taken over, so one busy second cannot pass for a window;
    "(GPM counters over 30m00s)" where the GPU's own counters measured the whole window."""
    sampled = [g for g in gpus if g.util_seconds is None]
    spans = [g.util_seconds for g in gpus if g.util_seconds is not None]
    parts = [f"GPM counters over {fmt_duration(min(spans))}"] if spans else []
    if sampled:
        lows = [g.util_min_pct for g in sampled if g.util_min_pct is not None]
        if lows:
            parts.append(f"min {'/'.join(f'{u:.0f}%' for u in lows)}")
        parts.append(f"{min(g.util_samples for g in sampled)} samples")
    return f" ({', '.join(parts)})"


def _read_phrase(v: Mapping[str, Any]) -> str:
    status = v.get("status")
    if status == "NO-READ":
        reason = v.get("reason")
        return f"no read yet ({reason.split(' (')[0]})" if reason else "read: NO-READ"
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
    blocks = [header(head), section("\n".join(lines[1:lines.index("$ " + " ".join(p.get("argv", [])))])),
              section(code("$ " + " ".join(p.get("argv", []))))]
    if p.get("question"):
        blocks.append(context(f"*question:* {p['question']}  ·  read at step {p.get('read_step')}"))
    return Rendered("\n".join(lines), blocks)


def _header(p: Mapping[str, Any]) -> Rendered:
    """The launch post edited in place: what was launched, then the live line under it.

    chat.update replaces the whole post, so the launch content (payload "launch", filled in by the
    Slack channel from the launch message) is rendered again above the live line.
    """
    live = snapshot_line(Snapshot.from_dict(p["snapshot"]))
    text = f"{p['run']} attempt {p['attempt']}: {live}"
    if not p.get("launch"):
        return Rendered(text, [section(f"*live:* {live}")])
    base = _launch(p["launch"])
    return Rendered(base.text + "\n" + text, [*base.blocks, divider(), section(f"*live:* {live}")])


def _poll(p: Mapping[str, Any]) -> Rendered:
    s = Snapshot.from_dict(p["snapshot"])
    title = {"first": "first poll", "periodic": "poll", "on-demand": "poll (on demand)"}.get(s.kind, "poll")
    lines = [f"📊 {s.run} {title}: " + snapshot_line(s)]
    lines += [node_line(n) for n in s.nodes] if len(s.nodes) > 1 else []  # one node: the first line says it
    for flag in s.flags:
        lines.append(flag_line(flag, s))
    if s.shown_metrics:
        lines.append("latest: " + " · ".join(f"{k}={_num(v)} @{step}"
                                             for k, (step, v) in list(s.shown_metrics.items())[:8]))
    elif s.latest_eval:
        evals = ", ".join(f"{k}={v:.4g}" for k, v in list(s.latest_eval.items())[:4])
        lines.append(f"latest eval @{s.latest_eval_step}: {evals}")
    if s.reading and s.kind == "first":
        lines.append(s.reading)
    return Rendered("\n".join(lines), [section("\n".join(lines))])


def flag_line(flag: str, s: Snapshot) -> str:
    """A poll flag in words, with the figures behind it; ⚠️ only where something needs a look."""
    text = _FLAG_TEXT.get(flag)
    if text is None:
        return f"⚠️ {flag}"
    line = text(s)
    return line if flag in _CALM_FLAGS else f"⚠️ {line}"


def _mean_util(s: Snapshot) -> str:
    mean = s.mean_util_pct
    return MISSING if mean is None else f"{mean:.0f} %"


def _since(seconds: float | None) -> str:
    return MISSING if seconds is None else fmt_duration(seconds)


_CALM_FLAGS = {"waiting-for-first-record"}
_FLAG_TEXT: dict[str, Callable[[Snapshot], str]] = {
    "input-starvation": lambda s: (
        f"input starvation: GPU util {_mean_util(s)} while the trainer waits on its input "
        f"{(s.data_wait_frac or 0):.0%} of each step — raise --num-workers / prefetch, or speed up "
        "storage, before letting it ride"),
    "gpu-util-low": lambda s: (
        f"GPU util low ({_mean_util(s)})"
        + (f"; the trainer waits on its input only {s.data_wait_frac:.1%} of each step, so not input starvation"
           if s.data_wait_frac is not None else "")
        + " — possible causes: small batches or kernel-launch overhead (raise the batch, CUDA graphs, "
          "torch.compile), host-device syncs (.item(), logging), a slow collective, or the input pipeline"),
    "host-memory-pressure": lambda s: f"host memory pressure: free RAM {fmt_gib(s.available_ram_bytes)} "
                                      "under the guard's floor",
    "gpu-unseen": lambda s: "no GPU visible to babysit: GPU guards cannot see this run's GPUs"
                            + (f" ({s.gpu_note})" if s.gpu_note else ""),
    "gpu-held": lambda s: "another process holds the run's GPU: " + "; ".join(
        f"{g.where}: pid {h.pid} ({h.name})" for g in s.gpus for h in g.held_by_foreign or ()),
    "gpu-fault": lambda s: "GPU fault: " + "; ".join(
        f"{g.where}: {', '.join(g.faults)}" for g in s.gpus if g.faults),
    "stalled?": lambda s: f"no new log record for {_since(s.seconds_since_last_record)} — the stall guard "
                          f"stops the run at {_since(s.stall_seconds)}",
    "waiting-for-first-record": lambda s: (
        f"waiting for the first record in {_records_from(s)} "
        f"({_since(s.seconds_since_launch)} since launch; start-up is normal)"),
    "no-log-records-yet": lambda s: (
        f"no record in {_records_from(s)} yet, {_since(s.seconds_since_launch)} after launch "
        f"— {_records_question(s)} (the stall guard stops the run at {_since(s.stall_seconds)})"),
    "gpu-hours-projection": lambda s: progress.projection_sentence(s.progress)
    or "GPU-hours projected past the cap",
}


def _records_from(s: Snapshot) -> str:
    """Where the run's records come from, as the trainer sees it: its output for a stdout source (the file
    babysit copies them into is babysit's own), else the file the trainer writes."""
    if s.source_kind == "stdout":
        return "the trainer's output (stdout and stderr)"
    return s.log_path or "the log"


def _records_question(s: Snapshot) -> str:
    if s.source_kind == "stdout":
        return "is it printing lines the run's [source] patterns match?"
    return "is the trainer writing there?"


def _incident(p: Mapping[str, Any]) -> Rendered:
    mention = " ".join(f"<@{u}>" for u in p.get("mention") or ())
    if (p.get("detail") or {}).get("ended"):  # the attempt's exit is the incident: one post says both
        lines = [f"❌ {p['run']} attempt {p.get('attempt')} ended: {p['incident']} — {p['message']}"]
        head = f"❌ *{p['run']}* attempt {p.get('attempt')} ended: *{p['incident']}* — {p['message']}"
    else:
        lines = [f"🚨 {p['run']} attempt {p.get('attempt')}: {p['incident']} — {p['message']}"]
        head = f"🚨 *{p['run']}* attempt {p.get('attempt')}: *{p['incident']}* — {p['message']}"
    if mention:
        lines[0] += f"  {mention}"
    blocks = [section(head + (f"\n{mention}" if mention else ""))]
    tail = tails.collapse(str((p.get("detail") or {}).get("stderr_tail") or ""))[-8:]  # bars: their last state
    if tail:
        lines.append("last stderr lines:")
        lines.extend("  " + line for line in tail)
        blocks.append(section("last stderr lines:\n" + code("\n".join(tail))))
    for head, body in (*_gpu_evidence(p.get("detail") or {}), *_stall_evidence(p.get("detail") or {})):
        lines.append(head)
        lines.extend("  " + line for line in body)
        blocks.append(section(head + ("\n" + code("\n".join(body)) if body else "")))
    return Rendered("\n".join(lines), blocks)


STACK_LINES = 14  # of the dump shown in the channel; the whole dump is in the incident's record


def _gpu_evidence(detail: Mapping[str, Any]) -> list[tuple[str, list[str]]]:
    """A GPU fault's evidence (which GPU, what, what it means, the catalog's action, when) and a hung
    collective's explanation (docs/guards.md, GPU health)."""
    out: list[tuple[str, list[str]]] = []
    items = [e for e in detail.get("gpu_evidence") or detail.get("evidence") or () if isinstance(e, Mapping)]
    if items:
        lines = [f"GPU {e.get('gpu')}{' on ' + str(e['node']) if e.get('node') else ''} {e.get('uuid')}: "
                 f"{e.get('name')} — {e.get('meaning')}; "
                 f"{'the machine' if e.get('side') == 'machine' else 'the trainer'}: {e.get('action_words')}"
                 + (f" (at {datetime.fromtimestamp(float(e['at']), timezone.utc):%H:%M:%S} UTC)"
                    if isinstance(e.get("at"), (int, float)) else "") for e in items[:6]]
        out.append(("GPU evidence:", lines))
    hang = detail.get("collective")
    if isinstance(hang, Mapping) and hang.get("summary"):
        out.append((f"hung collective ({hang.get('source') or 'no evidence'}): {hang['summary']}", []))
    return out


def _stall_evidence(detail: Mapping[str, Any]) -> list[tuple[str, list[str]]]:
    """A stall's log path, and its py-spy dump, or why there is none: (heading, lines) each."""
    out: list[tuple[str, list[str]]] = []
    if detail.get("log"):
        out.append((f"log babysit reads (no new record there): {detail['log']}", []))
    stacks = detail.get("stacks")
    if not isinstance(stacks, Mapping):
        return out
    dumps = [(pid, text) for pid, text in stacks.items() if pid not in _NOT_DUMPS and isinstance(text, str)]
    # the trainer's stack, not babysit's shim's (run by its path; `-m babysit.executors.shim` before)
    dumps.sort(key=lambda d: "babysit/executors/shim.py" in d[1] or "babysit.executors.shim" in d[1])
    if dumps:
        pid, text = dumps[0]
        shown = [line for line in text.strip().splitlines() if line.strip()][:STACK_LINES]
        out.append((f"py-spy dump of pid {pid} ({len(dumps)} process(es) dumped):", shown))
    if stacks.get("stalled"):  # a job across nodes: the rank the others wait for, and its node
        out.append((f"stalled: {stacks['stalled']}", []))
    if stacks.get("flight_records"):
        out.append(("NCCL flight records gathered from the nodes:", str(stacks["flight_records"]).split("; ")))
    if stacks.get("note"):
        out.append((f"⚠️ {stacks['note']}", []))
    return out


_NOT_DUMPS = ("note", "stalled", "flight_records")  # a stall's `stacks` keys that are words, not a process's stack


def _ended(p: Mapping[str, Any]) -> Rendered:
    icon = {"completed": "✅", "stopped": "⏹"}.get(p.get("outcome"), "❌")
    text = f"{icon} {p['run']} attempt {p['attempt']} ended: {p.get('outcome')} — {p.get('summary', '')}"
    return Rendered(text, [section(text)])


def _provisional(p: Mapping[str, Any]) -> Rendered:
    v = p["verdict"]
    text = f"🔎 {v['run']}: " + _read_phrase({**v, "precision": p.get("precision", 4)})
    return Rendered(text, verdict_blocks(v, p.get("precision", 4)))


PROVISIONAL_LINE = "⏳ PROVISIONAL — read as of step {at}, before read step {read}: NOT a verdict"


def verdict_text(v: Mapping[str, Any], precision: int = 4, *, extra: Sequence[str] = ()) -> str:
    """The verdict in words, from its JSON (docs/verdicts.md): the post, `/verdict` and `babysit verdict`
    say it alike, every number rounded as the verdict rounded it. `extra`: lines after the label line
    (the CLI's question and the run's progress)."""
    status = v.get("status")
    lines = []
    if status == "PROVISIONAL":
        lines.append(PROVISIONAL_LINE.format(at=v.get("at_step"), read=v.get("read_step")))
    if status == "NO-READ":
        lines.append(f"∅ {v['run']}: NO-READ — {v.get('reason', '')}")
        return "\n".join([*lines, *extra])
    lines.append(f"⚖️ {v['run']}: {v.get('label')}  ({status})")
    lines += extra
    lines.append(f"{v.get('metric')}: {_value(v.get('baseline'), precision)} @{v.get('baseline_step')} → "
                 f"{_value(v.get('read'), precision)} @{v.get('at_step')}  Δ {fmt_delta(v.get('delta'), precision)}")
    lines += ["  " + line for line in rule_lines(v, precision)]
    if v.get("interpretation"):
        lines.append(f"means: {v['interpretation']}")
    corr = v.get("corroboration") or {}
    if corr:
        lines.append(corroboration_line(corr, precision))
    return "\n".join(lines)


CORROBORATION_WORDS = ("shown beside the label, never deciding it: how the train metric moved over the same "
                       "window, and whether every eval rose")


def corroboration_line(corr: Mapping[str, Any], precision: int = 4) -> str:
    """The corroboration figures, with a plain sentence saying what they are and that they decide nothing."""
    return (f"corroboration (not a gate): train Δ {fmt_delta(corr.get('train_delta'), precision)}, "
            f"monotone rise {fmt_rise(corr.get('monotone_rise'))} — {CORROBORATION_WORDS}")


def rule_lines(v: Mapping[str, Any], precision: int = 4) -> list[str]:
    """One line a rule: `rule amendment-1 (×2.5): HEALTHY ≤ +0.0125, SAME-DRIFT ≥ +0.02563 → AMBIGUOUS`."""
    out = []
    for rule in v.get("rules") or ():
        bounds = ", ".join(
            f"{label} " + " & ".join(f"{'≤' if k == 'max' else '≥'} {bound_text(b, precision)}" for k, b in bs.items())
            for label, bs in rule.get("bounds", {}).items()
        )
        scale = f" (×{scale_text(rule['scale'], precision)})" if rule.get("scale") else ""
        out.append(f"rule {rule['name']}{scale}: {bounds} → {rule.get('label')}")
    return out


def bound_text(bound: float, precision: int) -> str:
    """A bound of the verdict JSON with the decimals it was rounded to (`core.verdict.shown_bound`: the
    precision, or more where rounding would have lied), never re-rounded to fewer: `+0.01025`."""
    for digits in range(precision, precision + 16):
        if round(bound, digits) == bound:
            return f"{bound:+.{digits}f}"
    return f"{bound:+.{precision + 16}f}"


def _value(value: Any, precision: int) -> str:
    """A metric's value at the verdict's precision (a huge one in exponent form, not 300 digits)."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return MISSING
    return f"{value:.{precision}f}" if abs(value) < 1e15 else f"{value:.{precision}g}"


def scale_text(value: float, precision: int) -> str:
    """An amendment's scale at the verdict's precision, without trailing zeros: ×2.5, ×3.6128 (the card,
    the post and the chart alike)."""
    return f"{value:.{precision}f}".rstrip("0").rstrip(".")


def _verdict(p: Mapping[str, Any]) -> Rendered:
    text = verdict_text(p["verdict"], p.get("precision", 4))
    if p.get("chart_path"):
        text += f"\nchart: {p['chart_path']}"
    elif p.get("chart_error"):  # the verdict stands without its chart
        text += f"\nchart: not drawn ({p['chart_error']})"
    return Rendered(text, verdict_blocks(p["verdict"], p.get("precision", 4)))


def verdict_card(v: Mapping[str, Any], precision: int = 4) -> Rendered:
    """`/verdict RUN`: the same card the daemon posts."""
    return Rendered(verdict_text(v, precision), verdict_blocks(v, precision))


def verdict_blocks(v: Mapping[str, Any], precision: int = 4) -> list[dict[str, Any]]:
    """Label, delta, each rule's bands, interpretation, status. A PROVISIONAL read is fenced top and
    bottom, so nobody screenshots it as the answer."""
    status = v.get("status")
    if status == "NO-READ":
        return [header(f"∅ NO-READ — {v.get('run')}"),
                section(f"No verdict can be read yet: {v.get('reason') or 'a needed eval is missing'}")]
    blocks: list[dict[str, Any]] = []
    if status == "PROVISIONAL":
        blocks += [header(f"⏳ PROVISIONAL — NOT A VERDICT — {v.get('run')}"),
                   section(f":warning: *PROVISIONAL* read as of step {v.get('at_step')}, before the pre-registered "
                           f"read step {v.get('read_step')}. The label can still change: do not act on it.")]
    else:
        blocks.append(header(f"⚖️ {status} VERDICT — {v.get('run')}: {v.get('label')}"))
    blocks.append(section(f"*label:* {v.get('label')}{' (provisional)' if status == 'PROVISIONAL' else ''}"
                          f"   *status:* {status}\n*{v.get('metric')}:* {v.get('baseline')} @{v.get('baseline_step')}"
                          f" → {v.get('read')} @{v.get('at_step')}   *Δ {fmt_delta(v.get('delta'), precision)}*"))
    rules = rule_lines(v, precision)
    if rules:
        blocks.append(section("*pre-registered rules:*\n" + "\n".join(f"• {r}" for r in rules)))
    if v.get("interpretation"):
        blocks.append(section(f"*means:* {v['interpretation']}"))
    corr = v.get("corroboration") or {}
    if corr:
        blocks.append(context(corroboration_line(corr, precision)))
    if status == "PROVISIONAL":
        blocks.append(context(f"⏳ PROVISIONAL — the verdict is read at step {v.get('read_step')}, not before"))
    return blocks


def _amendment(p: Mapping[str, Any]) -> Rendered:
    text = (f"📝 {p['run']}: amendment {p['n']} declared — {p['title']} "
            f"(data seen through step {p.get('data_seen_through_step')}; sha256 {p['sha256'][:12]}…)")
    return Rendered(text, [section(text)])


def _text(p: Mapping[str, Any]) -> Rendered:
    text = str(p.get("text", ""))
    return Rendered(text, [section(text)])


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
    "campaign": lambda p: Rendered(*campaign_words.campaign_post(p)),  # docs/campaigns.md
    "owner-call": lambda p: Rendered(*campaign_words.render_call(p)),
}


def chart_comment(run: str, v: Mapping[str, Any] | None) -> str:
    if not v:
        return f"📈 {run}"
    prov = " — PROVISIONAL, NOT A VERDICT" if v.get("status") == "PROVISIONAL" else ""
    return f"📈 {run}: {v.get('label')} ({v.get('status')}){prov}"
