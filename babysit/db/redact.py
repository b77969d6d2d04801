"""A store url as it may be shown: without its password (messages, logs, `babysit db`). Apart from url.py,
which imports the PostgreSQL store lazily, so that the store can use it without an import circle."""

from __future__ import annotations

import re


def redact(url: str) -> str:
    """The url without its password, for messages and logs."""
    return re.sub(r"(://[^:/@]*):[^@/]*@", r"\1:***@", url)
