"""Watching runs from the store: a live table on a terminal, a line per change anywhere else.

`babysit up` and `babysit demo` run a `Watcher` thread beside the daemon; `babysit status --watch`
runs `watch` in its main thread. Either way the rows come from `runview.Reader` (its own SQLite
connection, read-only queries), so watching costs the daemon no lock and writes nothing.

On a terminal the table is a `rich.live.Live` display. Anything else printed meanwhile (the console
channel's messages, the daemon's warnings) must go *above* it or it tears the table: `LiveView.out`
is the stream to hand them, and the Live display also redirects sys.stdout and sys.stderr.
"""

from __future__ import annotations

import sqlite3
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol, TextIO

import structlog

from babysit.core.errors import BabysitError
from babysit.db.redact import redact
from babysit.db.url import store_url
from babysit.view.runtable import change_line, live_table
from babysit.view.runview import Reader, RunRow

log = structlog.get_logger("babysit.view.watch")


class View(Protocol):
    out: TextIO  # where other output goes while the view is shown
    live: bool  # redrawn in place: anything printed elsewhere would tear it

    def show(self, rows: Sequence[RunRow] | None, now: float, footer: str) -> None:
        """`rows` None: the store could not be read this time (the footer says why)."""

    def close(self, *, erase: bool = False) -> None: ...


def change_key(row: RunRow) -> tuple:
    """What makes a new line in the plain view: the state, the attempt, the step, a new incident, an end
    or a new read. Not the clock: an unchanged run prints nothing, however often it is looked at."""
    incident = (row.last_incident.kind, row.last_incident.at) if row.last_incident else None
    verdict = (row.verdict.status, row.verdict.label, row.verdict.at_step) if row.verdict else None
    return row.status, row.attempt, row.step, incident, row.outcome, verdict


class PlainView:
    """Not a terminal (a pipe, a file, CI): a line per run each time something about it changed."""

    live = False

    def __init__(self, stream: TextIO) -> None:
        self.out = stream
        self._seen: dict[str, tuple] = {}
        self._lock = threading.Lock()

    def show(self, rows: Sequence[RunRow] | None, now: float, footer: str) -> None:
        with self._lock:
            if rows is None:
                self.out.write("  ·· " + footer + "\n")
            for row in rows or ():
                key = change_key(row)
                if self._seen.get(row.run) != key:
                    self._seen[row.run] = key
                    self.out.write("  ·· " + change_line(row, now) + "\n")  # one write: whole lines only
            self.out.flush()

    def close(self, *, erase: bool = False) -> None:
        self.out.flush()


class LiveView:
    """A terminal: the table redrawn in place (rich.live.Live), other output printed above it."""

    live = True

    def __init__(self, stream: TextIO, *, transient: bool = False) -> None:
        from rich.console import Console
        from rich.file_proxy import FileProxy
        from rich.live import Live

        self.console = Console(file=stream)
        # Taller than the screen: cropped with an ellipsis while live (a redraw cannot reach above the
        # screen's top), shown whole when it stops.
        self.live = Live(console=self.console, auto_refresh=False, transient=transient,
                         redirect_stdout=True, redirect_stderr=True, vertical_overflow="ellipsis")
        self.out = WholeLines(FileProxy(self.console, stream))
        self.live.start()

    def show(self, rows: Sequence[RunRow] | None, now: float, footer: str) -> None:
        self.live.update(live_table(rows, now, footer), refresh=True)

    def close(self, *, erase: bool = False) -> None:
        self.out.flush()
        if erase:
            self.live.transient = True
        self.live.stop()


class WholeLines:
    """The stream above the live table, shared by threads (the daemon's warnings, the console channel's
    messages, the web server's): each thread's text reaches it a whole line at a time. rich's FileProxy
    keeps one buffer for everyone, and `print` writes a line and its newline in two calls, so a warning
    logged between them was spliced onto the end of a message, and wrapped, torn, on the screen."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self._lock = threading.Lock()
        self._partial = threading.local()

    def write(self, text: str) -> int:
        head, newline, tail = (getattr(self._partial, "text", "") + text).rpartition("\n")
        self._partial.text = tail
        if newline:
            with self._lock:
                self._stream.write(head + newline)
        return len(text)

    def flush(self) -> None:
        """This thread's unfinished line too (it is printed as a line of its own)."""
        text, self._partial.text = getattr(self._partial, "text", ""), ""
        with self._lock:
            if text:
                self._stream.write(text)
            self._stream.flush()

    def __getattr__(self, name: str) -> object:  # isatty, encoding, …: the wrapped stream's
        return getattr(self._stream, name)


def open_view(stream: TextIO, *, transient: bool = False) -> View:
    """The live table when `stream` is a terminal, plain lines otherwise."""
    if stream.isatty():
        return LiveView(stream, transient=transient)
    return PlainView(stream)


class Watcher(threading.Thread):
    """Refreshes a view from the store every `interval` seconds until `stop()`; a daemon thread, so a
    crash of the process never waits on it."""

    def __init__(self, registry_path: Path, view: View, *, interval: float, footer: str = "",
                 names: Sequence[str] | None = None) -> None:
        super().__init__(name="babysit-watch", daemon=True)
        self.view = view
        self.names = names  # None: every registered run
        self.interval = interval
        self.footer = footer
        self.reader = Reader(registry_path)
        self._stop_event = threading.Event()
        self._refresh_lock = threading.Lock()

    def run(self) -> None:
        while True:
            try:
                self.refresh()
            except Exception:  # a bug in the view must not end it silently, nor touch the daemon beside it
                log.exception("live view refresh failed; trying again at the next interval")
            if self._stop_event.wait(self.interval):
                return

    def refresh(self) -> None:
        with self._refresh_lock:
            now = time.time()
            self.view.show(*_look(self.reader, self.names, now, self.footer))

    def stop(self, *, erase: bool = False) -> None:
        """The last refresh (so the table shows how things ended), then the terminal is given back."""
        self._stop_event.set()
        if self.is_alive():
            self.join(timeout=10)
        try:
            if not erase:
                self.refresh()
        finally:
            self.view.close(erase=erase)
            self.reader.close()


def watch(registry_path: Path, names: Sequence[str] | None, *, interval: float, stream: TextIO | None = None) -> int:
    """`babysit status --watch`: redraw until Ctrl-C, which ends it cleanly (exit 0)."""
    stream = stream or sys.stdout
    view = open_view(stream)
    reader = Reader(registry_path)
    url = store_url(reader.registry)  # a fleet's PostgreSQL (its password left out), or this box's state.db
    footer = f"every {interval:g}s from {redact(url) if url else reader.state_dir / 'state.db'} · Ctrl-C to quit"
    try:
        while True:
            now = time.time()
            view.show(*_look(reader, names, now, footer))
            time.sleep(interval)
    except KeyboardInterrupt:
        pass
    finally:
        view.close()
        reader.close()
    return 0


def _look(reader: Reader, names: Sequence[str] | None, now: float,
          footer: str) -> tuple[list[RunRow] | None, float, str]:
    """Rows and the footer that goes with them; a store that cannot be read this time (locked, being
    migrated) says so in the footer and keeps the view up."""
    clock = time.strftime("%H:%M:%S", time.localtime(now))
    try:
        rows = reader.rows(names, now)
    except (BabysitError, sqlite3.Error) as exc:
        message = exc.message if isinstance(exc, BabysitError) else str(exc)
        return None, now, f"{clock} · could not read the state: {message} · {footer}"
    banner = reader.banner()  # PostgreSQL unreachable: this box's runs from its mirror, said with its age
    text = f"{clock} · {footer}" if footer else clock
    return rows, now, f"{banner} · {text}" if banner else text
