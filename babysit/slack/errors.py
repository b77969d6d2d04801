"""Which Slack failures are worth retrying: decided by status and error code, pure and table-driven.

429 and 5xx are the server's trouble and pass; bad tokens, unknown channels and malformed
messages are ours and retrying cannot fix them. Anything not listed as transient is permanent,
so a new Slack error code fails loudly in the outbox instead of retrying forever.
"""

from __future__ import annotations

import http.client
import socket
import urllib.error
from collections.abc import Mapping
from typing import Any

from babysit.core.errors import PermanentDeliveryError, TransientDeliveryError

TRANSIENT_CODES = frozenset({
    "ratelimited", "rate_limited", "internal_error", "fatal_error", "service_unavailable", "request_timeout",
    "team_added_to_org",
})
NETWORK_ERRORS = (urllib.error.URLError, http.client.HTTPException, ConnectionError, TimeoutError, socket.timeout)


def is_transient(status: int | None, error_code: str | None) -> bool:
    """429, any 5xx, and Slack's own "try again" codes."""
    if status is not None and (status == 429 or status >= 500):
        return True
    return (error_code or "") in TRANSIENT_CODES


def retry_after(headers: Mapping[str, Any] | None) -> float | None:
    """Retry-After in seconds, however the header is cased; None when absent or unreadable."""
    for key, value in (headers or {}).items():
        if key.lower() == "retry-after":
            try:
                return max(0.0, float(value[0] if isinstance(value, list) else value))
            except (TypeError, ValueError):
                return None
    return None


def delivery_error(exc: BaseException, method: str) -> Exception:
    """Map anything slack_sdk or the network raised into the outbox's two error types.

    The message names the method and Slack's error code or the exception type: never the request,
    whose headers carry the token.
    """
    from slack_sdk.errors import SlackApiError, SlackRequestError

    if isinstance(exc, SlackApiError):
        response = exc.response
        status = getattr(response, "status_code", None)
        code = response.get("error") if hasattr(response, "get") else None
        text = f"{method}: Slack answered {status} {code or ''}".strip()
        if is_transient(status, code):
            return TransientDeliveryError(text, retry_after(getattr(response, "headers", None)))
        return PermanentDeliveryError(text)
    if isinstance(exc, SlackRequestError):  # e.g. the file upload URL answered non-200
        return TransientDeliveryError(f"{method}: {str(exc)[:200]}")
    if isinstance(exc, NETWORK_ERRORS):
        return TransientDeliveryError(f"{method}: network error {type(exc).__name__}")
    return PermanentDeliveryError(f"{method}: {type(exc).__name__}")
