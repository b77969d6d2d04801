"""The daemon's calls into campaigns: after a run's FINAL verdict is saved and queued, and at start."""

from __future__ import annotations

from typing import Any

import structlog

from babysit.campaign.outcomes import on_final_verdict, reconcile
from babysit.core.errors import BabysitError

log = structlog.get_logger("babysit.campaign")


def after_final_verdict(supervisor: Any, verdict: dict[str, Any]) -> None:
    """Carry out, hold or suspend the campaign's grids this verdict settles (nothing for a run outside a
    campaign). Never raises: a failure is an internal-error incident on the run, and its verdict stands."""
    try:
        on_final_verdict(supervisor.ctx, supervisor.spec, verdict)
    except BabysitError as exc:
        supervisor.internal_error("carrying out the campaign's grid", exc)
    except Exception as exc:  # one campaign's data never stops the daemon
        supervisor.internal_error("carrying out the campaign's grid", exc)


def catch_up(ctx: Any) -> None:
    """At the daemon's start: every campaign's due steps (a daemon killed between a FINAL verdict and
    its campaign's records, an amendment recorded while no daemon was up). Never raises."""
    try:
        names = [c["name"] for c in ctx.store.campaigns()]
    except Exception as exc:
        log.error("campaigns not reconciled at start", exc_info=exc)
        return
    for name in names:
        try:
            reconcile(ctx.store, name, state_dir=ctx.state_dir, default_channel=ctx.default_channel, now=ctx.now())
        except Exception as exc:  # logged with its cause; the next FINAL verdict of the campaign redoes it
            log.error("campaign not reconciled at start", campaign=name, exc_info=exc)
