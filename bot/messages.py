"""Every reply of the slash commands and buttons: each tells the user what to do next.

Pure: no I/O, no Slack imports. What the daemon posts about runs (launch, polls, incidents, verdicts)
is rendered by babysit/core/render.py, which these replies reuse.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from babysit.core.blocks import actions, code, confirm_button, context, section
from babysit.core.render import Rendered, snapshot_line
from babysit.core.run_machine import ALREADY_STOPPING
from babysit.core.snapshot import Snapshot
from babysit.view.runtable import status_table
from babysit.view.runview import RunRow

# -- slash commands ------------------------------------------------------------------------------------
# Every string a slash command answers with. Each tells the user what to do next.

ABORT_ACTION_ID = "babysit_abort_confirmed"

HELP = """*babysit* — slash commands (everything but `abort` and `relaunch` is read-only)
• `/verdict RUN` — the pre-registered verdict card (PROVISIONAL before the read step)
• `/verdict RUN post` — the same card, shared in this channel
• `/babysit status [RUN]` — step, s/step, ETA, GPU-hours, last poll, last incident, verdict
• `/babysit runs` — the registered runs and what each is doing
• `/babysit poll RUN` — ask the daemon for a poll now (posted in the run's thread, summarised here)
• `/babysit chart RUN` — upload the verdict chart here
• `/babysit gpus` — who holds which GPU on the babysat host (a run, or FOREIGN)
• `/babysit abort RUN` — stop a run gracefully (allow-listed users only, confirmed with a button)
• `/babysit relaunch RUN [resume]` — run an ended run again, its run.toml re-read (allow-listed users only)
• `/babysit campaign [NAME]` — the campaigns, or one's suspect table, runs and owner calls
• `/babysit help` — this"""


def answer(rendered: Rendered, *, in_channel: bool = False, replace: bool | None = None) -> dict[str, Any]:
    """The kwargs for ack()/respond(): text is the fallback, blocks what Slack shows."""
    out: dict[str, Any] = {"text": rendered.text, "blocks": rendered.blocks,
                           "response_type": "in_channel" if in_channel else "ephemeral"}
    if replace is not None:
        out["replace_original"] = replace
    return out


def reply(text: str, *extra_blocks: dict[str, Any]) -> Rendered:
    """A one-section answer (with optional extra blocks after it)."""
    return Rendered(text, [section(text), *extra_blocks])


def help_message() -> Rendered:
    return reply(HELP)


def unknown_subcommand(word: str) -> Rendered:
    return reply(f"I don't know `/babysit {word}`. Try `/babysit help` for the list of commands.")


def missing_run(usage: str) -> Rendered:
    return reply(f"This needs a run name: `{usage}`. `/babysit runs` lists the registered runs.")


def unknown_run(name: str, close: list[str], registered: int) -> Rendered:
    """Names the closest registered runs, so a typo costs one more try, not a trip to the terminal."""
    text = f"No run named `{name}` is registered."
    if close:
        text += " Did you mean " + ", ".join(f"`{c}`" for c in close) + "?"
    elif registered == 0:
        text += " No runs are registered yet: `babysit register RUN.toml` on the babysat host adds one."
    else:
        text += " `/babysit runs` lists the registered runs."
    return reply(text)


def not_allowed(user: str, action: str, run: str) -> Rendered:
    return reply(f"<@{user}>, you are not allowed to {action} `{run}`: only users on `[daemon].abort_allow_list` "
                 "in babysit.toml can. Nothing was queued. Ask someone on that list, or add your member ID there.")


def abort_confirm(run: str) -> Rendered:
    """The allow-listed user's abort prompt: a danger button behind Slack's confirm dialog."""
    text = (f"Abort `{run}`? The daemon sends SIGTERM (the trainer checkpoints), waits the grace period, "
            "then SIGKILL. No retry follows.")
    button = confirm_button(action_id=ABORT_ACTION_ID, text=f"Abort {run}", value=run,
                            title="Abort this run?", question=f"Stop *{run}* now? This cannot be undone.",
                            yes="Abort it")
    return Rendered(text, [section(text), actions(button, block_id="babysit_abort")])


def abort_queued(run: str, user: str) -> Rendered:
    return reply(f"⏹ Abort of `{run}` requested by <@{user}>; waiting for the daemon to take it…")


def abort_result(run: str, result: str) -> Rendered:
    if result == "stopping":
        return reply(f"⏹ `{run}` is stopping: the daemon sent SIGTERM; the end is posted in the run's thread.")
    if result == ALREADY_STOPPING:
        return reply(f"⏹ `{run}` was already stopping (an earlier abort or a guard's stop); the end is posted in "
                     "the run's thread.")
    return reply(f"`{run}`: the daemon answered the abort with “{result}”.")


def relaunch_working(run: str, user: str) -> Rendered:
    return reply(f"🔁 Relaunch of `{run}` requested by <@{user}>: re-reading its run.toml…")


def relaunch_refused(run: str, message: str, hint: str | None) -> Rendered:
    return reply(f"`{run}` was not relaunched: {message}" + (f"\nNext: {hint}" if hint else "") +
                 "\nNothing was queued.")


def relaunch_result(run: str, result: str) -> Rendered:
    if result.startswith("launched"):
        return reply(f"🔁 `{run}`: the daemon {result}; its launch is posted in the channel.")
    return reply(f"`{run}`: the daemon answered the relaunch with “{result}”.")


def request_unanswered(run: str, action: str, request_id: int, waited_s: float) -> Rendered:
    return reply(f"`{run}`: the {action} request (#{request_id}) is queued, but no daemon took it within "
                 f"{waited_s:g}s. It runs as soon as `babysit up` does; check the daemon on the babysat host.")


def request_for_away_box(run: str, action: str, request_id: int, box: str, staleness: str) -> Rendered:
    return reply(f"`{run}`: the {action} request (#{request_id}) is queued for box {box}, out of sight now "
                 f"({staleness}): it is carried out when box {box} is back (its daemon takes its requests "
                 "up when it starts). `/babysit status` shows the fleet's boxes.")


def poll_queued(run: str) -> Rendered:
    return reply(f"📊 Poll of `{run}` requested; waiting for the daemon…")


def poll_result(run: str, result: str, snapshot: Snapshot | None) -> Rendered:
    if result != "polled":
        return reply(f"`{run}`: the daemon answered the poll with “{result}”.")
    if snapshot is None:
        return reply(f"📊 `{run}` polled; the poll is in the run's thread.")
    return reply(f"📊 `{run}` (poll on demand): {snapshot_line(snapshot)}\n"
                 "The full poll is in the run's thread.")


def status_message(rows: Sequence[RunRow], now: float, boxes: Sequence[str] = ()) -> Rendered:
    """The status table; in a fleet, one line a box after it (its state and its lease's staleness)."""
    if not rows:
        return reply("No runs are registered. `babysit register RUN.toml` on the babysat host adds one.")
    table = status_table(rows, now)
    if boxes:
        table += "\n" + "\n".join(boxes)
    return Rendered(table, [section(code(table))])


def runs_message(rows: Sequence[RunRow]) -> Rendered:
    if not rows:
        return reply("No runs are registered. `babysit register RUN.toml` on the babysat host adds one.")
    lines = []
    for r in rows:
        v = r.verdict
        tail = f" · {v.label} ({v.status})" if v is not None and v.label else ""
        attempt = f" · attempt {r.attempt}" if r.attempt else ""
        lines.append(f"• `{r.run}` — {r.status}{attempt}{tail}")
    return reply(f"*{len(rows)} registered run{'s' if len(rows) != 1 else ''}:*\n" + "\n".join(lines))


def verdict_unavailable(run: str, reason: str) -> Rendered:
    return reply(f"No verdict for `{run}`: {reason}")


def verdict_working(run: str) -> Rendered:
    return reply(f"⚖️ Reading the verdict of `{run}`…")


def with_note(card: Rendered, note: str) -> Rendered:
    """A card read from the fleet's database, with where it comes from and how fresh it is on top."""
    return Rendered(f"{note}\n{card.text}", [context(note), *card.blocks])


def remote_chart(run: str, stored: Any, card: Rendered) -> Rendered:
    """`/babysit chart` of another box's run whose chart file is not reachable here: its stored verdict."""
    where = (f"box {stored.host} drew it at {stored.chart_path}" if stored.chart_path
             else f"the log it is drawn from is on box {stored.host}")
    return with_note(card, f"📈 No chart of `{run}` on this box ({where}); {stored.note}")


def chart_working(run: str) -> Rendered:
    return reply(f"📈 Drawing the chart of `{run}`…")


def chart_uploaded(run: str) -> Rendered:
    return reply(f"📈 Chart of `{run}` uploaded to this channel.")


def slack_refused(what: str, error: str) -> Rendered:
    hint = {"not_in_channel": "invite the bot to this channel (`/invite @babysit`) and try again",
            "channel_not_found": "invite the bot to this channel (`/invite @babysit`) and try again",
            "missing_scope": "the Slack app lacks a scope: reinstall it from docs/slack.md's manifest"}
    return reply(f"Slack refused to {what} ({error}): {hint.get(error, 'see the bot log on the babysat host')}.")


def gpus_message(lines: list[str], reason: str | None, *, here: str | None = None,
                 others: Sequence[Sequence[str]] = ()) -> Rendered:
    """`/babysit gpus`: `lines` come from bot.gpus; `reason` is why nothing could be read. In a fleet
    (`here`: this box's name) `others` holds each other box's lines (bot.gpus.box_lines), one block a box."""
    if here is None:
        if reason is not None:
            return reply(f"🖥 GPUs not measured: {reason}")
        if not lines:
            return reply("🖥 No GPU is visible on the babysat host.")
        text = "🖥 GPUs on the babysat host (each process: its run, or FOREIGN):\n" + "\n".join(lines)
        return Rendered(text, [section("🖥 *GPUs on the babysat host* (each process: its run, or FOREIGN)"),
                               section(code("\n".join(lines)))])
    mine = [f"box {here} (this box) — read now"] + (
        [f"  GPUs not measured: {reason}"] if reason is not None else
        ["  (no GPU visible)"] if not lines else ["  " + line for line in lines])
    boxes = [mine, *[list(b) for b in others]]
    head = f"🖥 GPUs of the fleet, {len(boxes)} box(es) (each process: its run, or FOREIGN)"
    text = head + ":\n" + "\n".join("\n".join(b) for b in boxes)
    return Rendered(text, [section(f"*{head}*"), *[section(code("\n".join(b))) for b in boxes][:49]])


def internal_error(what: str, error: str) -> Rendered:
    return reply(f"babysit could not {what}: {error}. The bot log on the babysat host has the details.")
