"""The live view's stream above the table, written by several threads at once (the daemon's warnings,
the console channel's messages): each thread's lines reach the screen whole, never spliced together."""

from __future__ import annotations

import io
import re
import threading

from babysit.view.watch import LiveView


class Screen(io.StringIO):
    """What rich writes, read back: a terminal rich will draw on (the live table) in memory."""

    def isatty(self) -> bool:
        return True


def test_a_line_logged_between_a_message_and_its_newline_is_not_spliced_onto_it() -> None:
    screen = Screen()
    view = LiveView(screen)
    message_started, warning_written = threading.Event(), threading.Event()

    def channel() -> None:  # `print` writes the text, then the newline: two calls
        view.out.write("    │ ❌ boom attempt 1 ended: crashed")
        message_started.set()
        warning_written.wait(10)
        view.out.write("\n")

    def daemon_log() -> None:  # logging's StreamHandler: one call, newline included
        message_started.wait(10)
        view.out.write("[warning  ] incident run=boom\n")
        warning_written.set()

    threads = [threading.Thread(target=channel), threading.Thread(target=daemon_log)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    view.out.flush()
    view.close(erase=True)
    lines = [line.strip() for line in re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", screen.getvalue()).splitlines()]
    assert "[warning  ] incident run=boom" in lines
    assert "│ ❌ boom attempt 1 ended: crashed" in lines
    assert not any("crashed[warning" in line for line in lines)  # the splice the shared buffer made
