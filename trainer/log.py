"""The train log (docs/trainer.md, Log records): JSONL, one object a line, flushed per record, rank 0 only.

Every record has `step` (int) and `ts` (unix seconds); other numeric keys are metrics, so the start
record keeps its numbers under a nested `config` dict.
"""

from __future__ import annotations

import json
import math
import os
import socket
import time
from pathlib import Path
from typing import IO, Any


class RunLog:
    """Appends records; a no-op on ranks other than 0 and when no path was given."""

    def __init__(self, path: Path | None, enabled: bool) -> None:
        self._fh: IO[str] | None = None
        if path is not None and enabled:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._fh = path.open("a", encoding="utf-8")

    def write(self, step: int, **fields: Any) -> None:
        if self._fh is None:
            return
        record = {"step": int(step), "ts": time.time()}
        # JSON has no NaN/Infinity; a non-finite metric is dropped rather than written as invalid JSON.
        record.update({k: v for k, v in fields.items() if not (isinstance(v, float) and not math.isfinite(v))})
        self._fh.write(json.dumps(record) + "\n")
        self._fh.flush()

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None


RANK_LOG_ENV = "BABYSIT_RANK_LOG"  # a path with `{rank}` in it; babysit sets it for a job across nodes


class RankBeat:
    """One short line a step from EVERY rank (`$BABYSIT_RANK_LOG`): the step it finished, when, and on
    which node, so babysit can show each node's own pace and name the rank that stopped stepping.
    A no-op without the variable (the train log stays rank 0's alone)."""

    def __init__(self, template: str | None, rank: int) -> None:
        self._fh: IO[str] | None = None
        self.rank = rank
        self.node = os.environ.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]
        if template:
            path = Path(template.replace("{rank}", str(rank)))
            path.parent.mkdir(parents=True, exist_ok=True)
            self._fh = path.open("a", encoding="utf-8")

    def beat(self, step: int, step_time_s: float, ready_s: float) -> None:
        """`ready_s`: the step's time before this rank joined its all-reduce (data, an injected delay):
        in a synchronous step every rank's wall time is the same, this is where a slow node shows."""
        if self._fh is None:
            return
        self._fh.write(json.dumps({"rank": self.rank, "node": self.node, "step": int(step), "ts": time.time(),
                                   "step_time_s": round(step_time_s, 6), "ready_s": round(ready_s, 6),
                                   "pid": os.getpid()}) + "\n")
        self._fh.flush()

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None
