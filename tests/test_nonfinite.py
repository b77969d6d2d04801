"""The watched non-finite metrics: one rule (core/nonfinite.py) that the live guard, the exit
classifier and the framework hooks all apply, honouring the run's `[guards] nonfinite_metrics`."""

from __future__ import annotations

import math
import os
import subprocess
import sys

import pytest

from babysit import integrations
from babysit.core import classify, nonfinite
from babysit.core.records import LogRecord
from babysit.core.spec import GuardsSpec

NAN, INF = math.nan, math.inf
RECORDS = [{"loss": NAN}, {"grad_norm": INF}, {"train/grad_norm": NAN}, {"eval_acc": NAN}, {"lr": INF}]


def guard_sees(values: dict, declared) -> bool:
    return nonfinite.first_bad(values, GuardsSpec(nonfinite_metrics=declared).nonfinite_metrics) is not None


def classifier_sees(values: dict, declared) -> bool:
    record = LogRecord(3, 1.0, {}, None, values)
    got = classify.classify_exit(exit_code=1, signal=None, stderr_tail="", last_records=[record], rules=(),
                                 stop_requested=False, nonfinite_metrics=declared)
    return got.outcome == "diverged"


def hook_sees(values: dict, declared, monkeypatch) -> bool:
    if declared is None:
        monkeypatch.delenv(nonfinite.ENV, raising=False)
    else:
        monkeypatch.setenv(nonfinite.ENV, nonfinite.to_env(declared))
    return bool(integrations.nonfinite_watched(values))


@pytest.mark.parametrize("declared", [None, ("eval_acc",), ("train/grad_norm", "loss")])
@pytest.mark.parametrize("values", RECORDS, ids=lambda v: next(iter(v)))
def test_guard_classifier_and_hooks_watch_the_same_metrics(values, declared, monkeypatch):
    expected = any(nonfinite.watched(k, declared) for k in values)
    assert guard_sees(values, declared) == classifier_sees(values, declared) == \
        hook_sees(values, declared, monkeypatch) == expected


def test_the_default_rule_is_every_loss_and_grad_norm_and_a_declaration_is_exact():
    assert [nonfinite.watched(k, None) for k in ("loss", "eval_loss", "Train/Grad_Norm", "lr", "acc")] == \
        [True, True, True, False, False]
    assert nonfinite.watched("eval_loss", ("eval_loss",)) and not nonfinite.watched("train_loss", ("eval_loss",))
    assert nonfinite.watched("x", ()) is False  # an empty declaration watches nothing


def test_the_daemon_hands_the_declaration_to_the_trainer_and_a_bad_value_falls_back():
    assert nonfinite.from_env(nonfinite.to_env(["a/b", "c"])) == ("a/b", "c")
    assert nonfinite.to_env(None) is None
    assert nonfinite.from_env(None) is None and nonfinite.from_env("not json") is None
    assert nonfinite.from_env('{"a": 1}') is None and nonfinite.from_env("[1]") is None


def test_a_hook_in_a_trainer_process_follows_the_runs_declaration():
    """A real child process with the environment the supervisor gives an attempt."""
    code = ("import math; from babysit import integrations as i; "
            "print(sorted(i.nonfinite_watched({'grad_norm': math.nan, 'eval_acc': math.inf})))")
    env = {**os.environ, nonfinite.ENV: nonfinite.to_env(["eval_acc"])}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "['eval_acc']"
    env.pop(nonfinite.ENV)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "['grad_norm']"
