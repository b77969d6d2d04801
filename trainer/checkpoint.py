"""Self-describing checkpoints, written atomically, with a `latest` pointer.

A checkpoint holds everything needed to continue: model args and weights, optimizer state, the step,
the recipe, RNG states and the data position. Since batches are a function of (seed, step), the data
position is just the step; it is stored anyway so a reader can see where the run was.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import torch

FORMAT = "babysit-trainer-checkpoint/1"
LATEST = "latest"


def _atomic(path: Path, write: Any) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def save(directory: Path, step: int, payload: dict[str, Any]) -> Path:
    """Write `step_{N:06d}.pt`, then point `latest` at it; a crash in between leaves the old pointer."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"step_{step:06d}.pt"
    _atomic(path, lambda tmp: torch.save({"format": FORMAT, "step": step, **payload}, tmp))
    _atomic(directory / LATEST, lambda tmp: Path(tmp).write_text(path.name + "\n"))
    return path


def load_latest(directory: Path) -> dict[str, Any] | None:
    """The checkpoint `latest` names, or None when there is none yet."""
    pointer = directory / LATEST
    if not pointer.exists():
        return None
    path = directory / pointer.read_text().strip()
    ckpt = torch.load(path, map_location="cpu", weights_only=False)
    if ckpt.get("format") != FORMAT:
        raise ValueError(f"{path}: checkpoint format {ckpt.get('format')!r}, this trainer reads {FORMAT!r}")
    return ckpt
