"""The one way babysit replaces a file: a temp file beside it, fsync, rename over, fsync the folder.

A reader (or a daemon restarted after a SIGKILL at any instant) sees the old file or the new one,
never a torn one. Used for the registry, the shim's start and exit records, verdict JSON, the frozen
prereg copies, Slurm's state files and a campaign's proposals.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any


def temp_prefix(path: Path) -> str:
    """The prefix of `path`'s temp files (`.NAME.`), so a later writer can sweep a killed writer's."""
    return f".{path.name}."


def write_atomic(path: Path, data: bytes | str, *, mode: int = 0o600,
                 before_replace: Callable[[Path], None] | None = None) -> Path:
    """Replace `path` with `data` (str is UTF-8); the file gets `mode` whatever the umask.

    `before_replace(tmp)` runs after the temp file is durable and before the rename: the registry's
    crash point and its tests hook in there."""
    payload = data.encode("utf-8") if isinstance(data, str) else data
    fd, tmp_name = tempfile.mkstemp(prefix=temp_prefix(path), suffix=".tmp", dir=path.parent)
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(payload)
            f.flush()
            os.fchmod(f.fileno(), mode)
            os.fsync(f.fileno())
        if before_replace is not None:
            before_replace(tmp)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
    return path


def write_json_atomic(path: Path, data: Any, *, indent: int | None = None, mode: int = 0o600) -> Path:
    """`data` as JSON (a trailing newline when indented, for people and `cat`)."""
    text = json.dumps(data, indent=indent) + ("\n" if indent is not None else "")
    return write_atomic(path, text, mode=mode)


def write_private_json(path: Path, body: dict[str, Any]) -> None:
    """`write_json_atomic`, 0600 in a 0700 folder made as needed under the state directory: the state
    records who ran what."""
    path.parent.parent.mkdir(parents=True, exist_ok=True, mode=0o700)  # the state directory
    path.parent.mkdir(exist_ok=True, mode=0o700)
    write_json_atomic(path, body)
