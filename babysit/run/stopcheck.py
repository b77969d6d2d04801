"""Did the trainer save after a requested stop? The newest checkpoint file written after the stop signal.

What a launcher's exit status cannot say (torchrun exits 1 after any signal, whatever its ranks did), the
checkpoint folder can: a file written there after the signal is the trainer saving on its way out.
`core/classify.py` weighs it with the trainer's stop record; this module only looks (bounded: a folder
of many thousand files is not walked whole at every exit).
"""

from __future__ import annotations

import os
from pathlib import Path

MAX_ENTRIES = 5000  # entries looked at, at most
MAX_DEPTH = 3  # folders below [run].checkpoints (HF: checkpoint-500/…, Lightning: version_0/checkpoints/…)
POINTER_BYTES = 256  # a file this small is a pointer (`latest`), not the checkpoint itself
# Linux stamps a file with its coarse clock (up to a jiffy, 1-10 ms, behind time.time()): a file written
# just after the signal can carry an mtime a few ms before it
MTIME_SLACK_S = 0.02


def written_after(folder: Path, since: float) -> tuple[str, float] | None:
    """(the file's path relative to `folder`, seconds after `since`) of the newest file modified at or after
    `since`, a real checkpoint preferred over a pointer file; None when there is none (or no folder)."""
    best: tuple[bool, float, str] | None = None
    seen = 0
    stack: list[tuple[Path, int]] = [(Path(folder), 0)]
    while stack and seen < MAX_ENTRIES:
        here, depth = stack.pop()
        try:
            entries = list(os.scandir(here))
        except OSError:
            continue
        for entry in entries:
            seen += 1
            try:
                if entry.is_dir(follow_symlinks=False):
                    if depth < MAX_DEPTH:
                        stack.append((Path(entry.path), depth + 1))
                    continue
                st = entry.stat()
            except OSError:
                continue
            if st.st_mtime >= since - MTIME_SLACK_S:
                key = (st.st_size > POINTER_BYTES, st.st_mtime, os.path.relpath(entry.path, folder))
                if best is None or key[:2] > best[:2]:
                    best = key
    if best is None:
        return None
    return best[2], max(0.0, best[1] - since)
