"""Will the trainer write its log where babysit reads it (`[run].log`)? Best effort; `warnings` is pure.

A trainer that writes elsewhere is babysat blind: no step, no eval, no verdict, and after
`stall_minutes` a `stalled` stop. `babysit register` prints these as warnings, never refusals: a
trainer may find its log through `$BABYSIT_LOG`, which no command line shows.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from pathlib import Path

from babysit.core.spec.run_toml import RunSpec

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


def warnings(spec: RunSpec, argvs: Sequence[Sequence[str]], *, log_dir_exists: bool,
             writes_babysit_log: bool = False) -> list[str]:
    """What looks wrong about the log path; `argvs[k]` is attempt k+1's argv, placeholders expanded.
    `writes_babysit_log`: the trainer's script writes `$BABYSIT_LOG` (babysit's client or hooks): a log
    directory that does not exist yet is then no sign of a trainer that writes elsewhere."""
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
    if not named and not log_dir_exists and not writes_babysit_log:
        folder = log.parent
        mentioned = any(str(_shown(folder, spec)) in item or str(folder) in item for argv in argvs for item in argv)
        if not mentioned:
            out.append(f"run.log: its directory {_shown(folder, spec)} does not exist yet and the command names "
                       "neither it nor the log: babysit creates it at launch and passes the log's path as "
                       "$BABYSIT_LOG; make sure the trainer writes there (babysit.log() and the Hugging Face and "
                       "Lightning hooks do)")
    return out


# the trainer's script writes `$BABYSIT_LOG`: babysit's client (`babysit.log`), a hook, or the variable itself
_WRITES_BABYSIT_LOG = re.compile(r"\bimport babysit\b|\bfrom babysit\b|BABYSIT_LOG|BabysitCallback|BabysitLogger")
_SCRIPT_BYTES = 1 << 20


def writes_babysit_log(spec: RunSpec, argv: Sequence[str]) -> bool:
    """Does the command's script (a `.py` argument, or `-m module`, under the workdir) use babysit's client
    or hooks, or read `$BABYSIT_LOG`? Best effort: a script not found here says nothing (False)."""
    for path in _scripts(spec.workdir, argv):
        try:
            with open(path, encoding="utf-8", errors="replace") as f:
                if _WRITES_BABYSIT_LOG.search(f.read(_SCRIPT_BYTES)):
                    return True
        except OSError:
            continue
    return False


def _scripts(workdir: Path, argv: Sequence[str]) -> list[Path]:
    out = []
    for i, item in enumerate(argv):
        if item.endswith(".py"):
            out.append(Path(item) if os.path.isabs(item) else workdir / item)
        elif item == "-m" and i + 1 < len(argv):
            module = workdir.joinpath(*argv[i + 1].split("."))
            out += [module.with_suffix(".py"), module / "__main__.py", module / "__init__.py"]
    return [p for p in out if p.is_file()]


def _shown(path: Path, spec: RunSpec) -> str:
    """A path as the user wrote it: relative to the run's workdir when it lies under it."""
    try:
        return str(path.relative_to(spec.workdir))
    except ValueError:
        return str(path)
