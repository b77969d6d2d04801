"""structlog setup: JSON lines to `<state>/daemon.log`, readable lines on a terminal, secrets redacted.

Tokens reach babysit only through the environment; this processor makes sure none of them, nor
anything shaped like a Slack token, is ever written to a log.
"""

from __future__ import annotations

import logging
import os
import re
import sys
from pathlib import Path
from typing import Any, TextIO

import structlog

SECRET_ENV = ("SLACK_BOT_TOKEN", "SLACK_APP_TOKEN", "SLACK_SIGNING_SECRET")
_TOKEN_SHAPE = re.compile(r"xox[abeoprs]-[A-Za-z0-9-]+|xapp-[A-Za-z0-9-]+")


def redact_text(text: str) -> str:
    for name in SECRET_ENV:
        secret = os.environ.get(name)
        if secret and len(secret) >= 6:
            text = text.replace(secret, "[redacted]")
    return _TOKEN_SHAPE.sub("[redacted]", text)


def _redact(_: Any, __: str, event: dict[str, Any]) -> dict[str, Any]:
    return {k: redact_text(v) if isinstance(v, str) else v for k, v in event.items()}


def _not_posted(record: logging.LogRecord) -> bool:
    """The console shows each event once: an event logged with `posted=True` is also a channel message
    (an incident, a refused spec), which the console channel prints rendered; daemon.log keeps it."""
    return not (isinstance(record.msg, dict) and record.msg.get("posted"))


def configure(state_dir: Path | None, *, console: bool | None = None, level: int = logging.INFO,
              stream: TextIO | None = None, hide_posted: bool = False) -> None:
    """Route structlog (and stdlib logging, e.g. APScheduler's) to daemon.log and, on a tty, stderr.

    `stream` replaces stderr for the console lines: `babysit up`'s live view passes the stream that
    prints above its table, so a warning never tears it (everything still goes to daemon.log).
    `hide_posted`: the channel prints on this console too (the console channel): an event that is also a
    message (logged with `posted=True`) is shown once, as the message, not again as a log line.
    """
    console = sys.stderr.isatty() if console is None else console
    shared = [structlog.contextvars.merge_contextvars, structlog.processors.add_log_level,
              structlog.processors.TimeStamper(fmt="iso", utc=True), _redact]
    structlog.configure(
        processors=[*shared, structlog.stdlib.ProcessorFormatter.wrap_for_formatter],
        logger_factory=structlog.stdlib.LoggerFactory(),
        cache_logger_on_first_use=False,
    )
    root = logging.getLogger()
    for handler in list(root.handlers):
        if getattr(handler, "_babysit", False):
            root.removeHandler(handler)
    if state_dir is not None:
        Path(state_dir).mkdir(parents=True, exist_ok=True, mode=0o700)
        path = Path(state_dir) / "daemon.log"
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        os.close(fd)
        handler = logging.FileHandler(path, encoding="utf-8")
        handler.setFormatter(structlog.stdlib.ProcessorFormatter(
            processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                        structlog.processors.format_exc_info, structlog.processors.JSONRenderer()],
            foreign_pre_chain=shared))
        handler._babysit = True  # type: ignore[attr-defined]
        root.addHandler(handler)
    if console:
        handler = logging.StreamHandler(stream or sys.stderr)
        handler.setFormatter(structlog.stdlib.ProcessorFormatter(
            processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                        structlog.dev.ConsoleRenderer(colors=False)],
            foreign_pre_chain=shared))
        handler.setLevel(logging.WARNING)
        if hide_posted:
            handler.addFilter(_not_posted)
        handler._babysit = True  # type: ignore[attr-defined]
        root.addHandler(handler)
    root.setLevel(level)
    logging.getLogger("apscheduler").setLevel(logging.WARNING)
