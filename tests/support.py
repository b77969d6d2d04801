"""What the suites share to set up and watch a run: a run.toml built from the few things a test varies,
`babysit register` of it, and one way to wait for a condition.

`run_toml` writes exactly what it is given (no hidden guard or poll), through tomli_w, so a test reads its
spec in one call and the text is valid TOML whatever the command or the regex holds. Tests that are about
the exact TOML text (the spec validator's) keep it written out."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import tomli_w

from babysit.core.spec.tomlfile import tomllib  # the TOML parser (tomli below Python 3.11)

TRAIN_LOG = "outputs/{name}/train_log.jsonl"  # the reference trainer's log; babysit fills in {name}
SHOWN_CHARS = 1500  # how much of the last value a timed-out wait shows (its end: where a log or a screen grew)


def wait_for(what: str, check: Callable[[], Any], timeout: float = 60.0, every: float = 0.1) -> Any:
    """`check()`'s first truthy answer, asked every `every` s; after `timeout` s an AssertionError naming
    `what` and the last answer seen, so a failure says how far the thing awaited got."""
    deadline = time.monotonic() + timeout
    while True:
        seen = check()
        if seen:
            return seen
        if time.monotonic() >= deadline:
            break
        time.sleep(every)
    shown = repr(seen)
    if len(shown) > SHOWN_CHARS:
        shown = "…" + shown[-SHOWN_CHARS:]
    raise AssertionError(f"timed out after {timeout:g}s waiting for {what}; last seen: {shown}")


def stdout_source(*regexes: str, **keys: Any) -> dict[str, Any]:
    """A `[source]` reading the trainer's printed lines through these patterns (and any other source keys)."""
    return {"kind": "stdout", **keys, "patterns": [{"regex": r} for r in regexes]}


def run_toml(name: str, command: Sequence[str], *, log: str | None = None, gpus: Sequence[int] | None = None,
             env: Mapping[str, str] | None = None, run: Mapping[str, Any] | None = None,
             source: Mapping[str, Any] | None = None, guards: Mapping[str, Any] | None = None,
             poll: tuple[float, float] | None = None, retry: Mapping[str, Any] | None = None,
             attempts: Mapping[str, Sequence[str]] | None = None, prereg: Mapping[str, Any] | None = None,
             tables: Mapping[str, Any] | None = None) -> str:
    """A run.toml's text: `[run]` (name, command, then `log`, `gpus`, `env` and the other `run` keys when
    given), `[source]`, `[guards]`, `[poll]` as (first_after_minutes, every_minutes), `[retry]`,
    `[[attempts]]` as profile -> args, `[prereg]` (the verdict rule), then any other `tables`."""
    head: dict[str, Any] = {"name": name, "command": list(command)}
    if log is not None:
        head["log"] = log
    if gpus is not None:
        head["gpus"] = list(gpus)
    if env is not None:
        head["env"] = dict(env)
    spec: dict[str, Any] = {"run": {**head, **(run or {})}}
    if source is not None:
        spec["source"] = dict(source)
    if guards is not None:
        spec["guards"] = dict(guards)
    if poll is not None:
        spec["poll"] = {"first_after_minutes": poll[0], "every_minutes": poll[1]}
    if retry is not None:
        spec["retry"] = dict(retry)
    if attempts:
        spec["attempts"] = [{"profile": p, "args": list(args)} for p, args in attempts.items()]
    if prereg is not None:
        spec["prereg"] = dict(prereg)
    return tomli_w.dumps({**spec, **(tables or {})})


def register(root: Path, spec: Path | str, *, env: Mapping[str, str] | None = None,
             accelerated: bool = True) -> Path:
    """`babysit register` of `spec` (a file, or a run.toml's text written to `root/NAME.toml`) into
    `root/babysit.toml`, as a user runs it: a real CLI process in `root`. Returns the spec's path."""
    if isinstance(spec, str):
        text = spec
        spec = root / f"{tomllib.loads(text)['run']['name']}.toml"
        spec.write_text(text)
    args = [sys.executable, "-m", "babysit", "register", str(spec), "--registry", str(root / "babysit.toml")]
    if accelerated:
        args.append("--accelerated")
    done = subprocess.run(args, cwd=root, env={**os.environ, **(env or {})}, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, f"babysit register {spec.name} failed:\n{done.stdout}\n{done.stderr}"
    return spec
