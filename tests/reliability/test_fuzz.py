"""Fuzzing what users and trainers write: run.toml, amendment files, babysit.toml, train logs.

Never a traceback: every rejection exits 2 and names the field it refuses. The bulk goes through the
in-process CLI (`babysit.cli.main(argv)`); a sample goes through the real `python -m babysit`. The log
reader never raises, never stalls (a finished file is read to its end) and never buffers more than its
window, whatever bytes it is fed: random bytes, huge lines, NaN/inf, wrong types, steps out of order
or repeated, a clock going backwards.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import tomli_w
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from babysit.cli import main
from babysit.core.reading.log_records import LogRecord, metric_series, seconds_per_step
from babysit.sources import logtail

FUZZ = settings(max_examples=int(os.environ.get("BABYSIT_FUZZ_EXAMPLES", "60")), deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])

BASE_RUN: dict[str, Any] = {
    "run": {"name": "fuzz_run", "command": ["python", "-m", "trainer", "--recipe", "tiny"],
            "log": "outputs/{name}/train_log.jsonl", "gpus": [0], "executor": "local", "env": {"A": "1"}},
    "guards": {"exclusive_gpu": True, "gpu_hours_cap": 12.0, "min_free_host_ram_gib": 8, "stall_minutes": 20,
               "stop_grace_seconds": 120},
    "poll": {"first_after_minutes": 5, "every_minutes": 30, "starvation_util_pct": 50},
    "retry": {"max_attempts": 3, "on": ["oom", "diverged"], "resume": "fresh"},
    "attempts": [{"profile": "a", "args": ["--batch-size", "2"]}],
    "classify": [{"pattern": "ECC", "class": "crashed", "retry": False}],
    "machinery": {"knobs": ["--num-workers"]},
    "notify": {"channel": "#runs", "mention_on_incident": ["U024BE7LH"]},
    "prereg": {"question": "q", "metric": "eval_mae", "baseline_step": 500, "read_step": 1000, "precision": 4,
               "references": {"demosonly": 2.0317},
               "bands": [{"label": "HEALTHY", "max": 0.3}, {"label": "SAME-DRIFT", "min": "0.5 * demosonly"}],
               "otherwise": {"label": "AMBIGUOUS"}},
}


def leaves(d: Any, path: tuple = ()) -> Iterator[tuple]:
    if isinstance(d, dict):
        for k, v in d.items():
            yield from leaves(v, (*path, k))
    elif isinstance(d, list) and d and isinstance(d[0], dict):
        for i, v in enumerate(d):
            yield from leaves(v, (*path, i))
    else:
        yield path


RUN_LEAVES = sorted(leaves(BASE_RUN), key=str)

# TOML-representable junk of every type, the edge values included
junk = st.one_of(
    st.integers(min_value=-(2**63), max_value=2**63 - 1), st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=40), st.booleans(), st.lists(st.one_of(st.integers(), st.text(max_size=8)), max_size=4),
    st.dictionaries(st.text(min_size=1, max_size=6), st.integers(), max_size=3),
    st.sampled_from(["", "-1", "nan", "; touch /tmp/pwned", "../../etc/passwd", "x" * 5000, "U0", "#"]),
)


def put(d: Any, path: tuple, value: Any) -> None:
    for k in path[:-1]:
        d = d[k]
    d[path[-1]] = value


def field_name(path: tuple) -> str:
    return str([p for p in path if isinstance(p, str)][-1])


def cli(*argv: str) -> tuple[int, str]:
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        rc = main(list(argv))
    return rc, err.getvalue()


@FUZZ
@given(path=st.sampled_from(RUN_LEAVES), value=junk)
def test_run_toml_with_a_wrong_value_anywhere_registers_or_exits_2_naming_the_field(path: tuple, value: Any) -> None:
    data = json.loads(json.dumps(BASE_RUN))
    put(data, path, value)
    with tempfile.TemporaryDirectory() as tmp:
        spec = Path(tmp) / "run.toml"
        spec.write_text(tomli_w.dumps(data))
        rc, err = cli("register", str(spec), "--accelerated", "--registry", str(Path(tmp) / "babysit.toml"))
    assert rc in (0, 2), err
    if rc == 2:
        assert err.startswith("ERROR: ") and "Traceback" not in err
        assert field_name(path) in err, (path, value, err)


@FUZZ
@given(table=st.sampled_from(["run", "guards", "poll", "retry", "notify", "prereg", ""]),
       key=st.from_regex(r"[a-z][a-z_]{0,12}", fullmatch=True), value=junk)
def test_an_unknown_key_anywhere_is_refused_by_name(table: str, key: str, value: Any) -> None:
    data = json.loads(json.dumps(BASE_RUN))
    target = data[table] if table else data
    if key in target:
        return
    target[key] = value
    with tempfile.TemporaryDirectory() as tmp:
        spec = Path(tmp) / "run.toml"
        spec.write_text(tomli_w.dumps(data))
        rc, err = cli("register", str(spec), "--accelerated", "--registry", str(Path(tmp) / "babysit.toml"))
    assert rc == 2 and key in err, err


@FUZZ
@given(data=st.binary(max_size=400))
def test_run_toml_of_random_bytes_exits_2_naming_the_file(data: bytes) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        spec = Path(tmp) / "run.toml"
        spec.write_bytes(data)
        rc, err = cli("register", str(spec), "--registry", str(Path(tmp) / "babysit.toml"))
    assert rc == 2 and "run.toml" in err and "Traceback" not in err, err


BASE_AMENDMENT = {"title": "calibration", "rationale": "units changed", "scale": "12.5087 / 3.4623",
                  "combine": "agree"}


@pytest.fixture(scope="module")
def registered(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("amend")
    data = json.loads(json.dumps(BASE_RUN))
    (root / "run.toml").write_text(tomli_w.dumps(data))
    rc, err = cli("register", str(root / "run.toml"), "--accelerated", "--registry", str(root / "babysit.toml"))
    assert rc == 0, err
    return root


@FUZZ
@given(key=st.sampled_from(sorted(BASE_AMENDMENT)), value=junk)
def test_an_amendment_with_a_wrong_value_records_or_exits_2_naming_the_field(registered: Path, key: str,
                                                                            value: Any) -> None:
    data = {**BASE_AMENDMENT, key: value}
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "amendment.toml"
        path.write_text(tomli_w.dumps(data))
        rc, err = cli("amend", "fuzz_run", str(path), "--registry", str(registered / "babysit.toml"))
    assert rc in (0, 2), err
    if rc == 2:
        assert key in err, err


@FUZZ
@given(daemon_key=st.sampled_from(["state_dir", "channel", "abort_allow_list", "guard_interval_seconds", "bogus"]),
       run_key=st.sampled_from(["name", "spec", "registered_at", "prereg_sha256", "bogus"]), value=junk,
       which=st.booleans())
@example(daemon_key="state_dir", run_key="name", value="x" * 5000, which=True)  # once ENAMETOOLONG from status
@example(daemon_key="state_dir", run_key="spec", value="x" * 5000, which=False)  # and from reading the run's spec
@example(daemon_key="state_dir", run_key="spec", value="~0", which=True)  # no user "0": expanduser raised
@example(daemon_key="state_dir", run_key="spec", value="~0/run.toml", which=False)
def test_a_hand_edited_babysit_toml_is_refused_by_field_never_with_a_traceback(daemon_key: str, run_key: str,
                                                                             value: Any, which: bool) -> None:
    data: dict[str, Any] = {"daemon": {"state_dir": ".babysit", "abort_allow_list": ["U024BE7LH"]},
                            "runs": [{"name": "a", "spec": "a.toml", "registered_at": "2026-08-17T18:41:02Z"}]}
    if which:
        data["daemon"][daemon_key] = value
    else:
        data["runs"][0][run_key] = value
    with tempfile.TemporaryDirectory() as tmp:
        reg = Path(tmp) / "babysit.toml"
        reg.write_text(tomli_w.dumps(data))
        rc, err = cli("status", "--registry", str(reg))
    assert rc in (0, 1, 2), err
    if rc == 2:
        assert (daemon_key if which else run_key) in err, err


def test_the_real_cli_refuses_a_sample_of_bad_files_with_exit_2_and_the_field(tmp_path: Path) -> None:
    cases = [("guards", "gpu_hours_cap", -1, "guards.gpu_hours_cap"), ("poll", "every_minutes", "often",
             "poll.every_minutes"), ("run", "command", "python train.py", "run.command"),
             ("retry", "on", ["oom", "bored"], "retry.on"), ("run", "name", "Bad Name!", "run.name")]
    for table, key, value, named in cases:
        data = json.loads(json.dumps(BASE_RUN))
        data[table][key] = value
        spec = tmp_path / f"{key}.toml"
        spec.write_text(tomli_w.dumps(data))
        res = subprocess.run([sys.executable, "-m", "babysit", "register", str(spec), "--accelerated",
                              "--registry", str(tmp_path / "babysit.toml")], capture_output=True, text=True,
                             timeout=60)
        assert res.returncode == 2 and named in res.stderr and "Traceback" not in res.stderr, res.stderr
    (tmp_path / "junk.toml").write_bytes(b"\x00\xff[[[run")
    res = subprocess.run([sys.executable, "-m", "babysit", "register", str(tmp_path / "junk.toml")],
                         capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert res.returncode == 2 and "junk.toml" in res.stderr and "Traceback" not in res.stderr, res.stderr


# -- train logs ---------------------------------------------------------------------------------------
def record() -> st.SearchStrategy[bytes]:
    value = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(min_value=-(2**70),
                      max_value=2**70), st.text(max_size=5), st.none(), st.booleans(), st.lists(st.integers(),
                      max_size=2))
    good = st.builds(lambda step, ts, loss, extra: json.dumps({"step": step, "ts": ts, "train_loss": loss, **extra},
                                                              allow_nan=True).encode(),
                     st.integers(min_value=-5, max_value=10**6), st.floats(allow_nan=True, allow_infinity=True),
                     value, st.dictionaries(st.text(min_size=1, max_size=5), value, max_size=3))
    wrong = st.builds(lambda d: json.dumps(d, allow_nan=True).encode(),
                      st.dictionaries(st.sampled_from(["step", "ts", "event", "x"]), value, max_size=4))
    return st.one_of(good, wrong, st.binary(max_size=80), st.just(b"x" * 300), st.just(b""),
                     st.just(b'{"step": 1, "ts": 1e400}'), st.just(b"[" * 5000))


@FUZZ
@given(lines=st.lists(record(), max_size=40), cuts=st.lists(st.integers(min_value=0, max_value=4000), max_size=6),
       max_line=st.sampled_from([64, 256, 2**20]))
def test_the_log_reader_never_raises_never_stalls_and_reads_a_bounded_window(lines: list[bytes], cuts: list[int],
                                                                             max_line: int) -> None:
    content = b"\n".join(lines) + b"\n"
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "train_log.jsonl"
        path.write_bytes(b"")
        state = logtail.TailState()
        records: list[LogRecord] = []
        window = 512
        for cut in [*sorted(c % (len(content) + 1) for c in cuts), len(content)]:  # the trainer appends in bursts
            with open(path, "r+b") as f:
                f.seek(0, os.SEEK_END)
                f.write(content[f.tell():max(cut, f.tell())])
            for _ in range(len(content) // window + 3):
                got = logtail.read_new(path, state, max_bytes=window, max_line_bytes=max_line)
                assert got.state.offset - state.offset <= max(window, max_line + 1)
                assert got.partial_bytes <= max(window, max_line + 1)
                state = got.state
                records.extend(got.records)
        assert state.offset == len(content), "a finished file is read to its end"
        for r in records:
            assert isinstance(r.step, int) and math.isfinite(r.ts)
            assert all(math.isfinite(v) for v in r.metrics.values())
        sps = seconds_per_step(records)
        assert sps is None or (sps > 0 and math.isfinite(sps))
        metric_series(records, "train_loss")
