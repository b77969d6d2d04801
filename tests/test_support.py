"""The shared test helpers (tests/support.py): a built run.toml is the spec babysit loads, a timed-out wait
says what it waited for and what it last saw."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from babysit.core.spec.run_toml import load_spec
from babysit.core.spec.tomlfile import tomllib
from babysit.runtime import registry
from tests.support import SHOWN_CHARS, TRAIN_LOG, register, run_toml, stdout_source, wait_for


def test_a_built_run_toml_loads_as_the_spec_it_describes(tmp_path: Path) -> None:
    text = run_toml("r", ["python", "-c", 'print("a \\"quoted\\" arg")'], log=TRAIN_LOG, gpus=[0, 1],
                    env={"MODE": "x"}, run={"total_steps": 200},
                    source=stdout_source(r"iter (?P<step>\d+): loss (?P<loss>\S+)"),
                    guards={"min_free_host_ram_gib": 0.1, "stall_minutes": 3}, poll=(1, 3),
                    retry={"max_attempts": 2, "on": ["diverged"]}, attempts={"hot": ["--lr", "4"], "cool": []},
                    prereg={"question": "q", "metric": "loss", "baseline_step": 50, "read_step": 100,
                            "bands": [{"label": "FALLS", "max": 0.0}], "otherwise": {"label": "FLAT"}},
                    tables={"notify": {"channel": "C0RUNS"}})
    (tmp_path / "r.toml").write_text(text)
    spec = load_spec(tmp_path / "r.toml")
    assert spec.command == ("python", "-c", 'print("a \\"quoted\\" arg")')
    assert spec.log == tmp_path / "outputs" / "r" / "train_log.jsonl" and spec.gpus == (0, 1)
    assert dict(spec.env) == {"MODE": "x"} and spec.total_steps == 200
    assert spec.source.kind == "stdout" and spec.source.patterns[0].regex == r"iter (?P<step>\d+): loss (?P<loss>\S+)"
    assert (spec.guards.min_free_host_ram_gib, spec.guards.stall_minutes) == (0.1, 3)
    assert (spec.poll.first_after_minutes, spec.poll.every_minutes) == (1, 3)
    assert spec.retry.max_attempts == 2 and spec.retry.on == ("diverged",)
    assert [(a.profile, a.args) for a in spec.attempts] == [("hot", ("--lr", "4")), ("cool", ())]
    assert spec.prereg is not None and spec.prereg.labels == ("FALLS", "FLAT")
    assert spec.notify.channel == "C0RUNS"


def test_a_built_run_toml_writes_only_the_tables_it_was_given() -> None:
    assert tomllib.loads(run_toml("r", ["true"])) == {"run": {"name": "r", "command": ["true"]}}
    assert tomllib.loads(run_toml("r", ["true"], poll=(60, 60)))["poll"] == {"first_after_minutes": 60,
                                                                            "every_minutes": 60}


def test_register_writes_a_text_spec_under_its_run_name_and_adds_the_run(tmp_path: Path) -> None:
    spec = register(tmp_path, run_toml("r", ["python", "-c", "pass"], log="r.jsonl"))
    assert spec == tmp_path / "r.toml"
    assert [r.name for r in registry.load(tmp_path / "babysit.toml").runs] == ["r"]
    with pytest.raises(AssertionError, match=r"babysit register bad\.toml failed:\n\nERROR: .*run\.command"):
        register(tmp_path, '[run]\nname = "bad"\ncommand = []\n')


def test_wait_for_returns_the_first_truthy_answer() -> None:
    answers = iter([0, None, "", "ready", "later"])
    assert wait_for("a truthy answer", lambda: next(answers), timeout=10, every=0) == "ready"


class Screen:
    """A falsy answer with a long repr: what a terminal that has not shown the awaited line yet answers."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __bool__(self) -> bool:
        return False

    def __repr__(self) -> str:
        return self.text


def test_a_wait_that_times_out_names_what_it_awaited_and_the_last_value_seen() -> None:
    looks = itertools.count()
    with pytest.raises(AssertionError) as failed:
        wait_for("the log's 3rd record", lambda: [] if next(looks) < 3 else {}, timeout=0.05, every=0.01)
    assert str(failed.value) == "timed out after 0.05s waiting for the log's 3rd record; last seen: {}"
    with pytest.raises(AssertionError) as failed:
        wait_for("the prompt", lambda: Screen("a" * 3000 + "$ "), timeout=0, every=0)
    assert str(failed.value).endswith("waiting for the prompt; last seen: …" + "a" * (SHOWN_CHARS - 2) + "$ ")
