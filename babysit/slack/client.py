"""The one Slack Web API client factory: every call babysit makes to Slack goes through a client made here.

Tokens come only from the environment and are handed to slack_sdk, never formatted into a message:
the error texts built in `babysit/slack/errors.py` carry Slack's error code and the method name only.
`BABYSIT_SLACK_API_URL` points the client elsewhere (the tests' local server).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from slack_sdk import WebClient

DEFAULT_API_URL = "https://slack.com/api/"
API_URL_ENV = "BABYSIT_SLACK_API_URL"
TOKEN_ENV = "SLACK_BOT_TOKEN"


def api_url() -> str:
    url = os.environ.get(API_URL_ENV) or DEFAULT_API_URL
    return url if url.endswith("/") else url + "/"


def web_client(token: str | None = None, *, timeout: int = 15, retries: bool = False) -> WebClient:
    """A WebClient on `BABYSIT_SLACK_API_URL`.

    `retries=False` (the daemon's channel) turns off slack_sdk's own retry handlers: the outbox
    retries, with backoff and Retry-After, and a hidden in-client retry of a post that Slack had
    in fact accepted would post it twice.
    """
    from slack_sdk import WebClient  # lazy: ~0.1 s, paid only by a process that talks to Slack

    token = token if token is not None else os.environ.get(TOKEN_ENV)
    return WebClient(token=token, base_url=api_url(), timeout=timeout,
                     **({} if retries else {"retry_handlers": []}))
