"""`babysit run -- CMD`: the run.toml of an ad-hoc run, and how its end is said as an exit code. Pure.

The spec written is an ordinary run.toml, meant to be read and edited (add a `[prereg]`, then
`babysit register` it): every default babysit run chose is written out with the reason beside it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from babysit.core.spec.run_toml import FAILURE_CLASSES, RUN_NAME
from babysit.core.status import Outcome

# How `babysit run` ends (docs/your-trainer.md, "babysit run"): the run's outcome, as a shell sees it.
EXIT_COMPLETED = 0
EXIT_FAILED = 1  # crashed, oom, gpu-fault, a launch refused
EXIT_BAD_INPUT = 2  # babysit's own: a bad command line or spec (nothing launched)
EXIT_DIVERGED = 3
EXIT_STALLED = 4
EXIT_STOPPED = 5  # stopped before it ended: Ctrl-C, `babysit abort`, a guard (GPU held, GPU-hours cap)
EXIT_DETACHED = 6  # the second Ctrl-C with a `babysit up` babysitting it: left to that daemon, still running
EXIT_CODES = {Outcome.COMPLETED: EXIT_COMPLETED, Outcome.DIVERGED: EXIT_DIVERGED, Outcome.STALLED: EXIT_STALLED,
              Outcome.STOPPED: EXIT_STOPPED}


def exit_code(outcome: str | None) -> int:
    """The exit code for the run's last attempt's outcome (after any retries)."""
    return EXIT_CODES.get(outcome or "", EXIT_FAILED)


@dataclass(frozen=True)
class AdHoc:
    name: str
    command: tuple[str, ...]
    workdir: str  # where the command was typed (absolute: the run.toml lives under the state directory)
    gpus: tuple[int, ...] = ()
    retry_on: tuple[str, ...] = ()
    executor: str = "local"
    written_at: str = ""
    patterns: tuple[str, ...] = ()  # `babysit run --pattern REGEX`: read before the presets


def spec_path(state_dir: Path, name: str) -> Path:
    """Where an ad-hoc run's run.toml is kept: under the state directory, listed by `babysit status`."""
    return Path(state_dir) / "adhoc" / f"{name}.toml"


def run_name(command: Sequence[str], stamp: str) -> str:
    """A name from the script the command runs (`python train.py` → train) and a timestamp, so two
    `babysit run`s of one script are two runs."""
    words = [w for w in command if not w.startswith("-")]
    script = next((w for w in words[1:] if re.search(r"\.py$|/", w)), None) or \
        (words[2] if len(words) > 2 and words[1] == "-m" else None) or (words[0] if words else "run")
    base = re.sub(r"[^a-z0-9_.-]+", "_", script.rsplit("/", 1)[-1].removesuffix(".py").lower()).strip("_.") or "run"
    if len(command) > 2 and command[1] == "-m":
        base = re.sub(r"[^a-z0-9_.-]+", "_", command[2].rsplit(".", 1)[-1].lower()) or base
    name = f"{base[:40]}-{stamp}"
    assert RUN_NAME.fullmatch(name), name
    return name


def parse_gpus(text: str | None) -> tuple[int, ...]:
    """`--gpus 0,1` → (0, 1); ValueError naming what was expected."""
    if not text:
        return ()
    try:
        gpus = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise ValueError(f"expected GPU indices such as 0 or 0,1, got {text!r}") from None
    if any(g < 0 for g in gpus) or len(set(gpus)) != len(gpus):
        raise ValueError(f"expected distinct non-negative GPU indices, got {text!r}")
    return gpus


def parse_retry_on(text: str | None) -> tuple[str, ...]:
    if not text:
        return ()
    classes = tuple(c.strip() for c in text.split(",") if c.strip())
    bad = [c for c in classes if c not in FAILURE_CLASSES]
    if bad:
        raise ValueError(f"expected failure classes from {', '.join(FAILURE_CLASSES)}, got {bad[0]!r}")
    return classes


def run_toml(run: AdHoc) -> str:
    """The run.toml text: the defaults `babysit run` chose, each said, ready to edit and register."""
    q = json.dumps  # a TOML basic string is a JSON string
    command = ", ".join(q(a) for a in run.command)
    gpus = ", ".join(str(g) for g in run.gpus)
    lines = [
        f"# Written by `babysit run` {run.written_at}. Edit it (add a [prereg] for a verdict: docs/verdicts.md),",
        "# then `babysit register` it (a `babysit up` babysits it from then on). Reference: docs/spec.md.",
        "[run]",
        f"name = {q(run.name)}",
        f"workdir = {q(run.workdir)}          # where the command was typed",
        f"command = [{command}]",
        f"gpus = [{gpus}]" + ("" if run.gpus else "                # a CPU run: no GPU guards"),
    ]
    if run.executor != "local":
        lines.append(f"executor = {q(run.executor)}       # docs/slurm.md; add a [slurm] table for its options")
    lines += [
        "",
        "[source]                 # its printed lines: the first preset that matches them, else the general",
        'kind = "stdout"          # reader (docs/your-trainer.md); babysit.log(step, …) records are read too',
        'preset = "auto"',
    ]
    for regex in run.patterns:
        lines += ["[[source.patterns]]      # babysit run --pattern: read before the presets",
                  f"regex = {q(regex)}"]
    lines += [
        "",
        "[guards]",
        "stall_minutes = 20       # no new record and no new output byte this long: stack dump, graceful stop",
        "min_free_host_ram_gib = 1.0",
    ]
    if run.gpus:
        lines.append("exclusive_gpu = true     # refuse to launch, and stop it, if another process holds its GPUs")
    lines += ["", "[retry]"]
    if run.retry_on:
        lines.append(f"on = [{', '.join(q(c) for c in run.retry_on)}]")
        lines.append("max_attempts = 3")
    else:
        lines.append("max_attempts = 1         # no retries: `babysit run --retry-on oom,diverged` for them")
        lines.append("on = []")
    return "\n".join(lines) + "\n"
