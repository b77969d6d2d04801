"""stopcheck.written_after: the newest checkpoint file written after a stop signal, a real checkpoint
preferred over a pointer file (`latest`), found in the folders trainers nest them in."""

from __future__ import annotations

import os
from pathlib import Path

from babysit.stopcheck import written_after


def touch(path: Path, size: int, mtime: float) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"x" * size)
    os.utime(path, (mtime, mtime))


def test_the_newest_checkpoint_after_the_signal_a_pointer_only_when_nothing_larger(tmp_path: Path) -> None:
    touch(tmp_path / "step_000100.pt", 4096, 1000.0)  # before the stop: not this stop's
    assert written_after(tmp_path, 1500.0) is None
    touch(tmp_path / "latest", 15, 1600.0)
    assert written_after(tmp_path, 1500.0) == ("latest", 100.0), "a pointer, when it is all there is"
    touch(tmp_path / "checkpoint-500" / "model.safetensors", 4096, 1550.0)  # HF nests a folder a save
    assert written_after(tmp_path, 1500.0) == (os.path.join("checkpoint-500", "model.safetensors"), 50.0)
    assert written_after(tmp_path / "absent", 0.0) is None
