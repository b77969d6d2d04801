"""A pattern searches a whole read of printed lines at once (`patterns.Program`) and finds what a search a
line at a time finds: the same matches on the same lines, so the same records, problems and counts."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from babysit.core.spec.run_toml import load_spec
from babysit.core.spec.source import compile_regex
from babysit.sources import patterns, stdout
from babysit.sources.records import Item

# Patterns whose matches could differ between one line and many joined by newlines, if done carelessly:
# anchors, classes that hold a newline, empty matches, the text's very ends, any byte.
PATTERNS = [
    r"iter (?P<step>\d+): loss (?P<x>[-+.\w]+)",
    r"^(?P<step>\d+)", r"(?P<step>\d+)$", r"^(?P<step>\d+)$", r"(?m)^x(?P<step>\d+)",
    r"(?P<step>\d*)", r"\b(?P<step>\d*)\b", r"(?P<step>\d*)$", r"\B(?P<step>)",
    r"x(?P<step>[^,]+)", r"(?P<step>\d+)\s*", r"\s+(?P<step>\d+)", r"[\s\S](?P<step>\d)", r"(?P<step>\d)\W",
    r"(?s)a(?P<step>.+)", r"a(?P<step>.*)", r"(?P<step>.)", r"(?U)(?P<step>\d+)", r"(?i)ITER (?P<step>\d+)",
    r"\A(?P<step>\d+)", r"(?P<step>\d+)\z", r"(?P<step>\d)\C", r"(?-m:^)(?P<step>\d)", r"(?m-s:.)(?P<step>\d)$",
    r"(?P<step>\d+)|(?P<x>\s+)", r"\n(?P<step>\d)", r"(?P<step>\d)\x0b", r"(?P<step>[[:space:]]*\d)",
]
BITS = ["iter ", "12", "3", " ", "  ", "\t", "x", ",", "a", "é", "\u2588", ": ", "loss ", "1.5", "\x0b", "\x0c", "ITER ",
        "_", "-", "nan"]


def visible_lines(rng: random.Random, n: int) -> list[bytes]:
    lines = []
    while len(lines) < n:
        line = "".join(rng.choice(BITS) for _ in range(rng.randint(1, 9))).encode()
        if rng.random() < 0.05:
            line += b"\xff"  # not UTF-8
        if line.strip():
            lines.append(line.strip())
    return lines


def one_line_at_a_time(regex: str, line: bytes) -> list[tuple[tuple[int, int], tuple[bytes | None, ...]]]:
    """RE2's public search over the line alone: on from each match's end (a byte on after an empty one),
    never past a match that reached the line's end."""
    program = compile_regex(regex)
    found = []
    pos = 0
    while (match := program.search(line, pos)) is not None:
        found.append((match.span(), match.groups()))
        stop = match.end()
        if stop >= len(line):
            break
        pos = stop if stop > pos else pos + 1
    return found


@pytest.mark.parametrize("regex", PATTERNS)
def test_a_read_searched_whole_finds_what_a_search_a_line_at_a_time_finds(regex: str) -> None:
    lines = visible_lines(random.Random(regex), 600)
    text = b"\n".join(lines)
    starts = [0]
    for line in lines:
        starts.append(starts[-1] + len(line) + 1)
    whole: dict[int, list] = {}
    program = patterns.program(regex)
    groups = range(1, compile_regex(regex).groups + 1)
    for i, (start, stop), values in program.matches(lines, text, groups):
        at = 0 if program.by_line else starts[i]  # a line searched on its own: spans in it
        whole.setdefault(i, []).append(((start - at, stop - at), values))
    want = {i: got for i, line in enumerate(lines) if (got := one_line_at_a_time(regex, line))}
    assert whole == want
    assert program.by_line == any(s in regex for s in ("\\A", "\\z", "\\C", "(?-", "(?m-"))


RUN = '[run]\nname = "r"\ncommand = ["true"]\n'
SOURCE = """[source]
kind = "stdout"
step_offset = 100
metrics = { train_loss = "loss" }
[[source.patterns]]
regex = 'iter (?P<step>\\d+): loss (?P<train_loss>[-+.\\w]+), time (?P<ms>[\\d.]+)ms'
[[source.patterns]]
regex = 'step (?P<step>\\d+): train loss [-+.\\w]+, val loss (?P<val_loss>[-+.\\w]+)'
[[source.patterns]]
regex = '\\|\\s*(?P<step>\\d+)/(?P<total_steps>\\d+)\\s*\\['
forward_only = true
[[source.patterns]]
regex = '^epoch (?P<epoch>\\d+) batch (?P<batch>\\d+)/(?P<nbatches>\\d+)(?: loss (?P<eloss>\\S+))?$'
step = "(epoch - 1) * nbatches + batch"
"""


def printed(rng: random.Random, n: int) -> list[str]:
    lines = []
    for step in range(1, n + 1):
        kind = rng.random()
        if kind < 0.4:
            lines.append(f"iter {step}: loss {rng.random() * 4:.4f}, time {rng.random() * 50:.2f}ms, mfu 1.2%")
        elif kind < 0.45:
            lines.append(f"step {step}: train loss 2.5, val loss {rng.random():.4f}")
        elif kind < 0.5:  # two records on one line, the second pattern's first in the text
            lines.append(f"step {step}: train loss 2.5, val loss 1.5 iter {step}: loss 2.0, time 3.0ms "
                         f"iter {step + 1}: loss 1.0, time 4.0ms")
        elif kind < 0.6:  # a bar that resets (forward only), in colour, with non-ASCII
            lines.append(f"\x1b[32m {rng.randint(0, 99)}%|██▏ | {rng.randint(0, 300)}/300 [00:01<00:02]\x1b[0m")
        elif kind < 0.68:  # a computed step, going backwards now and then; the loss optional
            lines.append(f"  epoch {rng.randint(1, 3)} batch {rng.randint(1, 50)}/50"
                         + (f" loss {rng.choice(['0.5', 'nan', 'nan.0', 'abc'])}" if rng.random() < 0.5 else ""))
        elif kind < 0.72:
            lines.append(rng.choice(["   ", "", "\x1b[0m", "\t"]))
        elif kind < 0.76:  # blanks around a record
            lines.append(f" \t iter {step}: loss 0.5, time 1.0ms \t ")
        elif kind < 0.78:
            lines.append(f"iter {step}: loss abc, time 1.0ms")  # no number: a problem
        elif kind < 0.8:
            lines.append("iter x: loss 1, time 1ms")  # no step: no match
        else:
            lines.append(rng.choice([f"compiling the model … {rng.random()}", "warming up", " 3%|▏ | 9/300 [00:01"]))
    return lines


def test_a_read_gives_the_records_problems_and_counts_of_its_lines_read_one_at_a_time(tmp_path: Path) -> None:
    (tmp_path / "run.toml").write_text(RUN + SOURCE)
    source = load_spec(tmp_path / "run.toml").source
    rng = random.Random(42)
    lines = printed(rng, 6000)
    log = tmp_path / "sd" / "runs" / "r" / "attempt-1" / "stdout.log"
    log.parent.mkdir(parents=True)
    state: dict = {}
    items: list[Item] = []
    problems: set[str] = set()
    notices: list = []
    seen = 0
    at = 0
    while at < len(lines):  # written in bursts, read in small windows: reads end mid-burst
        burst = lines[at:at + rng.randint(1, 900)]
        at += len(burst)
        with open(log, "ab") as f:
            f.write(("\r\n" if rng.random() < 0.3 else "\n").join(burst).encode() + b"\n")
        while True:
            got = stdout.read(source, log.parent.parent, state, budget=rng.choice([512, 4096, 65536]))
            state, seen = got.state or {}, seen + got.lines
            items += got.items
            problems.update(got.problems)
            notices += got.notices
            if not got.more:
                break
    want: list[Item] = []
    want_problems: list[str] = []
    ctx = patterns.LineContext()
    ctx.track = True
    matchers = patterns.matchers(source)
    visible = [v for line in lines if (v := stdout.ANSI.sub(b"", line.encode()).strip())]
    for line in visible:
        patterns.parse_line(source, matchers, line, want, want_problems, ctx)
    assert [(it.step, repr(dict(it.metrics))) for it in items] == [(it.step, repr(dict(it.metrics))) for it in want]
    assert problems == set(want_problems) and len(problems) == 2  # `abc` as train_loss and as eloss: no number
    assert seen == len(visible) and notices == ctx.notices and len(notices) == 1  # a computed step went back
    assert len(want) > 4000 and any(it.metrics.get("eloss") != it.metrics.get("eloss") for it in want)  # a NaN


def test_the_line_to_quote_is_the_newest_unread_one_with_a_number(tmp_path: Path) -> None:
    (tmp_path / "run.toml").write_text(RUN + SOURCE)
    source = load_spec(tmp_path / "run.toml").source
    log = tmp_path / "sd" / "runs" / "r" / "attempt-1" / "stdout.log"
    log.parent.mkdir(parents=True)
    log.write_text("warming up\nshard 3 of 8 loaded\niter 1: loss 2.0, time 1ms\nready\niter 2: loss 1.0, time 1ms\n")
    got = stdout.read(source, log.parent.parent, {})
    assert got.sample == "shard 3 of 8 loaded" and [it.step for it in got.items] == [101, 102]
    with open(log, "a") as f:
        f.write("iter 3: loss 0.5, time 1ms\n")
    assert stdout.read(source, log.parent.parent, got.state or {}).sample is None  # every line read


def test_a_sources_matchers_are_made_once_and_never_those_of_another_source(tmp_path: Path) -> None:
    (tmp_path / "a.toml").write_text(RUN + '[source]\nkind = "stdout"\npreset = "auto"')
    (tmp_path / "b.toml").write_text(RUN + '[source]\nkind = "stdout"\npreset = "nanogpt"')
    one, other = load_spec(tmp_path / "a.toml").source, load_spec(tmp_path / "b.toml").source
    first = stdout._prepared(one, "nanogpt")
    assert all(a is b for a, b in zip(first[1], stdout._prepared(one, "nanogpt")[1], strict=True))  # not made again
    assert [m.key for m in stdout._prepared(other, None)[1]] == [m.key for m in patterns.matchers(other)]
    assert [name for name, _, _ in stdout._prepared(one, None)[2]] == [name for name, _ in one.candidates]
    assert stdout._prepared(one, "nanogpt")[2] == []  # nanoGPT's is the first preset tried: none ahead of it


def test_a_second_attempt_read_line_by_line_counts_its_epochs_on(tmp_path: Path) -> None:
    """Every read of a run with two attempts passes attempt-1's files first: only a newer attempt starts
    the counting afresh (before, each read did, so attempt 2's step fell back to its batch every epoch)."""
    (tmp_path / "run.toml").write_text(RUN + '[source]\nkind = "stdout"\npreset = "auto"\n')
    source = load_spec(tmp_path / "run.toml").source
    run = tmp_path / "sd" / "runs" / "r"
    (run / "attempt-1").mkdir(parents=True)
    (run / "attempt-1" / "stdout.log").write_text("epoch 1 batch 1/3 loss 9.0\n")
    (run / "attempt-2").mkdir()
    got = stdout.read(source, run, {})
    state, steps = got.state or {}, [it.step for it in got.items]
    for epoch in (1, 2, 3):
        for batch in (1, 2, 3):
            with open(run / "attempt-2" / "stdout.log", "a") as f:
                f.write(f"epoch {epoch} batch {batch}/3 loss {1 / (epoch * batch):.3f}\n")
            got = stdout.read(source, run, state)
            state, steps = got.state or {}, steps + [it.step for it in got.items]
    assert steps == [1, 1, 2, 3, 4, 5, 6, 7, 8, 9]
