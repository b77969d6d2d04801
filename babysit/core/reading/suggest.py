"""A `[[source.patterns]]` regex that would read a printed line none matched: "here is what would".

Pure: the numbers of the line become named groups (named for the word before each), the text between
them is kept literally (escaped), and the step is the integer after `step`/`iter`/`it`/`batch`/`epoch`
(in that preference), else the line gets no suggestion: a line without a counter is not a record.
"""

from __future__ import annotations

import re
import shlex

NUMBER = re.compile(r"(?P<name>[A-Za-z_][\w/]*)?(?P<sep>[\s:=]*)"
                    r"(?P<num>[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?|nan|inf)",
                    re.IGNORECASE)
STEP_WORDS = ("global_step", "step", "iter", "iteration", "it", "update", "updates", "upd", "batch", "epoch")
_UNNAMED = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")


def suggest(line: str) -> str | None:
    """A regex reading `line` (step and metrics), or None when it shows no step counter."""
    found = []
    for m in NUMBER.finditer(line):
        name = (m.group("name") or "").lower().replace("/", "_")
        if not name or not name[0].isalpha():
            continue
        found.append((m, name))
    if not found:
        return None
    step_at = None
    for word in STEP_WORDS:
        for k, (m, name) in enumerate(found):
            if name == word and re.fullmatch(r"\d+", m.group("num")):
                step_at = k
                break
        if step_at is not None:
            break
    if step_at is None:
        return None
    parts, pos, used = [], found[0][0].start(), set()
    for k, (m, name) in enumerate(found):
        start = m.start("num")
        parts.append(_literal(line[pos:start]) if pos < start else "")
        group = "step" if k == step_at else _unique(name, used)
        parts.append(r"(?P<step>\d+)" if k == step_at else rf"(?P<{group}>[-+.\w]+)")
        used.add(group)
        pos = m.end("num")
    return "".join(parts)


def _literal(text: str) -> str:
    """The text between two named numbers as a regex: spaces loose, a number no word names (`/3` of
    `epoch 1/3`) any number, never the one printed on this line."""
    out, pos = [], 0
    for m in _UNNAMED.finditer(text):
        out.append(re.escape(text[pos:m.start()]).replace("\\ ", r"\s*"))
        out.append(r"[-+.\w]+")
        pos = m.end()
    out.append(re.escape(text[pos:]).replace("\\ ", r"\s*"))
    return "".join(out)


def _unique(name: str, used: set[str]) -> str:
    name = re.sub(r"\W", "_", name)
    if name in ("step", "ts"):
        name = f"{name}_value"
    out, n = name, 2
    while out in used:
        out, n = f"{name}_{n}", n + 1
    return out


def unread_answer(presets_tried: tuple[str, ...], sample: str | None, *, lines: int | None = None,
                  early: bool = False, spec_file: str | None = None, command: tuple[str, ...] | None = None) -> str:
    """What babysit says when no printed line has given a record: that nothing reads them, what was tried,
    a line none read, the pattern that would read it and where it goes. One wording for `babysit run`'s
    answer and the run's thread (`early`: the preamble may still be printing), the first poll's reading
    line and the `log-unreadable` incident; with `command`, it ends with the one that runs again with it."""
    count = f": {lines} line{'s' if lines != 1 else ''}, no record" if lines is not None else ""
    text = (f"nothing reads its printed lines yet{count} (no preset matched, of {', '.join(presets_tried)}; the "
            "general reader needs a step counter such as `step 10`, `iter 10/500` or `epoch 1 batch 20/100` beside "
            "`name value` metrics).")
    if early:
        text += " A preamble before the first metrics is normal: babysit says so when a record comes."
    if sample is None:
        return text + " Print a step and metrics (`step 10 loss 0.52`), or log with babysit.log(step, loss=…)."
    would = suggest(sample)
    text += f" A line: {sample[:200]!r}."
    if would is None:
        return (text + " It shows no step counter: print one beside the metrics (`step 10 loss 0.52`), "
                "or log with babysit.log(step, loss=…) (docs/your-trainer.md).")
    text += (f" A pattern that would read it: '{would}'. Put it in {spec_file or 'run.toml'} under [source] as "
             f"[[source.patterns]] regex = '{would}' (docs/your-trainer.md)")
    if command is None:
        return text + "."
    return text + ", or run again with: babysit run --pattern " + shlex.quote(would) + " -- " + shlex.join(command)
