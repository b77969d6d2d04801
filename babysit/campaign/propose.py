"""The next run, written as a run.toml derived from this one: one factor changed, nothing launched.

`derive` is pure (a TOML table in, a TOML table out): the run's name, parent and suspect set, the
command's one flag set or dropped, the [prereg] kept (the same instrument reads the next run, so its
verdict is comparable), the grid left out (its next steps are declared before launch, by a person).
An extension is the same derivation with `--steps` and the read step moved.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from babysit.core.campaign.delta import BARE

HEADER = """# Proposed by babysit after {run}'s FINAL verdict {label} ({why}).
# Nothing launches without an owner's click (launch / extend / hold) or `babysit register` of this file.
# Review it first: [prereg] is {run}'s, unchanged (the same instrument); declare [campaign.grid] for its labels.
"""


def derive(table: Mapping[str, Any], *, name: str, parent: str, suspect: str | None, campaign_file: Path,
           at: Path, set_flags: Mapping[str, str], drop: Sequence[str] = (),
           read_step: int | None = None) -> dict[str, Any]:
    """The run.toml table of the proposal, to be written at `at` (see `rebase_paths` for its other paths)."""
    out = copy.deepcopy(dict(table))
    run = out.setdefault("run", {})
    run["name"] = name
    run["command"] = edit_argv(list(run.get("command", [])), set_flags, drop)
    link = dict(out.get("campaign") or {})
    link.pop("grid", None)
    link.pop("multi_delta", None)
    link.update({"file": _relative(campaign_file, at.parent), "parent": parent})
    if suspect:
        link["suspect"] = suspect
    out["campaign"] = link
    prereg = out.get("prereg")
    if isinstance(prereg, dict) and read_step is not None:
        prereg["read_step"] = read_step
    return out


def edit_argv(argv: list[str], set_flags: Mapping[str, str], drop: Sequence[str]) -> list[str]:
    """Set each flag's value (appended when absent; "" or "(set)": a bare flag) and drop flags with their value."""
    out = list(argv)
    for flag in drop:
        out = _without(out, flag)
    for flag, value in set_flags.items():
        bare = value in ("", BARE)
        i = _find(out, flag)
        if i is None:
            out += [flag] if bare else [flag, value]
        elif out[i].startswith(flag + "="):
            out[i] = flag if bare else f"{flag}={value}"
        elif i + 1 < len(out) and not out[i + 1].startswith("-"):
            if bare:
                del out[i + 1]
            else:
                out[i + 1] = value
        elif not bare:
            out.insert(i + 1, value)
    return out


def rebase_paths(table: dict[str, Any], spec_dir: Path, at_dir: Path) -> None:
    """Relative paths in [run].workdir and [prereg.fixture].log were relative to the run.toml's folder;
    rewrite them for the proposal's folder (in place)."""
    run = table.get("run") or {}
    run["workdir"] = _relative(spec_dir / str(run.get("workdir", ".")), at_dir)
    fixture = (table.get("prereg") or {}).get("fixture")
    if isinstance(fixture, dict) and isinstance(fixture.get("log"), str):
        fixture["log"] = _relative(spec_dir / fixture["log"], at_dir)


def _find(argv: list[str], flag: str) -> int | None:
    hits = [i for i, a in enumerate(argv) if a == flag or a.startswith(flag + "=")]
    return hits[-1] if hits else None


def _without(argv: list[str], flag: str) -> list[str]:
    out: list[str] = []
    skip = False
    for i, word in enumerate(argv):
        if skip:
            skip = False
            continue
        if word.startswith(flag + "="):
            continue
        if word == flag:
            skip = i + 1 < len(argv) and not argv[i + 1].startswith("-")
            continue
        out.append(word)
    return out


def _relative(path: Path, base: Path) -> str:
    return Path(os.path.relpath(Path(path).resolve(), Path(base).resolve())).as_posix()
