"""What `register` can tell from the command alone: does its program exist, and does it run as far as the
prereg reads?

A program that is not there (`pythn`) would register, launch, exit 127 and be classified `crashed`
with a stderr that names no field of run.toml; found at register it is a refusal naming
`run.command` and the closest programs on PATH. A `read_step` past the run's last step would leave
the verdict NO-READ forever; that is a warning only, because the end may come from a record the
trainer writes (`total_steps`) that the command does not show.
"""

from __future__ import annotations

import difflib
import os
import re
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path

from babysit.core.errors import SpecError
from babysit.core.snapshot import steps_from_argv
from babysit.core.spec.run_toml import RunSpec


def program_of(spec: RunSpec) -> str:
    """The command's first item with `{name}` expanded (`{attempt}` as attempt 1's)."""
    return spec.command[0].replace("{name}", spec.name).replace("{attempt}", "1")


def check_program(spec: RunSpec, shown: str, environ: Mapping[str, str] | None = None) -> str | None:
    """Raise SpecError (exit 2) naming `run.command` when its program cannot be run from the workdir;
    on Slurm (the program runs on a node whose PATH the daemon cannot see) return a warning instead."""
    env = dict(os.environ if environ is None else environ)
    env.update(spec.env)
    program = program_of(spec)
    problem, hint = _problem(program, spec.workdir, env.get("PATH", os.defpath))
    if problem is None:
        return None
    if spec.executor != "local":
        return f"run.command: {problem} here; make sure it exists on the {spec.executor} node"
    raise SpecError(shown, "run.command", "a program that exists (on PATH, or a path relative to run.workdir "
                    f"{spec.workdir})", f"<{program!r}: {problem}>", hint=hint)


def check_script(spec: RunSpec, shown: str) -> str | None:
    """Raise SpecError (exit 2) naming `run.command` when the script an interpreter or a launcher is given
    (`python trian.py`, `torchrun … train.py`) is not in the workdir: it would fail only at launch, exit
    2 and `crashed`. On Slurm (another node's filesystem, maybe) a warning instead."""
    script = script_of([a.replace("{name}", spec.name).replace("{attempt}", "1") for a in spec.command])
    if script is None:
        return None
    file = Path(script) if os.path.isabs(script) else spec.workdir / script
    if file.exists():
        return None
    problem = f"{file} does not exist"
    if spec.executor != "local":
        return f"run.command: {problem} here; make sure it exists on the {spec.executor} node"
    near = _near(Path(script).name, [p.name for p in file.parent.iterdir()] if file.parent.is_dir() else [])
    hint = ((f"did you mean {near}? " if near else "")
            + "fix the script's path in run.command (a path is relative to run.workdir)")
    raise SpecError(shown, "run.command", f"a script that exists (a path relative to run.workdir {spec.workdir})",
                    f"<{script!r}: {problem}>", hint=hint)


_PYTHON = re.compile(r"(python|pypy)[0-9.]*")
_SHELL = re.compile(r"bash|sh|dash|zsh")
_TAKES_VALUE = {"python": {"-W", "-X"}, "shell": {"-o", "-O"}}  # options whose value is the next item
_LAUNCHERS = ("torchrun", "deepspeed")


def script_of(argv: Sequence[str]) -> str | None:
    """The script file a command runs through its interpreter (`python -u train.py` → train.py) or launcher
    (`torchrun --nproc-per-node 2 train.py`, `accelerate launch train.py`); None for a module (`-m`), inline
    code (`-c`), or a program that is the trainer itself."""
    if not argv:
        return None
    program, args = Path(argv[0]).name, list(argv[1:])
    family = "python" if _PYTHON.fullmatch(program) else "shell" if _SHELL.fullmatch(program) else None
    if family is not None:
        i = 0
        while i < len(args):
            arg = args[i]
            if arg == "-" or arg.startswith(("-m", "-c")):
                return None
            if arg.startswith("-"):
                i += 2 if arg in _TAKES_VALUE[family] else 1
                continue
            return arg
        return None
    if program in _LAUNCHERS or (program == "accelerate" and args[:1] == ["launch"]):
        if any(a in ("-m", "--module", "--no-python", "--no_python") for a in args):
            return None
        return next((a for a in args if a.endswith(".py") and not a.startswith("-")), None)
    return None


def _problem(program: str, workdir: Path, path: str) -> tuple[str | None, str]:
    if os.sep in program or (os.altsep and os.altsep in program):
        file = Path(program) if os.path.isabs(program) else workdir / program
        if not file.exists():
            near = _near(program, [p.name for p in file.parent.iterdir()] if file.parent.is_dir() else [])
            return f"{file} does not exist", (f"did you mean {near}? " if near else "") + \
                "fix run.command's first item (a path is relative to run.workdir)"
        if file.is_dir() or not os.access(file, os.X_OK):
            return (f"{file} is not an executable file",
                    f"make it executable (chmod +x {file}) or run it through its interpreter "
                    f"(command = [\"python\", \"{program}\", …])")
        return None, ""
    if shutil.which(program, path=path) is not None:
        return None, ""
    near = _near(program, _programs_on(path))
    return ("not found on PATH", (f"did you mean {near}? " if near else "") +
            "fix run.command's first item, or set PATH in [run].env for the trainer")


def _programs_on(path: str) -> list[str]:
    names: set[str] = set()
    for folder in path.split(os.pathsep):
        try:
            names.update(e.name for e in os.scandir(folder or ".") if e.is_file() and os.access(e.path, os.X_OK))
        except OSError:
            continue
    return sorted(names)


def _near(program: str, names: Sequence[str]) -> str | None:
    close = difflib.get_close_matches(program, names, n=3, cutoff=0.7)
    return " or ".join(f"'{c}'" for c in close) or None


def read_step_warnings(spec: RunSpec, argvs: Sequence[Sequence[str]]) -> list[str]:
    """`[prereg].read_step` past the run's known end (`[run].total_steps`, else each attempt's `--steps`-style
    argument): the verdict would never be read. `argvs[k]` is attempt k+1's argv."""
    if spec.prereg is None:
        return []
    read = spec.prereg.read_step
    if spec.total_steps is not None:
        ends = [("run.total_steps", spec.total_steps)]
    else:
        ends = []
        for k, argv in enumerate(argvs, start=1):
            steps = steps_from_argv(argv)
            if steps is not None:
                ends.append(("the command" if len(argvs) == 1 else f"attempt {k}'s argv", steps))
    out = []
    for where, end in ends:
        if read > end:
            out.append(f"prereg.read_step: {read} is past the run's last step ({where} says {end}): the verdict "
                       f"would never be read (NO-READ); lower read_step or let the run go to step {read} or beyond")
    return out
