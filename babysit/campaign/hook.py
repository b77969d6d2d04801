"""The daemon's one call into campaigns: after a run's FINAL verdict is saved and queued."""

from __future__ import annotations

from typing import Any

from babysit.campaign.actions import on_final_verdict
from babysit.core.errors import BabysitError


def after_final_verdict(supervisor: Any, verdict: dict[str, Any]) -> None:
    """Carry out the campaign's grid for this verdict (nothing for a run outside a campaign). Never
    raises: a failure is an internal-error incident on the run, and its verdict stands."""
    try:
        on_final_verdict(supervisor.ctx, supervisor.spec, verdict)
    except BabysitError as exc:
        supervisor.internal_error("carrying out the campaign's grid", exc)
    except Exception as exc:  # one campaign's data never stops the daemon
        supervisor.internal_error("carrying out the campaign's grid", exc)
