"""The last lines of a process's output as a person should read them: one rule for every stderr or
stdout tail babysit shows (the exit's tail, the classifier's, incidents, posts, the web page).

A progress bar (tqdm, HF, Lightning) redraws its line with carriage returns: read raw, one line holds
hundreds of redraws, and split on `\\r` the tail is nothing but bar fragments. Each line keeps only
what a terminal would show, its text after the last `\\r` (ANSI cursor moves dropped), and a line
repeated is kept once.
"""

from __future__ import annotations

import re

_CURSOR = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")  # ANSI cursor moves and colours (tqdm's nested bars: ESC[A)


def collapse(text: str) -> list[str]:
    """Lines as a terminal shows them: split on newlines only, each line's last `\\r` segment, no
    consecutive duplicates (a CRLF line ending is a line ending, not a redraw), no ANSI escapes."""
    out: list[str] = []
    for raw in _CURSOR.sub("", text).replace("\r\n", "\n").split("\n"):
        segments = [s for s in raw.split("\r") if s.strip()]
        line = segments[-1] if segments else ""
        if out and out[-1] == line:
            continue
        out.append(line)
    while out and not out[-1].strip():
        out.pop()
    return out


def last_lines(text: str, n: int) -> str:
    """The last `n` collapsed lines, joined with newlines."""
    return "\n".join(collapse(text)[-n:])
