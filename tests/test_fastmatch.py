"""A read matched whole (`sources.fastmatch`'s `re` twins, columns written in one format) gives the very
records, bytes, counts and samples of the line-at-a-time RE2 loop — and a pattern `re` could backtrack
on, or read otherwise than RE2, gets no twin (issue 31: 200,000 lines per CPU-second)."""

from __future__ import annotations

import random
import re
from pathlib import Path

import pytest
import re2

from babysit.core.presets import names
from babysit.core.source_spec import preset_patterns
from babysit.core.spec import load_spec
from babysit.sources import SourcePump, fastmatch, records, stdout
from babysit.sources import lines as ln
from tests.supervised import supervised_run

NANOGPT = ['iter (?P<step>\\d+): loss (?P<train_loss>[-+.\\w]+), time (?P<ms>[\\d.]+)ms',
           'step (?P<step>\\d+): train loss [-+.\\w]+, val loss (?P<val_loss>[-+.\\w]+)']


@pytest.mark.parametrize("regex", [
    r"^(?P<step>(a|aa)+)$",  # exponential in re over aaaa…ab
    r"(?P<x>\w+)$",  # tried at every byte, quadratic
    r"iter (?P<s>\d+)\s*(?P<t>\d+)",  # two repetitions that can trade digits
    r"loss (?P<x>.*)ms",  # `.*` whose follower may be its own character
    r"step (?P<step>\d*)",  # may match nothing after the literal: fine, but `\d*` then end → width > 0 kept
    r"x[[:digit:]]+", r"\Ax(?P<step>\d+)", r"x(?P<step>\d+)\z", r"x{,3}(?P<step>\d+)", r"(?U)x(?P<step>\d+)",
    r"(?i:x)(?P<step>\d+)", r"x(?P<step>\p{N}+)", r"ü(?P<step>\d+)",
])
def test_what_re_may_backtrack_on_or_read_otherwise_gets_no_twin(regex: str) -> None:
    if regex.startswith("step"):
        assert fastmatch.twin(regex) is not None  # the control: a literal, then one repetition at the end
    else:
        assert fastmatch.twin(regex) is None, regex


def test_every_preset_pattern_that_gets_a_twin_matches_what_re2_matches_line_by_line() -> None:
    rng = random.Random(31)
    bits = ["iter ", "step ", "loss ", "time ", "ms", ": ", ", ", "| ", "/", "[", "]", "<", "it/s", "s/it", "Epoch ",
            "epoch ", "batches", "valid loss ", "val loss ", "train loss ", "lr ", "ppl ", "%|", "██", "é", "\t", " ",
            "nan", "inf", "-", "+", ".", "12", "3.5", "0", "7", "1e-3", "00:01", "?", ",", "validate step: ",
            "loss: ", "end of epoch ", "ms/batch "]
    lines = ["".join(rng.choice(bits) for _ in range(rng.randint(1, 14))) for _ in range(4000)]
    lines += ["iter 12: loss 3.1230, time 1.00ms, mfu 1.2%", "step 5: train loss 2.5, val loss 2.25",
              " 40%|████      | 400/1000 [00:01<00:02, 99.00it/s]", "iter 1: loss 2.0, time 3ms iter 2: loss 1.0, time 4ms"]
    twinned = 0
    for name in names():
        for pattern in preset_patterns(name):
            tw = fastmatch.twin(pattern.regex)
            if tw is None:
                continue
            twinned += 1
            program = re2.compile(pattern.regex)
            for line in lines:
                text = line.strip()
                if tw.ascii_text and not text.isascii():
                    continue
                want = [m.span() + m.groups() for m in program.finditer(text.encode())]
                got = [m.span() + tuple(g.encode("latin-1") if g is not None else None for g in m.groups())
                       for m in tw.compiled.finditer(text.encode().decode("latin-1"))]
                want = [w[:2] + tuple(g if g is not None else None for g in w[2:]) for w in want]
                assert got == want, (pattern.regex, text)
    assert twinned >= 8  # nanoGPT's, tqdm's, word_language_model's, torchtitan's validate line, Lightning's bar


def _spec(tmp_path: Path, body: str) -> object:
    (tmp_path / "run.toml").write_text(f'[run]\nname = "r"\ncommand = ["true"]\n{body}')
    return load_spec(tmp_path / "run.toml")


def _pump_twice(tmp_path: Path, body: str, chunks: list[tuple[str, str]], monkeypatch: pytest.MonkeyPatch
                ) -> tuple[list, list]:
    """The same output pumped by the fast path and by RE2's line loop (twins off), at the same times."""
    out = []
    columns = {"fast": 0, "loop": 0}  # pumps whose records came as columns
    for label, twins in (("fast", True), ("loop", False)):
        root = tmp_path / label
        root.mkdir()
        spec = _spec(root, body)
        sd = root / "sd"
        attempt = sd / "runs" / "r" / "attempt-1"
        attempt.mkdir(parents=True)
        pump = SourcePump(spec, sd)
        with monkeypatch.context() as mp:
            if not twins:
                mp.setattr(stdout, "_twins", lambda compiled: None)
            results = []
            for k, (text, err) in enumerate(chunks):
                with open(attempt / "stdout.log", "ab") as f:
                    f.write(text.encode())
                with open(attempt / "stderr.log", "ab") as f:
                    f.write(err.encode())
                while True:
                    got = pump.pump(1.8e9 + 10 * k, budget=4096)
                    columns[label] += isinstance(got.records, records.RecordBatch) and any(
                        isinstance(seg, records.ColumnSegment) for seg in got.records.segments)
                    results.append((got.records_added, got.lines_seen, got.evidence.sample, got.problems,
                                    got.backlog, repr(list(got.records or ()))))  # repr: NaN == NaN
                    if not got.backlog:
                        break
        state = {k: v for k, v in pump.state.items() if k != "sizes"}  # sizes: keyed by the files' paths
        state["reader"] = {**state["reader"], "cursors": {k: {**c, "file_id": None}  # the files' inodes
                                                          for k, c in state["reader"]["cursors"].items()}}
        out.append((results, (sd / "runs" / "r" / "records.jsonl").read_bytes(), state))
    assert columns["fast"] >= len(chunks) - 2 and columns["loop"] == 0, columns  # the fast path was the one taken
    return out[0], out[1]


def test_the_fast_path_writes_the_loops_bytes_records_counts_and_samples(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    body = """[source]
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
"""
    rng = random.Random(7)
    chunks = []
    step = 0
    for k in range(12):
        lines = []
        for _ in range(rng.randint(50, 400)):
            step += 1
            kind = rng.random()
            if kind < 0.6:
                lines.append(f"iter {step}: loss {rng.random() * 4:.4f}, time {rng.random() * 50:.2f}ms, mfu 1.2%")
            elif kind < 0.65:
                lines.append(f"step {step}: train loss 2.5, val loss {rng.random():.4f}")
            elif kind < 0.7:  # two records on one line, the second pattern's first in the text
                lines.append(f"step {step}: train loss 2.5, val loss 1.5 iter {step}: loss 2.0, time 3.0ms "
                             f"iter {step + 1}: loss 1.0, time 4.0ms")
            elif kind < 0.8:  # a bar that resets (forward only), in colour, with non-ASCII
                lines.append(f"\x1b[32m {rng.randint(0, 99)}%|██▏ | {rng.randint(0, 300)}/300 [00:01<00:02]\x1b[0m")
            elif kind < 0.83:
                lines.append("   ")
            elif kind < 0.85:  # blanks around a record: stripped or not, the same match
                lines.append(f" \t iter {step}: loss 0.5, time 1.0ms \t ")
            else:
                lines.append(f"compiling the model … {rng.random()}")
        text = "\r\n".join(lines) if k % 3 == 0 else "\n".join(lines)
        chunks.append((text + ("\n" if k % 4 else ""), f"warn {k}\n" if k % 2 else ""))
    for k in range(3):  # floods of bars with a record now and then: matched on the lines with a literal only
        bars = [f" {j % 100:3d}%|██▏ | {j}/300 [00:01<00:02, 9.0it/s]" if j % 97 else "  " for j in range(2000)]
        for j in range(0, 2000, 500 + 300 * k):
            step += 1
            bars[j] = f"iter {step}: loss {rng.random():.4f}, time 1.0ms"
        if k == 1:
            bars[-1] = f"step {step}: train loss 2.5, val loss 0.5"  # the newest line matched: the sample before
        chunks.append(("\n".join(bars) + "\n", ""))
    chunks.append(("iter 1: loss nan, time 1.0ms\niter 2: loss 1.5, time 1.0ms\n", ""))  # a NaN: written as NaN
    chunks.append(("iter 3: loss abc, time 1.0ms\n", ""))  # no number: the loop says so (the fast path gives way)
    fast, loop = _pump_twice(tmp_path, body, chunks, monkeypatch)
    assert fast[1] == loop[1] and fast[1].count(b"\n") > 1500  # the record log, byte for byte
    assert fast[0] == loop[0]  # per pump: records, lines, sample, problems, backlog, the records handed on
    assert fast[2] == loop[2]  # the pump's state: cursors, counts, anchor, the forward-only last steps
    assert b"NaN" in fast[1]


def test_a_batch_is_the_sequence_of_records_the_loop_hands_on(tmp_path: Path) -> None:
    blocks = [records.Block(("a", "b"), [1, 2, 3], ([1.0, 2.0, 3.5], [0.5, 0.25, 1e300])),
              records.Item(4, {"c": 2.0}), records.Block(("a",), [5, 6], ([float("nan"), 1.0],))]
    path = tmp_path / "r.jsonl"
    written, anchor, batch = records.write_batch(path, blocks, (0, 1.8e9 - 5), 1.8e9, 0)
    one_by_one = records.stamp(list(records.items_of(blocks)), (0, 1.8e9 - 5), 1.8e9)
    lines = [records.encode(it) for it in one_by_one]
    assert path.read_bytes() == b"".join(lines) and written == len(b"".join(lines))
    assert list(batch) == list(records.as_log_records(one_by_one, lines, 0))
    assert [batch[i] for i in range(-len(batch), len(batch))] == list(batch) * 2
    assert anchor == (one_by_one[-1].step, one_by_one[-1].ts)


def test_stamps_are_written_as_repr_of_the_rounded_time() -> None:
    rng = random.Random(3)
    stamps = [rng.uniform(1e-3, 10) for _ in range(3000)] + [rng.uniform(1.7e9, 2**31 - 1) for _ in range(3000)]
    stamps += [1.0, 2.0, 1e-3, 2**31 - 1e-3, 1800000000.0, 1800000000.0000005, 0.0015, 123.4564999]
    for chunk in (stamps, [1e-4, 5.0], [2.0**31, 1.0], [3e9]):  # outside the range: repr(round()) itself
        assert records._ts_texts(chunk) == [repr(round(x, 6)) for x in chunk]


def test_the_twin_of_a_negated_class_never_runs_into_the_next_line() -> None:
    tw = fastmatch.twin(r"loss=(?P<x>[^,]+),")
    assert tw is not None and tw.ascii_text
    text = "loss=1.5\nloss=2.5,\n"
    assert [m.group("x") for m in tw.compiled.finditer(text)] == ["2.5"]
    assert re.compile(r"loss=(?P<x>[^,]+),", re.M).findall(text) == ["1.5\nloss=2.5"]  # what plain re does


RUN_TOML = """[run]
name = "r"
command = ["python", "train.py"]
total_steps = 100000

[guards]
min_free_host_ram_gib = 1

[source]
kind = "stdout"
[[source.patterns]]
regex = 'iter (?P<step>\\d+): loss (?P<train_loss>[-+.\\w]+), grad_norm (?P<grad_norm>[-+.\\w]+)'
[[source.patterns]]
regex = 'step (?P<step>\\d+): eval_loss (?P<eval_loss>[-+.\\w]+), total_steps (?P<total_steps>\\d+)'

[prereg]
question = "Does eval loss fall?"
metric = "eval_loss"
baseline_step = 0
read_step = 4000
[[prereg.bands]]
label = "IMPROVES"
max = 0.0
[prereg.otherwise]
label = "FLAT-OR-WORSE"
"""


def _runlog_state(tmp_path: Path, text: str, twins: bool, monkeypatch: pytest.MonkeyPatch) -> dict:
    tmp_path.mkdir()
    with supervised_run(tmp_path, RUN_TOML, text) as (sup, clock):
        with monkeypatch.context() as mp:
            if not twins:
                mp.setattr(stdout, "_twins", lambda compiled: None)
            clock.advance(5)
            sup.runlog.read_log(drain=True)
        log = sup.runlog
        handed = log.pumped.records if log.pumped is not None else None
        took_columns = isinstance(handed, records.RecordBatch) and any(
            isinstance(seg, records.ColumnSegment) for seg in handed.segments)
        assert took_columns == twins  # the reads came as columns with twins, one by one without
        return {"points": [(p.step, p.ts) for p in log.points], "recent": repr(list(log.recent)),
                "shown": repr(log.latest_shown), "eval": (log.latest_eval, log.latest_eval_step),
                "declared": log.declared_end, "nonfinite": repr(log.nonfinite), "pending": log.nonfinite_pending,
                "series": sup.verdicts.series_cache.series() if sup.verdicts.series_cache else None,
                "provisional": sup.verdicts.provisional,
                "records": (tmp_path / ".babysit" / "runs" / "r" / "records.jsonl").read_bytes()}


@pytest.mark.parametrize("tail", ["", "iter 9000: loss 1.0, grad_norm inf\n", "iter 9000: loss nan, grad_norm 1.0\n"])
def test_a_run_reads_the_same_from_columns_as_from_records(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                           tail: str) -> None:
    """The run's state after a read (step points, recent records, shown metrics, the latest eval, the
    declared end, divergence, the verdict's series) is the same whether the records came as columns or
    one by one; with a NaN or an inf in the read too (a grad norm's first inf is pending, a loss's is
    divergence)."""
    lines = []
    for i in range(1, 8001):
        lines.append(f"iter {i}: loss {4 - i / 4000:.4f}, grad_norm {1 + (i % 7) / 10:.2f}")
        if i % 1000 == 0 or i == 1:
            lines.append(f"step {i if i > 1 else 0}: eval_loss {3 - i / 8000:.4f}, total_steps {8000 + i}")
    text = "\n".join(lines) + "\n" + tail
    fast = _runlog_state(tmp_path / "fast", text, True, monkeypatch)
    loop = _runlog_state(tmp_path / "loop", text, False, monkeypatch)
    assert fast == loop
    assert fast["declared"] == 16000 and fast["eval"][1] == 8000 and len(fast["points"]) == 256
    assert [step for step, _ in fast["series"][0]] == [0, *range(1000, 8001, 1000)]  # the verdict's series


def test_printed_decimals_are_written_as_the_repr_of_their_float() -> None:
    rng = random.Random(5)
    texts = [f"{rng.uniform(-1e6, 1e6):.{rng.randint(1, 8)}f}" for _ in range(5000)]
    texts += [f"{rng.uniform(1e-4, 1e-2):.8f}" for _ in range(2000)] + ["1.00", "0.0000", "-0.000", "3.1230", "10.0"]
    got = records.json_texts(texts)
    assert got == [repr(float(t)) for t in texts]
    for odd in (["1e-5"], ["0.00001"], ["0.00004248"], ["+1.5"], ["1234567.5"], ["1"], ["01.5"], ["nan"],
                ["1.5", " 2.5"]):  # repr writes 4.248e-05 for the small one
        assert records.json_texts(odd) is None, odd  # made floats (and repr'd) instead


def test_a_twin_runs_over_unstripped_lines_only_when_its_matches_keep_off_the_edges() -> None:
    assert fastmatch.twin(NANOGPT[0]).edges and fastmatch.twin(NANOGPT[1]).edges
    assert fastmatch.twin(r"iter (?P<s>\d+)(?:, mfu (?P<m>[\d.]+)%)?").edges
    for regex in (r"x(?P<s>\d+)\s*", r"^x(?P<s>\d+)", r"x(?P<s>\d+)$", r"x(?:a|\s)(?P<s>\d+)(?: |b)?"):
        tw = fastmatch.twin(regex)
        assert tw is not None and not tw.edges, regex  # a match may end (or look) at a stripped edge


def test_a_column_printed_with_one_format_is_checked_by_its_shape_and_written_as_repr() -> None:
    rng = random.Random(28)
    for digits in range(1, 9):  # `%.Nf` of values >= 1: the shape check alone decides (no regex)
        texts = [f"{rng.uniform(1, 999999):.{digits}f}" for _ in range(2000)] + [f"{7:.{digits}f}"]
        texts = [t for t in texts if len(t) == len(texts[0])]
        assert records._uniform_decimals(texts, "\n".join(texts)), digits
        assert records.json_texts(texts) == [repr(float(t)) for t in texts]
    assert records.json_texts(["1.00"] * 5) == ["1.0"] * 5 and records.json_texts(["3.25", "4.50"]) == ["3.25", "4.5"]
    for odd in (["1.5", "2.5.", "3.5"][:2], ["1.5", "1..5"], ["0.50", "1.50"], ["10.5", "01.5"], ["1.5", "\u00b2.5"],
                ["1.5", "-1.5"], ["1234567.5"], ["1.123456789"], [".5", ".6"], ["15", "16"], ["1.5", "1.5 "]):
        assert not records._uniform_decimals(odd, "\n".join(odd)), odd  # then `_DECIMALS` (or floats) decide
        got = records.json_texts(odd)
        assert got is None or got == [repr(float(t)) for t in odd], odd


def test_a_sources_matchers_are_made_once_and_never_those_of_another_source(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    one = _spec(tmp_path / "a", '[source]\nkind = "stdout"\npreset = "auto"').source
    other = _spec(tmp_path / "b", '[source]\nkind = "stdout"\npreset = "nanogpt"').source
    first = stdout._prepared(one, "nanogpt")
    assert all(a is b for a, b in zip(first[1], stdout._prepared(one, "nanogpt")[1], strict=True))  # not made again
    assert [m.key for m in stdout._prepared(other, None)[1]] == [m.key for m in stdout.matchers(other)]
    assert [name for name, _, _ in stdout._prepared(one, None)[2]] == [name for name, _ in one.candidates]
    assert stdout._prepared(one, "nanogpt")[2] == []  # nanoGPT's is the first preset tried: none ahead of it


def test_a_flood_read_whole_never_split_gives_the_loops_records_counts_and_samples(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    body = "[source]\nkind = \"stdout\"\n" + "".join(f"[[source.patterns]]\nregex = '{r}'\n" for r in NANOGPT)
    rng = random.Random(41)
    chunks = []
    step = 0
    for k in range(14):
        lines = [f" {j % 100:3d}%|███▏ | {j}/900 [00:01<00:02, 9.0it/s]" for j in range(rng.randint(20, 300))]
        for j in range(0, len(lines), rng.randint(3, 60)):
            step += 1
            lines[j] = f"iter {step}: loss {rng.random() * 4:.4f}, time 1.00ms, mfu 1.2%"
        if k % 3 == 1:
            lines[-1] = f"step {step}: train loss 2.5, val loss {rng.random():.4f}"  # the newest line matched
        if k % 4 == 2:
            lines.insert(len(lines) // 2, "")  # an empty line (a print after a `\r` bar): no line
        if k == 5:
            lines.insert(3, " \t ")  # blanks only: no line either (the split path says so)
        if k == 7:
            lines.insert(2, "x" * 5000)  # longer than FAST_LINE_BYTES: split (and the loop reads it)
        if k in (8, 9):  # the newest line unmatched, ending in a byte str.strip takes as space in latin-1 (\xa0, \x85)
            lines[-1] = "warming up\u00a0" if k == 8 else "eval …\u0085"
        sep = "\r" if k % 5 == 0 else "\r\n" if k % 5 == 1 else "\n"  # tqdm's redraws, Windows' ends
        chunks.append((sep + sep.join(lines) + ("\n" if k % 6 else ""), f"warn {k}\n" if k % 2 else ""))
    taken = []
    whole = stdout._read_whole
    monkeypatch.setattr(stdout, "_read_whole", lambda *a: taken.append(whole(*a)) or taken[-1])
    fast, loop = _pump_twice(tmp_path, body, chunks, monkeypatch)
    assert sum(t is not None for t in taken) >= 10  # read whole, most of them
    assert fast[1] == loop[1] and fast[1].count(b"\n") > 100  # the record log, byte for byte
    assert fast[0] == loop[0]  # per pump: records, lines, sample, problems, backlog, the records handed on
    assert fast[2] == loop[2]
    path = tmp_path / "out.log"
    path.write_bytes(b"\r 1%|\r 2%|\r\n\niter 1: loss 1.0, time 1.00ms\n\r 3%| no newline yet")
    for final in (False, True):  # the writer's unterminated last line: a line of the whole read once it exited
        got = ln.read_lines(path, ln.Cursor(), final=final, whole=stdout.FAST_LINE_BYTES)
        split = ln.read_lines(path, ln.Cursor(), final=final)
        assert got.whole is not None and tuple(got.whole.split(b"\n")[:-1]) == split.lines
        assert got.cursor == split.cursor and got.lines == () and (got.grown, got.more) == (split.grown, split.more)
    path.write_bytes(b"a\n" + b"x" * 5000 + b"\nb\n")
    assert ln.read_lines(path, ln.Cursor(), whole=stdout.FAST_LINE_BYTES).whole is None  # over the bound: split
