"""`babysit run`'s foreground: the run's own stdout and stderr passed through as it prints them, and
(when another daemon babysits it) the run's messages as they are queued.

The trainer writes to the files the executor captures (`<state_dir>/runs/<run>/attempt-<n>/stdout.log`
and `stderr.log`: babysit reads its records there), so the terminal gets them from there too, every
attempt in turn, a tenth of a second behind. A progress bar redrawn with `\\r` shows its newest frame:
once a second while it is redrawn, whole when its line ends; never every redraw.
"""

from __future__ import annotations

import codecs
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TextIO

from babysit.core.render import render
from babysit.db.store import Store
from babysit.sources import stdout as captured
from babysit.sources import tailer
from babysit.sources.pump import run_dir

CHUNK = 1 << 20
FRAME_SECONDS = 1.0


class _Stream:
    """One captured file followed from where it was last read, its text decoded across reads."""

    def __init__(self, path: Path, out: TextIO) -> None:
        self.path = path
        self.out = out
        self.cursor = tailer.Cursor()  # the one tailer's: a file replaced or truncated is shown again from its start
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.partial = ""
        self.frame_at = 0.0
        self.shown_frame = ""

    def pump(self, now: float, final: bool = False) -> None:
        got = tailer.read(self.path, self.cursor, CHUNK)
        if got is None:
            return
        if got.reset:  # another file in its place: its text from the start, nothing of the old one's last line
            self.decoder.reset()
            self.partial = ""
        data = got.data
        self.cursor = got.advance(len(data))
        text = self.partial + self.decoder.decode(data, final=final)
        *whole, self.partial = text.split("\n")
        lines = [line.rsplit("\r", 1)[-1] if "\r" in line else line for line in whole]
        frame = self.partial.rstrip("\r").rsplit("\r", 1)[-1] if "\r" in self.partial else None
        if final and self.partial:
            lines.append(frame if frame is not None else self.partial)
            self.partial, frame = "", None
        if lines:
            self.out.write("".join(line + "\n" for line in lines))
            self.shown_frame = ""
        elif frame and frame != self.shown_frame and now - self.frame_at >= FRAME_SECONDS:
            self.out.write(frame.strip() + "\n")  # a bar being redrawn: its newest frame, once a second
            self.shown_frame, self.frame_at = frame, now
        self.out.flush()


class Follower(threading.Thread):
    """Passes the run's captured output through to `out` (stdout.log) and `err` (stderr.log); with
    `messages`, also prints the run's queued messages (the daemon that sends them is another process)."""

    def __init__(self, state_dir: Path, run: str, out: TextIO, err: TextIO, *, messages: bool = False,
                 interval: float = 0.1, open_store: Callable[[], Store | None] | None = None) -> None:
        super().__init__(name="babysit-follow", daemon=True)
        self.run_dir = run_dir(state_dir, run)
        self.state_dir = Path(state_dir)
        self.run_name = run
        self.out, self.err = out, err
        self.messages = messages
        self.interval = interval
        self._streams: dict[Path, _Stream] = {}
        self._seen_message = 0
        self._store: Store | None = None
        self._open_store = open_store or self._state_db  # a fleet's: babysit.db.url.open_existing
        self._done = threading.Event()
        self._lock = threading.Lock()

    def run(self) -> None:
        while not self._done.wait(self.interval):
            self.pump()

    def pump(self, final: bool = False) -> None:
        with self._lock:
            now = time.monotonic()
            for path in captured.captured_files(self.run_dir):
                stream = self._streams.get(path)
                if stream is None:
                    stream = self._streams[path] = _Stream(path, self.out if path.name == "stdout.log" else self.err)
                stream.pump(now, final=final)
            if self.messages:
                self._print_messages()

    def _print_messages(self) -> None:
        if self._store is None:
            self._store = self._open_store()
            if self._store is None:
                return
        for m in self._store.messages(self.run_name):
            if m.id <= self._seen_message:
                continue
            self._seen_message = m.id
            if m.kind == "header":
                continue
            try:
                text = render(m.kind, m.payload).text
            except Exception:  # a message this version cannot render: the daemon's channel still sends it
                continue
            self.out.write(text + "\n")
        self.out.flush()

    def _state_db(self) -> Store | None:
        """This box's SQLite once a daemon has made it (a follower never creates it)."""
        db = self.state_dir / "state.db"
        return Store(db) if db.exists() else None

    def stop(self) -> None:
        """The last of the output, whole (a bar's last frame too)."""
        self._done.set()
        if self.is_alive():
            self.join(timeout=5)
        self.pump(final=True)
        if self._store is not None:
            self._store.close()
