"""`[source]` of run.toml → a frozen SourceSpec: where a run's records come from.

Parsed here rather than in spec.py so that a source's rules (which keys each kind takes, what a
pattern must capture) live beside the adapters that rely on them; spec.py calls `parse_source`.
Every rejection names the key and what was expected, as spec.py's do, and no key is ignored.

A pattern is user input matched against every line a trainer prints, so it is compiled with RE2
(google-re2), whose matching time is linear in the line whatever the pattern: `(a|aa)+$` against
`aaaa…b` costs that run microseconds, where Python's `re` backtracks for minutes and blinds the daemon.
RE2 refuses what it cannot run in linear time (backreferences, lookaround); `register` says so.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from types import MappingProxyType
from typing import Any

import re2

from babysit.core.errors import SpecError
from babysit.core.reading import presets
from babysit.core.spec import expr, source_kinds
from babysit.core.spec.tomlfile import Table

KINDS = source_kinds.KINDS  # the registry of kinds: name -> KindRules (core/spec/source_kinds.py)
MLFLOW_STORE = source_kinds.MLFLOW_STORE
WANDB_DIR = source_kinds.WANDB_DIR
RESERVED = ("step", "ts")  # babysit's own keys in a record: no metric may be named so
STEP_GROUP = "step"
LATEST = "latest_"  # held_step's name for a group's latest value when the reading has caught up
# What RE2 cannot run that Python's `re` can, with the rewrite that works (the refusal says it).
UNSUPPORTED = (("(?=", "lookahead (?=…)"), ("(?!", "negative lookahead (?!…)"), ("(?<=", "lookbehind (?<=…)"),
               ("(?<!", "negative lookbehind (?<!…)"), ("(?P=", "a backreference (?P=name)"),
               ("(?>", "an atomic group (?>…)"), ("\\Z", "\\Z (write \\z or $)"))


def compile_regex(regex: str) -> Any:
    """A user's pattern compiled by RE2 (`re2.compile`'s object; raises re2.error); errors are not logged
    to stderr by RE2 itself: the caller says them, naming the key."""
    options = re2.Options()
    options.log_errors = False
    return re2.compile(regex, options)


def regex_error(regex: str) -> str | None:
    """Why RE2 refuses `regex` (what it cannot run, in words), or None when it compiles."""
    try:
        compile_regex(regex)
    except re2.error as exc:
        reason = exc.args[0].decode("utf-8", "replace") if exc.args and isinstance(exc.args[0], bytes) \
            else str(exc)
        found = [what for token, what in UNSUPPORTED if token in regex]
        if not found and _backreference(regex):
            found = ["a backreference (\\1 … \\9)"]
        if found:
            return f"{', '.join(found)} is not supported by the linear-time engine (RE2: {reason})"
        return f"RE2: {reason}"
    return None


def _backreference(regex: str) -> bool:
    """Whether `regex` holds an unescaped `\\1`…`\\9`."""
    i = 0
    while i < len(regex) - 1:
        if regex[i] == "\\":
            if regex[i + 1].isdigit() and regex[i + 1] != "0":
                return True
            i += 2
            continue
        i += 1
    return False
AUTO = presets.AUTO  # `preset = "auto"`: the preset is chosen from the run's first printed lines


@dataclass(frozen=True)
class SourcePattern:
    """One `[[source.patterns]]`: a regex whose named group `step` is the step, every other named
    group a metric of that name; or, with `step` (an expression), a regex whose step is computed from
    the line's groups and the latest values earlier lines captured (docs/spec.md, computed steps)."""

    regex: str
    step: expr.Expr | None = None
    forward_only: bool = False  # a match whose step is below this pattern's last is no record (a bar's reset)
    held_step: expr.Expr | None = None  # a match `step` cannot place yet (its stream read ahead): placed so later

    @cached_property
    def compiled(self) -> Any:
        return compile_regex(self.regex)

    @cached_property
    def metric_groups(self) -> tuple[str, ...]:
        index = self.compiled.groupindex  # RE2 lists it by name: the pattern's order is by index
        return tuple(sorted((g for g in index if g != STEP_GROUP), key=index.__getitem__))

    @property
    def groups(self) -> tuple[str, ...]:
        return tuple(self.compiled.groupindex)


@dataclass(frozen=True)
class SourceSpec:
    """Where records come from. `path`: the JSONL log (jsonl), the event directory (tensorboard), the
    CSV file (csv); None for stdout, which reads the run's captured stdout and stderr."""

    kind: str = "jsonl"
    path: Path | None = None
    patterns: tuple[SourcePattern, ...] = ()
    metrics: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))  # tag/column -> name
    step_offset: int = 0
    step_column: str = "step"  # csv
    preset: str | None = None  # stdout: the preset whose patterns come first ("auto": chosen at run time)
    candidates: tuple[tuple[str, tuple[SourcePattern, ...]], ...] = ()  # preset = "auto": every preset, in order
    detect: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))  # preset -> its `detect` regex

    @property
    def copies(self) -> bool:
        """Whether babysit writes a record log of its own (every kind but jsonl, which is read as is)."""
        return source_kinds.rules(self.kind).copies

    def rename(self, name: str) -> str:
        return self.metrics.get(name, name)

    def fingerprint(self) -> str:
        """What the records were read with: a changed source means the record log is rebuilt."""
        body = {"kind": self.kind, "path": str(self.path) if self.path else None,
                "patterns": [[p.regex, p.step.source if p.step else None, p.forward_only]
                             + ([p.held_step.source] if p.held_step else []) for p in self.patterns],
                "preset": self.preset, "metrics": dict(self.metrics),
                "step_offset": self.step_offset, "step_column": self.step_column}
        return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:16]


def needs_run_log(raw: object) -> bool:
    """Whether `[run].log` is required: for the jsonl kind unless `[source].path` names the log.
    A malformed `[source]` says yes here and is refused by `parse_source` with its own message."""
    if not isinstance(raw, dict):
        return True
    rules = KINDS.get(raw.get("kind", "jsonl"))  # type: ignore[call-overload]
    return rules is not None and rules.path == "log" and "path" not in raw


def parse_source(t: Table | None, *, workdir: Path, name: str, log: Path | None) -> SourceSpec:
    """The `[source]` table (None: absent) → SourceSpec; `log` is `[run].log` resolved, if written.

    For jsonl, `path` defaults to `[run].log` and must be the same file when both are written: one
    log is read, and it is the one the trainer is told (`$BABYSIT_LOG`).
    """
    if t is None:
        return SourceSpec(kind="jsonl", path=log)
    kind = t.choice("kind", tuple(KINDS), "jsonl")
    rules = KINDS[kind]
    path = None
    if t.has("path") or rules.path == "required":
        path = workdir / _expand(t.str("path", check=bool, expected=rules.expected), name, t)
    elif rules.path == "default" and rules.default_path is not None:
        path = workdir / rules.default_path.format(name=name)
    patterns = tuple(_pattern(p) for p in t.tables("patterns"))
    preset = t.str("preset", None, check=bool, expected="a preset name (" + ", ".join(presets.names()) + ', or "auto")')
    metrics = t.str_map("metrics", {})
    step_offset = t.int("step_offset", 0)
    step_column = t.str("step_column", "step", check=bool, expected="the name of the CSV's step column")
    t.finish()  # a misspelt key is named before what it leaves missing

    if rules.path == "none" and path is not None:
        raise SpecError(t.file, t.key("path"), f'no path for kind = "{kind}"', str(t.data["path"]),
                        hint=f"{kind} reads the run's captured stdout and stderr; drop source.path")
    if rules.path == "log":
        if path is not None and log is not None and os.path.normpath(path) != os.path.normpath(log):
            raise SpecError(t.file, t.key("path"), f"the same file as run.log ({log})", str(t.data["path"]),
                            hint=f'for kind = "{kind}" the trainer\'s log is the record log: write one of the two')
        path = path or log
    if preset is not None and not rules.patterns:
        raise t.error("preset", f'no preset for kind = "{kind}" (presets read printed lines: kind = "stdout")', preset)
    candidates: tuple[tuple[str, tuple[SourcePattern, ...]], ...] = ()
    detect: dict[str, str] = {}
    if preset == AUTO:
        candidates = tuple((n, preset_patterns(n, t)) for n in presets.auto_names())
        detect = {n: presets.load(n)["detect"] for n in presets.auto_names() if "detect" in presets.load(n)}
    elif preset is not None:
        if preset not in presets.names():
            raise t.error("preset", "one of " + ", ".join(f'"{n}"' for n in presets.names()) + ' or "auto"', preset)
        base = preset_patterns(preset, t)
        _check_steps(patterns, t, also=base)
        patterns = base + patterns  # the user's own patterns are read too, after the preset's
    if rules.patterns and not patterns and preset is None:
        raise t.error("patterns", f'at least one [[source.patterns]] table, or a preset, for kind = "{kind}"',
                      "<none>", )
    if not rules.patterns and patterns:
        raise t.error("patterns", f'no patterns for kind = "{kind}" (they apply to kind = "stdout")',
                      "<a list of tables>")
    for source_name, metric in metrics.items():
        if not metric or metric in RESERVED:
            raise SpecError(t.file, f"{t.key('metrics')}.{source_name}",
                            "a metric name other than " + " and ".join(f'"{r}"' for r in RESERVED), metric)
    if not rules.renames and (metrics or step_offset):
        key = "metrics" if metrics else "step_offset"
        raise t.error(key, f'nothing for kind = "{kind}" (babysit reads that log as written)',
                      "<a table>" if metrics else step_offset)
    if t.has("step_column") and not rules.step_column:
        raise t.error("step_column", f'nothing for kind = "{kind}" (it names a CSV column)', step_column)
    if preset is None:
        _check_steps(patterns, t)
    return SourceSpec(kind=kind, path=path, patterns=patterns, metrics=MappingProxyType(metrics),
                      step_offset=step_offset, step_column=step_column, preset=preset, candidates=candidates,
                      detect=MappingProxyType(detect))


def preset_patterns(name: str, where: Table | None = None) -> tuple[SourcePattern, ...]:
    """A preset's [[patterns]], validated by the rules of [[source.patterns]] (a broken preset file is a
    bug of babysit's: its error names the file)."""
    table = Table(presets.load(name), presets.display(name))
    patterns = tuple(_pattern(p) for p in table.tables("patterns"))
    table.str("description", None)
    table.str("origin", None)
    table.str("detect", None)
    table.finish()
    _check_steps(patterns, table)
    return patterns


def _pattern(t: Table) -> SourcePattern:
    regex = t.str("regex", check=bool, expected="a non-empty regular expression")
    step_text = t.str("step", None, check=bool, expected="an arithmetic expression over the pattern's groups")
    forward_only = t.bool("forward_only", False)
    held_text = t.str("held_step", None, check=bool, expected="an arithmetic expression over the line's groups "
                      "and latest_NAME values")
    problem = regex_error(regex)
    if problem is not None:
        raise SpecError(t.file, t.key("regex"), "a valid regular expression in RE2's syntax (docs/your-trainer.md, "
                        f'"Which regex syntax"): {problem}', regex,
                        hint="rewrite it without that construct: a pattern is matched in linear time, so "
                             "one run's pattern can never stall the daemon")
    compiled = compile_regex(regex)
    step = None
    if step_text is not None:
        try:
            step = expr.parse(step_text)
        except expr.ExprError as exc:
            raise t.error("step", f"arithmetic over named groups: numbers, names, + - * / and parentheses ({exc})",
                          step_text)
        if STEP_GROUP in compiled.groupindex:
            raise t.error("step", "either a (?P<step>…) group in the regex or a step expression, not both",
                          step_text)
    elif STEP_GROUP not in compiled.groupindex:
        raise t.error("regex", "a regular expression with a named group (?P<step>…) for the step, or a "
                               'step = "EXPR" computing it from the groups', regex)
    if "ts" in compiled.groupindex:
        raise t.error("regex", 'no group named "ts" (babysit stamps the read time)', regex)
    held = None
    if held_text is not None:
        if step is None:
            raise t.error("held_step", 'a step = "EXPR" beside it (held_step places what that expression cannot '
                          "place yet)", held_text)
        try:
            held = expr.parse(held_text)
        except expr.ExprError as exc:
            raise t.error("held_step", "arithmetic over the line's groups and latest_NAME values: numbers, names, "
                          f"+ - * / and parentheses ({exc})", held_text)
    t.finish()
    return SourcePattern(regex, step, forward_only, held)


def _check_steps(patterns: tuple[SourcePattern, ...], t: Table, also: tuple[SourcePattern, ...] = ()) -> None:
    """Every name a step expression uses is a group of its own pattern or of another (whose latest value
    an earlier line captured): a misspelt name is refused here, not at the first line."""
    known = {g for p in patterns + also for g in p.groups}
    for i, p in enumerate(patterns):
        if p.step is None:
            continue
        missing = sorted(p.step.names - known)
        if missing:
            raise SpecError(t.file, f"{t.key('patterns')}[{i}].step",
                            "names that are named groups of the patterns (" + ", ".join(sorted(known)) + ")",
                            p.step.source, hint=f"no pattern has a group named {missing[0]!r}: add "
                                                f"(?P<{missing[0]}>\\d+) to the regex that prints it")
        late = known | {f"{LATEST}{g}" for g in known}
        if p.held_step is not None and (missing := sorted(p.held_step.names - late)):
            raise SpecError(t.file, f"{t.key('patterns')}[{i}].held_step",
                            "names that are named groups of the patterns, or latest_ before one",
                            p.held_step.source, hint=f"no pattern has a group named "
                                                     f"{missing[0].removeprefix(LATEST)!r}")


def _expand(value: str, name: str, t: Table) -> str:
    try:
        return value.format(name=name)
    except (KeyError, IndexError, ValueError):
        raise t.error("path", "a path whose only placeholder is {name}", value)


def describe(source: SourceSpec) -> dict[str, Any]:
    """The source as shown to users (incidents, `prereg show`): kind, path, patterns."""
    out: dict[str, Any] = {"kind": source.kind}
    if source.path is not None:
        out["path"] = str(source.path)
    if source.preset:
        out["preset"] = source.preset
    if source.patterns:
        out["patterns"] = [p.regex for p in source.patterns]
    return out


def preset_line(name: str) -> str:
    """What `auto` (or `preset = NAME`) reads, said once in the run's thread, status and `babysit run`."""
    if name == presets.GENERAL:
        return ("no preset matched its printed lines: the general reader reads them (a step counter such as "
                "`step 10`, `iter 10/500` or `epoch 1 batch 20/100`, and `name value` metrics; docs/your-trainer.md)")
    table = presets.load(name)
    metrics = sorted({g for p in preset_patterns(name) for g in p.metric_groups})
    return (f'its printed lines match preset "{name}" ({table.get("description", name)}): reading '
            + ", ".join(metrics) + f' (write [source] kind = "stdout", preset = "{name}" to keep it)')
