"""What each slash command does, in Bolt's calling convention (`ack`, `respond`) but importing no Bolt.

Every handler acks at once — with the answer when it is a quick store read, with a "working…" line
when it is not — and sends slow answers through `respond` (the response_url), so Slack's 3-second
limit never bites. Only `abort` and `relaunch` change anything, and only after the allow-list check
(abort after a click on a confirmed button too); `poll` asks the daemon for one extra poll. All three go
through the store's control table, which the daemon reads every tick.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import structlog

from babysit.core.errors import BabysitError
from babysit.core.render import Rendered, chart_comment, verdict_card
from babysit.db.url import fleet_owner
from babysit.register import relaunch as relaunch_mod
from babysit.runtime import registry as registry_mod
from babysit.view import runview
from bot import messages as msg
from bot.context import BotConfig, opened, owner_elsewhere, unanswered, wait_result
from bot.gpus import box_lines, read_gpus, run_owners
from bot.messages import answer
from bot.owner_calls import campaign_reply
from bot.predicates import Command, action_value, close_names, may_abort, user_of, wants_post
from bot.reads import chart_file, fleet_rows, stored_verdict, verdict_body

log = structlog.get_logger("babysit.bot")

Ack = Callable[..., Any]
Respond = Callable[..., Any]


def known_run(reg: registry_mod.Registry, name: str | None, usage: str, *, fleet: bool = False) -> Rendered | None:
    """None when `name` is registered (with `fleet`: here or on another box of the fleet, which carries
    out a request for it), else the message to answer with."""
    if not name:
        return msg.missing_run(usage)
    if reg.find(name) is None and not (fleet and fleet_owner(reg, name) is not None):
        return msg.unknown_run(name, close_names(name, reg.names), len(reg.runs))
    return None


# -- /babysit ------------------------------------------------------------------------------------------
def babysit(cfg: BotConfig, cmd: Command, body: Mapping[str, Any], ack: Ack, respond: Respond,
            client: Any) -> None:
    handler = BABYSIT.get(cmd.name)
    if handler is None:
        ack(**answer(msg.unknown_subcommand(cmd.name)))
        return
    try:
        handler(cfg, cmd, body, ack, respond, client)
    except BabysitError as exc:  # a broken registry, an unreadable state database: say so, never a 500
        log.warning("slash command failed", command=cmd.name, error=exc.message)
        reply = msg.internal_error(f"answer /babysit {cmd.name}", exc.message)
        _ack_or_respond(ack, respond, reply)


def _ack_or_respond(ack: Ack, respond: Respond, reply: Rendered) -> None:
    try:
        ack(**answer(reply))
    except Exception:  # already acked: Bolt refuses a second ack
        respond(**answer(reply))


def help_(cfg: BotConfig, cmd: Command, body: Mapping[str, Any], ack: Ack, respond: Respond, client: Any) -> None:
    ack(**answer(msg.help_message()))


def status(cfg: BotConfig, cmd: Command, body: Mapping[str, Any], ack: Ack, respond: Respond, client: Any) -> None:
    reg = registry_mod.load(cfg.registry_path)
    if cmd.run and (problem := known_run(reg, cmd.run, "/babysit status [RUN]", fleet=True)):
        ack(**answer(problem))
        return
    rows, boxes = fleet_rows(reg, [cmd.run] if cmd.run else None)  # None: in a fleet, every box's runs
    ack(**answer(msg.status_message(rows, time.time(), boxes)))


def runs(cfg: BotConfig, cmd: Command, body: Mapping[str, Any], ack: Ack, respond: Respond, client: Any) -> None:
    reg = registry_mod.load(cfg.registry_path)
    ack(**answer(msg.runs_message(fleet_rows(reg)[0])))  # every box's


def poll(cfg: BotConfig, cmd: Command, body: Mapping[str, Any], ack: Ack, respond: Respond, client: Any) -> None:
    with opened(cfg) as (reg, store):
        if problem := known_run(reg, cmd.run, "/babysit poll RUN", fleet=True):
            ack(**answer(problem))
            return
        run = str(cmd.run)
        request = store.request(run, "poll-now", f"slack:{user_of(body)}", time.time())
        ack(**answer(msg.poll_queued(run)))
        result = wait_result(store, request, cfg.request_wait_s, run)
        if result is None:
            respond(**answer(unanswered(store, run, "poll", request, cfg.request_wait_s)))
            return
        polls = store.polls(run, 1)
        respond(**answer(msg.poll_result(run, result, polls[0].snapshot if polls else None)))


def abort(cfg: BotConfig, cmd: Command, body: Mapping[str, Any], ack: Ack, respond: Respond, client: Any) -> None:
    """Step one of two: refuse, or show the confirm button. Nothing is queued here."""
    reg = registry_mod.load(cfg.registry_path)
    if problem := known_run(reg, cmd.run, "/babysit abort RUN", fleet=True):
        ack(**answer(problem))
        return
    user = user_of(body)
    if not may_abort(user, reg.daemon.abort_allow_list):
        log.info("abort refused", run=cmd.run, user=user)
        ack(**answer(msg.not_allowed(str(user), "abort", str(cmd.run))))
        return
    ack(**answer(msg.abort_confirm(str(cmd.run))))


def abort_confirmed(cfg: BotConfig, body: Mapping[str, Any], ack: Ack, respond: Respond) -> None:
    """Step two: the confirmed click. The allow list is checked again: a button is not a credential."""
    ack()
    run, user = action_value(body, msg.ABORT_ACTION_ID), user_of(body)
    with opened(cfg) as (reg, store):
        if problem := known_run(reg, run, "/babysit abort RUN", fleet=True):
            respond(**answer(problem, replace=True))
            return
        if not may_abort(user, reg.daemon.abort_allow_list):
            respond(**answer(msg.not_allowed(str(user), "abort", str(run)), replace=True))
            return
        request = store.request(str(run), "abort", f"slack:{user}", time.time())
        log.warning("abort requested from Slack", run=run, user=user, request=request)
        respond(**answer(msg.abort_queued(str(run), str(user)), replace=True))
        result = wait_result(store, request, cfg.request_wait_s, str(run))
        if result is None:
            respond(**answer(unanswered(store, str(run), "abort", request, cfg.request_wait_s)))
            return
    respond(**answer(msg.abort_result(str(run), result)))


def relaunch(cfg: BotConfig, cmd: Command, body: Mapping[str, Any], ack: Ack, respond: Respond,
             client: Any) -> None:
    """`/babysit relaunch RUN [resume]`: the checks and the re-registration of `babysit relaunch`
    (relaunch.prepare, through registration.register), then the daemon's answer."""
    reg = registry_mod.load(cfg.registry_path)
    if problem := known_run(reg, cmd.run, "/babysit relaunch RUN [resume]", fleet=True):
        ack(**answer(problem))
        return
    user, run = user_of(body), str(cmd.run)
    if not may_abort(user, reg.daemon.abort_allow_list):
        log.info("relaunch refused", run=run, user=user)
        ack(**answer(msg.not_allowed(str(user), "relaunch", run)))
        return
    ack(**answer(msg.relaunch_working(run, str(user))))
    with opened(cfg) as (_, store):
        owner = owner_elsewhere(store, run)
        if owner is not None:  # its run.toml is on its box: that box checks, re-registers and relaunches it
            action = next(a for a, resume in relaunch_mod.ASKED.items() if resume == ("resume" in cmd.rest))
            request = store.request(run, action, f"slack:{user}", time.time())
            log.warning("relaunch requested from Slack for another box", run=run, box=owner, user=user,
                        request=request)
            result = wait_result(store, request, cfg.request_wait_s, run)
            if result is None:
                respond(**answer(unanswered(store, run, "relaunch", request, cfg.request_wait_s)))
                return
    if owner is not None:
        respond(**answer(msg.relaunch_result(run, result)))
        return
    try:
        # the cadence is the daemon's to hold to its own mode (--accelerated or not) when it relaunches
        relaunch_mod.prepare(cfg.registry_path, run, accelerated=True)
    except BabysitError as exc:
        respond(**answer(msg.relaunch_refused(run, exc.message, exc.hint)))
        return
    request = relaunch_mod.request(reg, run, f"slack:{user}", resume="resume" in cmd.rest)
    log.warning("relaunch requested from Slack", run=run, user=user, request=request)
    with opened(cfg) as (_, store):
        result = wait_result(store, request, cfg.request_wait_s)
    if result is None:
        respond(**answer(msg.request_unanswered(run, "relaunch", request, cfg.request_wait_s)))
    else:
        respond(**answer(msg.relaunch_result(run, result)))


def gpus(cfg: BotConfig, cmd: Command, body: Mapping[str, Any], ack: Ack, respond: Respond, client: Any) -> None:
    """This box's GPUs read now; in a fleet, every other box's as it published them, with their age."""
    ack(**answer(msg.reply("🖥 Reading the GPUs…")))
    others: list[list[str]] = []
    with opened(cfg) as (_, store):
        owners = run_owners(store)
        quarantined = store.quarantined_gpus()
        if store.host is not None:
            hosts, now = store.hosts(), store.now()
            states = runview.host_states(hosts)
            others = [box_lines(h, runview.box_staleness(h, states[h.name], now), now,
                                store.quarantined_gpus(h.name)) for h in hosts if h.name != store.host]
    lines, reason = read_gpus(owners, cfg.gpu_probe, quarantined)
    respond(**answer(msg.gpus_message(lines, reason, here=store.host, others=others)))


def chart(cfg: BotConfig, cmd: Command, body: Mapping[str, Any], ack: Ack, respond: Respond, client: Any) -> None:
    from slack_sdk.errors import SlackApiError  # lazy: slack_sdk is imported only where Slack answers

    with opened(cfg) as (reg, store):
        if problem := known_run(reg, cmd.run, "/babysit chart RUN", fleet=True):
            ack(**answer(problem))
            return
        ack(**answer(msg.chart_working(str(cmd.run))))
        try:
            if (owner := owner_elsewhere(store, str(cmd.run))) is not None:
                stored = stored_verdict(store, str(cmd.run), owner)
                if stored.chart_path is None or not Path(stored.chart_path).is_file():
                    # the records it would be drawn from are on that box: its stored verdict, said so
                    respond(**answer(msg.remote_chart(str(cmd.run), stored, verdict_card(stored.body))))
                    return
                path, verdict = Path(stored.chart_path), stored.body  # a filesystem the boxes share
            else:
                path, verdict = chart_file(reg, reg.get(str(cmd.run)), store)
        except BabysitError as exc:
            respond(**answer(msg.verdict_unavailable(str(cmd.run), exc.message)))
            return
    try:
        client.files_upload_v2(channel=body.get("channel_id"), file=str(path), filename=path.name,
                               title=f"{cmd.run} verdict chart",
                               initial_comment=chart_comment(str(cmd.run), verdict))
    except SlackApiError as exc:
        respond(**answer(msg.slack_refused("upload the chart", str(exc.response.get("error")))))
        return
    respond(**answer(msg.chart_uploaded(str(cmd.run))))


def campaign(cfg: BotConfig, cmd: Command, body: Mapping[str, Any], ack: Ack, respond: Respond,
             client: Any) -> None:
    ack(**answer(campaign_reply(cfg, cmd.run)))


BABYSIT: dict[str, Callable[..., None]] = {
    "help": help_, "status": status, "runs": runs, "poll": poll, "abort": abort, "gpus": gpus, "chart": chart,
    "campaign": campaign, "relaunch": relaunch,
}


# -- /verdict ------------------------------------------------------------------------------------------
def verdict(cfg: BotConfig, cmd: Command, body: Mapping[str, Any], ack: Ack, respond: Respond) -> None:
    with opened(cfg) as (reg, store):
        if problem := known_run(reg, cmd.run, "/verdict RUN [post]", fleet=True):
            ack(**answer(problem))
            return
        ack(**answer(msg.verdict_working(str(cmd.run))))
        try:
            if (owner := owner_elsewhere(store, str(cmd.run))) is not None:
                stored = stored_verdict(store, str(cmd.run), owner)
                card = msg.with_note(verdict_card(stored.body), stored.note)
                respond(**answer(card, in_channel=wants_post(cmd)))
                return
            v, precision = verdict_body(reg, reg.get(str(cmd.run)), store)
        except BabysitError as exc:
            reason = exc.message + (f" — {exc.hint}" if exc.hint else "")
            respond(**answer(msg.verdict_unavailable(str(cmd.run), reason)))
            return
    respond(**answer(verdict_card(v, precision), in_channel=wants_post(cmd)))
