"""Named crash points for the reliability campaign (tests/reliability, docs/reliability.md).

`crash_point("after-launch")` SIGKILLs the current process when `BABYSIT_CRASH_AT` names that point:
`NAME` crashes on the first hit, `NAME:N` on the Nth hit in this process. SIGKILL, not an exception:
nothing is flushed, no `finally` runs — exactly what a power cut or the OOM killer does. With the
variable unset (always, outside tests) a call is one global lookup and a compare.

Points: after-begin-attempt, after-launch, after-send, registry-before-replace, after-mark-ended,
after-request (a control request carried out, its answer not yet written);
chart-after-url, chart-after-bytes, chart-after-complete (babysit/slack/upload.py: each step of a chart's
upload has taken effect in Slack, and is not journalled yet).
"""

from __future__ import annotations

import os
import signal

ENV = "BABYSIT_CRASH_AT"


def _parse(text: str | None) -> tuple[str, int] | None:
    if not text:
        return None
    name, _, count = text.partition(":")
    return name, int(count) if count.isdigit() and int(count) > 0 else 1


_TARGET = _parse(os.environ.get(ENV))
_hits = 0


def crash_point(name: str) -> None:
    """SIGKILL this process if `BABYSIT_CRASH_AT` names this point (and this is the Nth hit)."""
    global _hits
    if _TARGET is None or _TARGET[0] != name:
        return
    _hits += 1
    if _hits >= _TARGET[1]:
        os.kill(os.getpid(), signal.SIGKILL)
