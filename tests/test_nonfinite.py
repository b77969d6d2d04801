"""The watched non-finite metrics: one rule (core/reading/nonfinite.py) that the live guard, the exit
classifier and the framework hooks all apply, honouring the run's `[guards] nonfinite_metrics`."""

from __future__ import annotations

import math
import os
import subprocess
import sys

import pytest

from babysit import integrations
from babysit.core import classify
from babysit.core.reading import nonfinite
from babysit.core.reading.log_records import LogRecord
from babysit.core.spec.run_toml import GuardsSpec

NAN, INF = math.nan, math.inf
RECORDS = [{"loss": NAN}, {"grad_norm": INF}, {"train/grad_norm": NAN}, {"eval_acc": NAN}, {"lr": INF}]


def guard_sees(records: list[dict], declared) -> bool:
    pending: frozenset[str] = frozenset()
    for values in records:  # what the supervisor does record after record
        bad, pending = nonfinite.divergence(values, GuardsSpec(nonfinite_metrics=declared).nonfinite_metrics, pending)
        if bad:
            return True
    return False


def classifier_sees(records: list[dict], declared) -> bool:
    got = classify.classify_exit(classify.ExitFacts(exit_code=1, signal=None, stderr_tail="",
                                 last_records=[LogRecord(i, 1.0, {}, None, v) for i, v in enumerate(records)],
                                 rules=(), stop_requested=False, nonfinite_metrics=declared))
    return got.outcome == "diverged"


def hook_sees(records: list[dict], declared, monkeypatch) -> bool:
    if declared is None:
        monkeypatch.delenv(nonfinite.ENV, raising=False)
    else:
        monkeypatch.setenv(nonfinite.ENV, nonfinite.to_env(declared))
    watch = integrations.NonfiniteWatch()
    return any([bool(watch.check(values)) for values in records])


ONCE = [[v, {"step_time": 1.0}] for v in RECORDS]  # each bad value once, then a record without it
FINITE_AFTER = [[v, {k: 1.0 for k in v}] for v in RECORDS]  # each bad value once, then finite again
TWICE = [[v, {"eval_acc": 0.5}, dict(v)] for v in RECORDS]  # twice in the records that carry it


@pytest.mark.parametrize("declared", [None, ("eval_acc",), ("train/grad_norm", "loss")])
@pytest.mark.parametrize("records", ONCE + FINITE_AFTER + TWICE, ids=lambda r: f"{next(iter(r[0]))}x{len(r)}")
def test_guard_classifier_and_hooks_watch_the_same_metrics(records, declared, monkeypatch):
    name = next(iter(records[0]))
    twice = sum(name in r and not math.isfinite(r[name]) for r in records) == 2
    expected = nonfinite.watched(name, declared) and (twice or not nonfinite.skip_tolerant(name, declared))
    assert guard_sees(records, declared) == classifier_sees(records, declared) == \
        hook_sees(records, declared, monkeypatch) == expected


def test_an_fp16_skipped_step_is_not_divergence_but_a_grad_norm_that_stays_nan_is():
    """A loss scaler skips a step whose gradients overflowed (its grad norm is inf) and goes on; a run
    whose weights went NaN logs a NaN grad norm at every log after. A declared grad norm counts at once."""
    skipped = [{"loss": 2.1, "grad_norm": INF}, {"loss": 2.09, "grad_norm": 0.8}, {"eval_loss": 2.2},
               {"loss": 2.08, "grad_norm": INF}, {"eval_loss": 2.1}, {"loss": 2.07, "grad_norm": 0.9}]
    assert not guard_sees(skipped, None) and not classifier_sees(skipped, None)
    stays = [{"loss": 2.1, "grad_norm": NAN}, {"eval_loss": 2.2}, {"loss": 2.1, "grad_norm": NAN}]
    assert guard_sees(stays, None) and classifier_sees(stays, None)
    assert guard_sees(stays[:1], ("grad_norm",)) and classifier_sees(stays[:1], ("grad_norm",))
    assert nonfinite.divergence(stays[0], None) == ({}, frozenset({"grad_norm"}))  # pending, said nowhere yet
    assert nonfinite.divergence(stays[1], None, frozenset({"grad_norm"})) == ({}, frozenset({"grad_norm"}))
    bad, pending = nonfinite.divergence(stays[2], None, frozenset({"grad_norm"}))
    assert list(bad) == ["grad_norm"] and math.isnan(bad["grad_norm"]) and pending == {"grad_norm"}


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
    code = ("import math; from babysit import integrations as i; w = i.NonfiniteWatch(); "
            "bad = {**w.check({'grad_norm': math.nan, 'eval_acc': math.inf}), **w.check({'grad_norm': math.nan})}; "
            "print(sorted(bad))")
    env = {**os.environ, nonfinite.ENV: nonfinite.to_env(["eval_acc"])}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "['eval_acc']"
    env.pop(nonfinite.ENV)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "['grad_norm']"
