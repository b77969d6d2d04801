"""What the Slack channel began and finished, on disk, so a restarted daemon never posts twice.

The outbox marks a message sent only after Slack accepted it; a daemon killed between the two would
post it again. So before each Slack side effect the channel appends `begin KEY` here (fsynced), and
after it `done KEY REF`. On the next try: `done` → reuse REF, no call; `begin` without `done` → the
call may have landed, so look for it in Slack first (babysit/slack/channel.py). Append-only JSON lines:
a torn last line (killed mid-write) is skipped, which at worst costs one lookup.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path


class Journal:
    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self._began: set[str] = set()
        self._done: dict[str, str] = {}
        self._load()

    def _load(self) -> None:
        try:
            lines = self.path.read_text(encoding="utf-8").splitlines()
        except FileNotFoundError:
            return
        for line in lines:
            try:
                entry = json.loads(line)
                key = str(entry["k"])
            except (ValueError, KeyError, TypeError):
                continue  # a torn line from a killed writer
            self._began.add(key)
            if "ref" in entry:
                self._done[key] = str(entry["ref"])

    def began(self, key: str) -> bool:
        return key in self._began

    def ref(self, key: str) -> str | None:
        return self._done.get(key)

    def begin(self, key: str) -> None:
        self._append({"k": key})
        self._began.add(key)

    def done(self, key: str, ref: str) -> None:
        self._append({"k": key, "ref": ref})
        self._began.add(key)
        self._done[key] = ref

    def _append(self, entry: dict[str, str]) -> None:
        with self._lock:
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            try:
                os.write(fd, (json.dumps(entry) + "\n").encode("utf-8"))
                os.fsync(fd)
            finally:
                os.close(fd)
