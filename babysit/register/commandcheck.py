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
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path

from babysit.core.errors import SpecError
from babysit.core.snapshot import steps_from_argv
from babysit.core.spec import RunSpec


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
