"""run_exit.written_after: the newest checkpoint file written after a stop signal, a real checkpoint
preferred over a pointer file (`latest`), found in the folders trainers nest them in."""

from __future__ import annotations

import os
from pathlib import Path

from babysit.run.run_exit import written_after


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


def test_a_file_stamped_a_few_ms_before_the_signal_by_the_kernels_coarse_clock_counts(tmp_path: Path) -> None:
    """Linux stamps mtimes from its coarse clock (a jiffy behind time.time()): a save that follows the
    signal can carry an mtime a few ms before the recorded send; one a second before is an older save."""
    touch(tmp_path / "ckpt.pt", 4096, 1499.995)
    assert written_after(tmp_path, 1500.0) == ("ckpt.pt", 0.0)
    touch(tmp_path / "ckpt.pt", 4096, 1499.0)
    assert written_after(tmp_path, 1500.0) is None
