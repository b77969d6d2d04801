"""Will the trainer write its log where babysit reads it (`[run].log`)? Best effort, pure.

A trainer that writes elsewhere is babysat blind: no step, no eval, no verdict, and after
`stall_minutes` a `stalled` stop. `babysit register` prints these as warnings, never refusals: a
trainer may find its log through `$BABYSIT_LOG`, which no command line shows.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from pathlib import Path

from babysit.core.spec import RunSpec

# --log, --log-path, --log_file, --train-log, …: the flags a trainer names its log with
LOG_FLAG = re.compile(r"--(?:train[-_])?log(?:[-_](?:path|file))?")


def log_args(argv: Sequence[str]) -> list[tuple[int, str, str]]:
    """(index, flag, value) for every log flag in argv, in both `--log X` and `--log=X` forms."""
    out = []
    for i, item in enumerate(argv):
        flag, eq, value = item.partition("=")
        if not LOG_FLAG.fullmatch(flag):
            continue
        if eq:
            out.append((i, flag, value))
        elif i + 1 < len(argv) and not argv[i + 1].startswith("--"):
            out.append((i, flag, argv[i + 1]))
    return out


def warnings(spec: RunSpec, argvs: Sequence[Sequence[str]], *, log_dir_exists: bool) -> list[str]:
    """What looks wrong about the log path; `argvs[k]` is attempt k+1's argv, placeholders expanded."""
    if spec.log is None:
        return []
    log = Path(os.path.normpath(spec.log))
    out: list[str] = []
    named = False
    for k, argv in enumerate(argvs, start=1):
        for i, flag, value in log_args(argv):
            written = Path(os.path.normpath(spec.workdir / value))
            if written == log:
                named = True
                continue
            who = "the command" if i < len(spec.command) else f"attempt {k}"  # argv = command + the attempt's args
            where = "" if _shown(written, spec) == value else f" ({_shown(written, spec)})"
            text = (f"run.log: babysit reads {_shown(log, spec)}, but {who} passes {flag} {value}{where}: "
                    "babysit would see no step and no eval, and stop the run as stalled; make them the same path")
            if text not in out:
                out.append(text)
    if not named and not log_dir_exists:
        folder = log.parent
        mentioned = any(str(_shown(folder, spec)) in item or str(folder) in item for argv in argvs for item in argv)
        if not mentioned:
            out.append(f"run.log: its directory {_shown(folder, spec)} does not exist yet and the command names "
                       "neither it nor the log: babysit passes the log's path as $BABYSIT_LOG; make sure the "
                       "trainer writes there and creates the directory")
    return out


def _shown(path: Path, spec: RunSpec) -> str:
    """A path as the user wrote it: relative to the run's workdir when it lies under it."""
    try:
        return str(path.relative_to(spec.workdir))
    except ValueError:
        return str(path)
