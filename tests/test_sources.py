"""`[source]`: the spec table, and the pump over real files — stdout captured by the real shim, a
Lightning-style CSV rewritten whole, restarts that must neither lose nor duplicate a record."""

from __future__ import annotations

import csv
import itertools
import json
import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from babysit import cli
from babysit.core.errors import SpecError
from babysit.core.reading.log_records import metric_series, seconds_per_step
from babysit.core.spec.run_toml import RunSpec, load_spec
from babysit.executors.shim import shim_argv
from babysit.sources import SourcePump, records_path, unreadable
from babysit.sources.lines import Cursor, read_lines
from babysit.sources.logtail import read_all

RUN = """
[run]
name = "r1"
command = ["python", "train.py"]
"""

NANOGPT = r"""
[source]
kind = "stdout"
[[source.patterns]]
regex = 'iter (?P<step>\d+): loss (?P<loss>[-+.\w]+), time (?P<iter_ms>[\d.]+)ms'
[[source.patterns]]
regex = 'step (?P<step>\d+): train loss (?P<train_loss>[-+.\w]+), val loss (?P<val_loss>[-+.\w]+)'
"""

TORCHTITAN = r"""
[source]
kind = "stdout"
{extra}
[[source.patterns]]
regex = 'step:\s*(?P<step>\d+)\s+loss:\s*(?P<loss>[-+.\w]+)'
"""


def titan(extra: str = "") -> str:
    return RUN + TORCHTITAN.replace("{extra}", extra)


def spec_from(tmp_path: Path, text: str) -> RunSpec:
    path = tmp_path / "run.toml"
    path.write_text(textwrap.dedent(text))
    return load_spec(path, display="run.toml")


def rejection(tmp_path: Path, text: str) -> SpecError:
    with pytest.raises(SpecError) as info:
        spec_from(tmp_path, text)
    assert info.value.exit_code == 2
    return info.value


def records(spec: RunSpec, state_dir: Path) -> list:
    recs, garbage = read_all(records_path(spec, state_dir))
    assert garbage == 0
    return recs


def attempt(state_dir: Path, n: int, name: str = "r1") -> Path:
    adir = state_dir / "runs" / name / f"attempt-{n}"
    adir.mkdir(parents=True, exist_ok=True)
    return adir


def write(path: Path, text: str, mode: str = "a") -> None:
    with open(path, mode, encoding="utf-8") as f:
        f.write(text)


def shim(adir: Path, program: str) -> None:
    """Run `program` under the local executor's own shim, which captures stdout.log and stderr.log."""
    subprocess.run(shim_argv(adir, [sys.executable, "-c", program]), check=True, timeout=60)


# -- the spec --------------------------------------------------------------------------------------


def test_without_source_the_run_log_is_read_as_jsonl_as_before(tmp_path: Path) -> None:
    spec = spec_from(tmp_path, RUN + 'log = "outputs/{name}/log.jsonl"\n')
    assert spec.source.kind == "jsonl" and spec.source.path == spec.log == tmp_path / "outputs/r1/log.jsonl"
    assert records_path(spec, tmp_path / ".babysit") == spec.log


def test_a_jsonl_source_path_may_name_the_log_instead_of_run_log(tmp_path: Path) -> None:
    spec = spec_from(tmp_path, RUN + '[source]\npath = "logs/{name}.jsonl"\n')
    assert spec.log == tmp_path / "logs/r1.jsonl" == records_path(spec, tmp_path)


def test_a_stdout_source_needs_no_run_log_and_reads_into_babysits_record_log(tmp_path: Path) -> None:
    spec = spec_from(tmp_path, RUN + NANOGPT)
    assert spec.log is None and spec.source.kind == "stdout" and len(spec.source.patterns) == 2
    assert spec.source.patterns[0].metric_groups == ("loss", "iter_ms")
    assert records_path(spec, tmp_path / "sd") == tmp_path / "sd" / "runs" / "r1" / "records.jsonl"


def test_csv_and_tensorboard_sources_take_path_rename_and_offset(tmp_path: Path) -> None:
    spec = spec_from(tmp_path, RUN + """
[source]
kind = "csv"
path = "lightning_logs/{name}/metrics.csv"
step_offset = 1
step_column = "global_step"
[source.metrics]
"val/loss" = "val_loss"
""")
    src = spec.source
    assert src.path == tmp_path / "lightning_logs/r1/metrics.csv" and src.step_offset == 1
    assert src.step_column == "global_step" and src.rename("val/loss") == "val_loss" and src.rename("x") == "x"
    tb = spec_from(tmp_path, RUN + '[source]\nkind = "tensorboard"\npath = "runs"\n').source
    assert tb.kind == "tensorboard" and tb.path == tmp_path / "runs"


@pytest.mark.parametrize(("fragment", "message"), [
    ('[source]\nkind = "neptune"', 'run.toml: source.kind: expected one of "jsonl" | "stdout" | "tensorboard" | "csv" | '
     '"wandb" | "mlflow", got \'neptune\''),
    ('[source]\nkind = "stdout"', "run.toml: source.patterns: expected at least one [[source.patterns]] table"),
    ('[source]\nkind = "stdout"\n[[source.patterns]]\nregex = "iter (\\\\d+"',
     "run.toml: source.patterns[0].regex: expected a valid regular expression"),
    ('[source]\nkind = "stdout"\n[[source.patterns]]\nregex = "iter (?P<it>\\\\d+)"',
     "run.toml: source.patterns[0].regex: expected a regular expression with a named group (?P<step>…)"),
    ('[source]\nkind = "stdout"\n[[source.patterns]]\nregex = "(?P<step>\\\\d+) (?P<ts>\\\\S+)"',
     'run.toml: source.patterns[0].regex: expected no group named "ts"'),
    ('[source]\nkind = "stdout"\n[[source.patterns]]\nregx = "(?P<step>\\\\d+)"',
     'run.toml: source.patterns[0].regx: unknown key — did you mean "regex"?'),
    ('[source]\nkind = "stdout"\n[[source.pattern]]\nregex = "(?P<step>\\\\d+)"', "run.toml: source.pattern: expected a known key"),
    ('[source]\nkind = "stdout"\npath = "out.txt"\n[[source.patterns]]\nregex = "(?P<step>\\\\d+)"',
     'run.toml: source.path: expected no path for kind = "stdout"'),
    ('[source]\nkind = "tensorboard"', "run.toml: source.path: expected a value (this key is required)"),
    ('[source]\nkind = "csv"', "run.toml: source.path: expected a value (this key is required)"),
    ('[source]\nkind = "csv"\npath = ""', "run.toml: source.path: expected the CSV file the trainer writes"),
    ('[source]\nkind = "csv"\npath = "m.csv"\nstep_offset = "1"', "run.toml: source.step_offset: expected an integer, got '1'"),
    ('[source]\nkind = "csv"\npath = "m.csv"\nstep_offset = 1.5', "run.toml: source.step_offset: expected an integer, got 1.5"),
    ('[source]\nkind = "csv"\npath = "m.csv"\n[source.metrics]\nloss = 1', "run.toml: source.metrics.loss: expected a string, got 1"),
    ('[source]\nkind = "csv"\npath = "m.csv"\n[source.metrics]\ntime = "ts"',
     'run.toml: source.metrics.time: expected a metric name other than "step" and "ts"'),
    ('[source]\nkind = "csv"\npath = "m.csv"\n[[source.patterns]]\nregex = "(?P<step>\\\\d+)"',
     'run.toml: source.patterns: expected no patterns for kind = "csv"'),
    ('[source]\nkind = "tensorboard"\npath = "runs"\nstep_column = "s"', 'run.toml: source.step_column: expected nothing for kind = "tensorboard"'),
    ('[source]\nkind = "csv"\npath = "m.csv"\nstep_colum = "s"', "run.toml: source.step_colum: expected a known key"),
    ('[source]\npath = "other.jsonl"', "run.toml: source.path: expected the same file as run.log"),
    ('[source]\n[source.metrics]\nloss = "l"', 'run.toml: source.metrics: expected nothing for kind = "jsonl"'),
    ('[source]\nstep_offset = 1', 'run.toml: source.step_offset: expected nothing for kind = "jsonl"'),
])
def test_bad_sources_are_refused_naming_the_key(tmp_path: Path, fragment: str, message: str) -> None:
    error = rejection(tmp_path, RUN + 'log = "log.jsonl"\n' + fragment)
    assert str(error).startswith(message), str(error)


@pytest.mark.parametrize(("regex", "construct"), [
    (r"(?<!validate )step: (?P<step>\d+)", "negative lookbehind (?<!…) is not supported by the linear-time engine"),
    (r"(?<=x)step (?P<step>\d+)", "lookbehind (?<=…) is not supported"),
    (r"step (?P<step>\d+)(?= loss)", "lookahead (?=…) is not supported"),
    (r"(?P<step>\d+) (?P=step)", "a backreference (?P=name) is not supported"),
    (r"(?P<step>(\d)\2)", "a backreference (\\1 … \\9) is not supported"),
    (r"step (?P<step>\d+)\Z", "\\Z (write \\z or $) is not supported"),
    (r"(?P<step>\d{2000})", "RE2: invalid repetition size"),
])
def test_a_pattern_the_linear_engine_cannot_run_is_refused_naming_the_key_and_the_construct(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], regex: str, construct: str) -> None:
    path = tmp_path / "run.toml"
    path.write_text(RUN + "[source]\nkind = \"stdout\"\n[[source.patterns]]\nregex = 'step (?P<step>\\d+)'\n"
                    f"[[source.patterns]]\nregex = '{regex}'\n")
    code = cli.main(["register", str(path), "--registry", str(tmp_path / "babysit.toml")])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "run.toml: source.patterns[1].regex: expected a valid regular expression in RE2's syntax" in err, err
    assert construct in err and repr(regex) in err, err
    assert "docs/your-trainer.md" in err and "HINT: " in err
    assert not (tmp_path / "babysit.toml").exists()  # nothing registered


def test_a_pattern_that_backtracks_for_hours_in_re_costs_microseconds_here(tmp_path: Path) -> None:
    """`^(?P<step>(a|aa)+)$` against `aaaa…ab`: Python's `re` tries every split of the a's (~1.6^n: 40 a's
    took 314 s, 60 take years), so on the old engine this test never ends (pytest-timeout fails it); RE2
    is linear, and the lines that do match are still read."""
    spec = spec_from(tmp_path, RUN + "[source]\nkind = \"stdout\"\n[[source.patterns]]\nregex = '^(?P<step>(a|aa)+)$'\n"
                     "[[source.patterns]]\nregex = '^n (?P<step>\\d+)$'\n")
    sd = tmp_path / "sd"
    write(attempt(sd, 1) / "stdout.log", "".join(f"{'a' * 60}b\nn {i}\n" for i in range(50)))
    result = SourcePump(spec, sd).pump(now=1.0)
    assert result.lines_seen == 100 and result.records_added == 50
    assert [r.step for r in records(spec, sd)] == list(range(50))


def test_without_a_source_run_log_is_still_required_and_its_typo_named(tmp_path: Path) -> None:
    assert str(rejection(tmp_path, RUN)).startswith("run.toml: run.log: expected a value (this key is required)")
    assert "did you mean \"log\"" in str(rejection(tmp_path, RUN + 'lg = "l"\n'))


def test_a_bad_source_exits_2_with_error_and_hint(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "run.toml"
    path.write_text(RUN + '[source]\nkind = "stdout"\npath = "out.txt"\n[[source.patterns]]\nregex = "(?P<step>\\\\d+)"\n')
    code = cli.main(["register", str(path), "--registry", str(tmp_path / "babysit.toml")])
    err = capsys.readouterr().err
    assert code == 2
    assert 'ERROR: ' in err and 'source.path: expected no path for kind = "stdout"' in err
    assert "HINT: stdout reads the run's captured stdout and stderr" in err


# -- stdout ----------------------------------------------------------------------------------------


NANOGPT_PROGRAM = r"""
import sys
print("number of parameters: 0.80M")
print("iter 0: loss 4.2345, time 35.12ms, mfu -100.00%")
print("iter 10: loss 3.9876, time 31.00ms, mfu 1.20%")
print("step 20: train loss 3.9100, val loss 3.9500")
sys.stdout.write("iter 20: loss nan, time 30.50ms, mfu 1.30%\n")
print("\rprogress 50%\rprogress 100%", file=sys.stderr)
print("iter 30: loss inf, time 30.00ms, mfu 1.30%", file=sys.stderr)
"""


def test_nanogpt_stdout_and_stderr_become_records_and_nan_is_kept(tmp_path: Path) -> None:
    spec = spec_from(tmp_path, RUN + NANOGPT)
    sd = tmp_path / "sd"
    shim(attempt(sd, 1), NANOGPT_PROGRAM)
    result = SourcePump(spec, sd).pump(now=1000.0)
    assert result.records_added == result.records_parsed == 5
    assert result.lines_seen == 8  # 5 stdout lines; stderr: two \r-redrawn progress lines and one iter
    recs = records(spec, sd)
    assert [r.step for r in recs] == [0, 10, 20, 20, 30]
    assert recs[0].metrics == {"loss": 4.2345, "iter_ms": 35.12}
    assert recs[2].metrics == {"train_loss": 3.91, "val_loss": 3.95}
    assert recs[3].nonfinite == ("loss",) and math.isnan(recs[3].fields["loss"])  # kept, not dropped
    assert recs[4].fields["loss"] == math.inf
    assert metric_series(recs, "val_loss") == ((20, 3.95),)
    raw = records_path(spec, sd).read_text()
    assert '"loss":NaN' in raw and '"loss":Infinity' in raw  # babysit's JSONL spells non-finite as JSON does


def test_torchtitan_lines_with_colour_codes_are_read(tmp_path: Path) -> None:
    spec = spec_from(tmp_path, titan())
    sd = tmp_path / "sd"
    red, green, reset = "\x1b[31m", "\x1b[32m", "\x1b[39m"
    write(attempt(sd, 1) / "stdout.log",
          f"[titan] 2025-01-01 12:00:00,000 - root - INFO - {red}step:  1  {green}loss:  7.1000  {reset}memory: 9GiB\n"
          "[titan] 2025-01-01 12:00:01,000 - root - INFO - step: 10  loss:  6.2  memory: 9GiB\n")
    SourcePump(spec, sd).pump(now=1.0)
    assert [(r.step, r.metrics["loss"]) for r in records(spec, sd)] == [(1, 7.1), (10, 6.2)]


def test_rename_and_step_offset_apply_to_pattern_groups(tmp_path: Path) -> None:
    spec = spec_from(tmp_path, titan('step_offset = -1\nmetrics = { loss = "train/loss" }'))
    sd = tmp_path / "sd"
    write(attempt(sd, 1) / "stdout.log", "step: 100 loss: 2.5\n")
    SourcePump(spec, sd).pump(now=1.0)
    assert [(r.step, dict(r.metrics)) for r in records(spec, sd)] == [(99, {"train/loss": 2.5})]


def test_a_partial_line_waits_for_its_end(tmp_path: Path) -> None:
    spec = spec_from(tmp_path, titan())
    sd = tmp_path / "sd"
    out = attempt(sd, 1) / "stdout.log"
    pump = SourcePump(spec, sd)
    write(out, "step: 1 loss: 2.0\nstep: 2 lo")
    assert pump.pump(now=1.0).records_added == 1
    write(out, "ss: 1.5\n")
    assert pump.pump(now=2.0).records_added == 1
    assert [(r.step, r.metrics["loss"]) for r in records(spec, sd)] == [(1, 2.0), (2, 1.5)]


def test_an_unterminated_last_line_is_read_only_once_the_writer_has_exited(tmp_path: Path) -> None:
    """While the trainer lives its last bytes may be half a line; at its exit's drain (`final`) they are
    its last line (a `print(..., end="")`): read once, the cursor at the end, nothing read twice."""
    spec = spec_from(tmp_path, titan())
    sd = tmp_path / "sd"
    out = attempt(sd, 1) / "stdout.log"
    pump = SourcePump(spec, sd)
    write(out, "step: 1 loss: 2.0\nstep: 2 loss: 1.5")
    assert pump.pump(now=1.0).records_added == 1  # alive: the partial line waits
    got = pump.pump(now=2.0, final=True)
    assert got.records_added == 1 and got.lines_seen == 1
    assert pump.pump(now=3.0, final=True).records_added == 0  # read once
    assert [(r.step, r.metrics["loss"]) for r in records(spec, sd)] == [(1, 2.0), (2, 1.5)]
    path = tmp_path / "big.log"
    path.write_bytes(b"a\nbbb\ntail")
    first = read_lines(path, Cursor(), window=1, max_line_bytes=3, final=True)  # 4 bytes: not the file's end
    assert first.lines == (b"a",) and first.more and first.cursor.offset == 2
    rest = read_lines(path, first.cursor, final=True)
    assert rest.lines == (b"bbb", b"tail") and rest.cursor.offset == os.path.getsize(path)
    path.write_bytes(b"x" * 100 + b"\n" + b"y" * 60)  # an over-long unterminated end is dropped, not a line
    long = read_lines(path, Cursor(), max_line_bytes=50, final=True)
    assert long.lines == () and long.dropped == 2 and long.cursor.offset == os.path.getsize(path)


def test_captured_text_that_is_no_number_is_a_problem_not_a_crash(tmp_path: Path) -> None:
    spec = spec_from(tmp_path, RUN + '[source]\nkind = "stdout"\n[[source.patterns]]\nregex = \'step (?P<step>\\S+) loss (?P<loss>\\S+)\'\n')
    sd = tmp_path / "sd"
    write(attempt(sd, 1) / "stdout.log", "step 1 loss 0.5,\nstep x loss 0.4\nstep 3 loss 0.3\n")
    result = SourcePump(spec, sd).pump(now=1.0)
    assert [(r.step, dict(r.metrics)) for r in records(spec, sd)] == [(1, {}), (3, {"loss": 0.3})]
    assert any('group "loss" captured text that is not a number' in p for p in result.problems)
    assert any('group "step" captured text that is not an integer' in p for p in result.problems)


def test_every_attempt_is_read_in_order_each_from_its_own_offset(tmp_path: Path) -> None:
    spec = spec_from(tmp_path, titan())
    sd = tmp_path / "sd"
    pump = SourcePump(spec, sd)
    write(attempt(sd, 1) / "stdout.log", "step: 1 loss: 3.0\n")
    pump.pump(now=1.0)
    write(attempt(sd, 1) / "stderr.log", "step: 2 loss: nan\n")  # attempt 1's last words, read late
    for n in (2, 10):
        write(attempt(sd, n) / "stdout.log", f"step: {n * 100} loss: 1.0\n")
    pump.pump(now=2.0)
    assert [r.step for r in records(spec, sd)] == [1, 2, 200, 1000]


def test_bursts_are_stamped_so_seconds_per_step_is_the_true_rate(tmp_path: Path) -> None:
    """A trainer printing every 10 steps at 0.5 s/step, read every 20 s: 4 lines per read."""
    spec = spec_from(tmp_path, titan())
    sd = tmp_path / "sd"
    out = attempt(sd, 1) / "stdout.log"
    pump = SourcePump(spec, sd)
    step = 0
    for read in range(1, 6):
        for _ in range(4):
            step += 10
            write(out, f"step: {step} loss: 1.0\n")
        pump.pump(now=1000.0 + 20.0 * read)
    recs = records(spec, sd)
    assert [r.ts for r in recs[:4]] == [1020.0] * 4  # the first read has nothing to spread from
    assert recs[-1].ts == 1100.0 and all(a.ts < b.ts for a, b in itertools.pairwise(recs[3:]))
    assert seconds_per_step(recs) == pytest.approx(0.5)


def test_no_match_is_evidence_for_log_unreadable_naming_patterns_and_a_line(tmp_path: Path) -> None:
    spec = spec_from(tmp_path, RUN + NANOGPT)
    sd = tmp_path / "sd"
    write(attempt(sd, 1) / "stdout.log", "epoch 1 | step 10 | loss 4.2\nepoch 1 | step 20 | loss 4.1\n")
    result = SourcePump(spec, sd).pump(now=1.0)
    assert result.records_added == 0 and result.lines_seen == 2 and result.output_grew
    message = unreadable(spec.source, result.evidence, log=records_path(spec, sd))
    assert message is not None
    assert message.startswith("2 lines of the run's stdout/stderr read, 0 records parsed.")
    assert spec.source.patterns[0].regex in message and "'epoch 1 | step 20 | loss 4.1'" in message
    assert "The run is not stopped for this." in message


def test_output_growth_is_measured_even_when_nothing_parses(tmp_path: Path) -> None:
    spec = spec_from(tmp_path, titan())
    sd = tmp_path / "sd"
    adir = attempt(sd, 1)
    pump = SourcePump(spec, sd)
    assert pump.pump(now=1.0).output_bytes_grown == 0
    write(adir / "stderr.log", "\r 10%|#         | 10/100")  # tqdm: no newline, no record, but progress
    grown = pump.pump(now=2.0)
    assert grown.output_bytes_grown == len("\r 10%|#         | 10/100") and grown.last_output_at == 2.0
    quiet = pump.pump(now=3.0)
    assert quiet.output_bytes_grown == 0 and not quiet.output_grew and quiet.last_output_at == 2.0
    assert unreadable(spec.source, grown.evidence, log=records_path(spec, sd)) is not None


def test_a_jsonl_pump_writes_nothing_and_counts_growth_of_log_and_stdout(tmp_path: Path) -> None:
    spec = spec_from(tmp_path, RUN + 'log = "log.jsonl"\n')
    sd = tmp_path / "sd"
    pump = SourcePump(spec, sd)
    write(tmp_path / "log.jsonl", '{"step": 1, "ts": 1.0}\n')
    write(attempt(sd, 1) / "stdout.log", "hello\n")
    result = pump.pump(now=5.0)
    assert result.records_added == 0 and result.lines_seen is None and result.records_parsed is None
    assert result.output_bytes_grown == len('{"step": 1, "ts": 1.0}\n') + len("hello\n")
    assert not (sd / "runs" / "r1" / "records.jsonl").exists()


# -- restarts --------------------------------------------------------------------------------------


def test_a_restarted_pump_reads_on_from_the_persisted_state(tmp_path: Path) -> None:
    spec = spec_from(tmp_path, titan())
    sd = tmp_path / "sd"
    out = attempt(sd, 1) / "stdout.log"
    write(out, "step: 1 loss: 3.0\nstep: 2 loss: 2.0\n")
    saved = json.loads(json.dumps(SourcePump(spec, sd).pump(now=1.0).state))  # as the store keeps it
    write(out, "step: 3 loss: 1.0\n")
    again = SourcePump(spec, sd, saved)
    assert again.pump(now=2.0).records_added == 1
    assert [r.step for r in records(spec, sd)] == [1, 2, 3]
    assert again.pump(now=3.0).evidence.records_parsed == 3


def test_records_appended_after_the_last_persisted_state_are_not_written_twice(tmp_path: Path) -> None:
    """The daemon died after a pump appended but before the store kept its state."""
    spec = spec_from(tmp_path, titan())
    sd = tmp_path / "sd"
    out = attempt(sd, 1) / "stdout.log"
    write(out, "step: 1 loss: 3.0\n")
    pump = SourcePump(spec, sd)
    persisted = json.loads(json.dumps(pump.pump(now=1.0).state))
    write(out, "step: 2 loss: 2.0\n")
    pump.pump(now=2.0)  # appended step 2; this state is lost with the daemon
    write(out, "step: 3 loss: 1.0\n")
    SourcePump(spec, sd, persisted).pump(now=3.0)
    assert [r.step for r in records(spec, sd)] == [1, 2, 3]


def test_a_lost_record_log_or_a_changed_source_is_rebuilt_from_the_source(tmp_path: Path) -> None:
    spec = spec_from(tmp_path, titan())
    sd = tmp_path / "sd"
    write(attempt(sd, 1) / "stdout.log", "step: 1 loss: 3.0\nstep: 2 loss: 2.0\n")
    state = SourcePump(spec, sd).pump(now=1.0).state
    records_path(spec, sd).unlink()
    SourcePump(spec, sd, state).pump(now=2.0)
    assert [r.step for r in records(spec, sd)] == [1, 2]
    shifted = spec_from(tmp_path, titan("step_offset = 1000"))
    SourcePump(shifted, sd, state).pump(now=3.0)
    assert [r.step for r in records(shifted, sd)] == [1001, 1002]


# -- csv (Lightning) -------------------------------------------------------------------------------


class LightningCsv:
    """Lightning's CSV experiment writer, as it writes metrics.csv: rows are buffered, `save()` appends
    them, and a key never seen before rewrites the whole file under a new (sorted) header."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.keys: list[str] = []
        self.pending: list[dict[str, object]] = []

    def log(self, step: int, **metrics: float) -> None:
        self.pending.append({**metrics, "step": step})

    def save(self, *, cut_rewrite_at: int | None = None) -> None:
        new = set().union(*self.pending) - set(self.keys)
        self.keys = sorted([*self.keys, *new])
        exists = self.path.exists()
        if new and exists:
            with open(self.path, newline="") as f:
                old = list(csv.DictReader(f))
            with open(self.path, "w", newline="") as f:
                writer = csv.DictWriter(f, fieldnames=self.keys)
                writer.writeheader()
                writer.writerows(old)
            if cut_rewrite_at is not None:  # what a reader sees in the middle of that rewrite
                self.full = self.path.read_bytes()
                self.path.write_bytes(self.full[:cut_rewrite_at])
                return
        with open(self.path, "a" if exists else "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=self.keys)
            if not exists:
                writer.writeheader()
            writer.writerows(self.pending)
        self.pending = []


CSV_SPEC = RUN + '[source]\nkind = "csv"\npath = "lightning_logs/version_0/metrics.csv"\nstep_offset = 1\n'


def csv_run(tmp_path: Path) -> tuple[RunSpec, Path, LightningCsv]:
    spec = spec_from(tmp_path, CSV_SPEC)
    assert spec.source.path is not None
    spec.source.path.parent.mkdir(parents=True)
    return spec, tmp_path / "sd", LightningCsv(spec.source.path)


def test_lightning_csv_rewritten_whole_with_a_new_column_loses_and_duplicates_nothing(tmp_path: Path) -> None:
    spec, sd, writer = csv_run(tmp_path)
    pump = SourcePump(spec, sd)
    for step in (49, 99):
        writer.log(step, train_loss=1.0 / (step + 1), epoch=0)
    writer.save()
    assert pump.pump(now=1.0).records_added == 2
    writer.log(99, val_loss=0.5, epoch=0)  # a new column: the whole file is rewritten
    writer.log(149, train_loss=0.2, epoch=1)
    writer.save()
    got = pump.pump(now=2.0)
    assert got.records_added == 2 and got.problems == ()
    writer.log(199, train_loss=0.1, epoch=1)
    writer.save()
    pump.pump(now=3.0)
    recs = records(spec, sd)
    assert [r.step for r in recs] == [50, 100, 100, 150, 200]  # step_offset 1: Lightning's global_step - 1
    assert metric_series(recs, "val_loss") == ((100, 0.5),)  # the prereg at 100 reads it
    assert metric_series(recs, "train_loss")[-1] == (200, 0.1)
    assert dict(recs[2].metrics) == {"val_loss": 0.5, "epoch": 0.0}  # a row: its non-empty cells


def test_a_rewrite_caught_half_written_is_waited_for(tmp_path: Path) -> None:
    spec, sd, writer = csv_run(tmp_path)
    pump = SourcePump(spec, sd)
    for step in range(9, 100, 10):
        writer.log(step, train_loss=float(step))
    writer.save()
    assert pump.pump(now=1.0).records_added == 10
    writer.log(99, val_loss=0.5)
    writer.save(cut_rewrite_at=60)  # the header and a few old rows so far
    assert pump.pump(now=2.0).records_added == 0
    writer.path.write_bytes(writer.full)  # the rewrite completes
    writer.save()  # and the pending row is appended
    assert pump.pump(now=3.0).records_added == 1
    assert [r.step for r in records(spec, sd)] == [*range(10, 101, 10), 100]


def test_a_csv_started_afresh_is_read_from_its_first_row(tmp_path: Path) -> None:
    spec, sd, writer = csv_run(tmp_path)
    pump = SourcePump(spec, sd)
    for step in (9, 19, 29):
        writer.log(step, train_loss=1.0)
    writer.save()
    pump.pump(now=1.0)
    writer.path.unlink()  # a fresh attempt writes a new file, with other values
    fresh = LightningCsv(writer.path)
    fresh.log(9, train_loss=2.0)
    fresh.save()
    pump.pump(now=2.0)  # shorter but a different first row: new
    assert [(r.step, r.metrics["train_loss"]) for r in records(spec, sd)] == [(10, 1.0), (20, 1.0), (30, 1.0), (10, 2.0)]


def test_a_csv_restart_mid_run_reads_on_without_duplicates(tmp_path: Path) -> None:
    spec, sd, writer = csv_run(tmp_path)
    writer.log(9, train_loss=1.0)
    writer.save()
    state = json.loads(json.dumps(SourcePump(spec, sd).pump(now=1.0).state))
    writer.log(9, val_loss=0.9)
    writer.log(19, train_loss=0.8)
    writer.save()
    SourcePump(spec, sd, state).pump(now=2.0)
    assert [(r.step, dict(r.metrics)) for r in records(spec, sd)] == [
        (10, {"train_loss": 1.0}), (10, {"val_loss": 0.9}), (20, {"train_loss": 0.8})]


def test_a_csv_without_the_step_column_says_so(tmp_path: Path) -> None:
    spec, sd, _ = csv_run(tmp_path)
    assert spec.source.path is not None
    spec.source.path.write_text("epoch,loss\n0,1.5\n")
    result = SourcePump(spec, sd).pump(now=1.0)
    assert result.records_added == 0 and result.lines_seen == 1
    assert any('no column "step" in its header (epoch, loss)' in p for p in result.problems)
    message = unreadable(spec.source, result.evidence, log=records_path(spec, sd))
    assert message is not None and "1 rows read, 0 records parsed" in message


# -- the line reader -------------------------------------------------------------------------------


def test_the_line_reader_ends_lines_at_cr_skips_overlong_lines_and_notices_rewrites(tmp_path: Path) -> None:
    path = tmp_path / "out.log"
    path.write_bytes(b"a\rb\r\n" + b"x" * 100 + b"\nc\n")
    got = read_lines(path, Cursor(), max_line_bytes=50)
    assert got.lines == (b"a", b"b", b"c") and got.dropped == 1 and got.cursor.offset == os.path.getsize(path)
    path.write_bytes(b"new\n")  # rewritten in place, shorter
    again = read_lines(path, got.cursor)
    assert again.reset and again.lines == (b"new",) and again.grown == 4


def test_captured_files_follow_new_attempt_directories(tmp_path: Path) -> None:
    from babysit.sources.stdout import CapturedFiles

    run_dir = tmp_path / "runs" / "r"
    files = CapturedFiles(run_dir)
    assert files() == []  # no run directory yet
    (run_dir / "attempt-1").mkdir(parents=True)
    assert [p.parent.name for p in files()] == ["attempt-1", "attempt-1"]
    old = os.stat(run_dir).st_mtime_ns - 10_000_000_000
    os.utime(run_dir, ns=(old, old))  # settled long ago: the listing is kept...
    assert [p.parent.name for p in files()] == ["attempt-1", "attempt-1"]
    (run_dir / "attempt-2").mkdir()  # ...until the directory changes
    assert [p.name for p in files()] == ["stdout.log", "stderr.log"] * 2
    assert files()[-1].parent.name == "attempt-2"


def test_splitting_a_read_into_lines_at_c_speed_gives_what_the_terminator_loop_gives() -> None:
    import random

    from babysit.sources import lines as ln

    random.seed(1)
    alphabet = [b"a", b"bb", b"\n", b"\r", b"\r\n", b"x" * 30, b" "]
    for _ in range(3000):
        data = b"".join(random.choice(alphabet) for _ in range(random.randint(0, 40)))
        for skipping in (False, True):
            for limit in (8, 40, 10_000):
                assert ln.split_lines(data, skipping, limit) == ln._split_each(data, skipping, limit), \
                    (data, skipping, limit)
