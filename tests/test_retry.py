"""Retry policy and attempt argv as tables: never after guard stops, profiles per attempt, knob halving."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from babysit.core.retry import PastAttempt, build_argv, next_attempt
from babysit.core.spec.run_toml import AttemptProfile, RetrySpec, RunSpec

SPEC = RunSpec(
    name="grasp_disc",
    command=("python", "-m", "trainer", "--num-workers", "8", "--prefetch-factor=4", "--out", "outputs/{name}"),
    log=Path("/tmp/log.jsonl"), spec_file=Path("/tmp/run.toml"), workdir=Path("/tmp"), checkpoints=Path("/tmp/c"),
    retry=RetrySpec(max_attempts=3, on=("oom", "diverged")),
    attempts=(AttemptProfile("smoke-validated", ("--batch-size", "2", "--grad-accum", "8")),
              AttemptProfile("fallback-bs1-gc", ("--batch-size", "1", "--grad-accum", "16", "--grad-checkpointing"))),
    machinery_knobs=("--num-workers", "--prefetch-factor"),
)


def past(n=1, outcome="oom", **kw) -> PastAttempt:
    return PastAttempt(n=n, profile=SPEC.profile_for(n).profile, outcome=outcome, **kw)


@pytest.mark.parametrize(("history", "retry", "n", "profile", "reason_has"), [
    pytest.param([], True, 1, "smoke-validated", "first attempt", id="first"),
    pytest.param([past(1, "oom")], True, 2, "fallback-bs1-gc", "oom is in retry.on", id="oom-retries"),
    pytest.param([past(1, "diverged")], True, 2, "fallback-bs1-gc", "diverged", id="diverged-retries"),
    pytest.param([past(1, "oom"), past(2, "oom")], True, 3, "fallback-bs1-gc", "attempt 3 of 3",
                 id="last-profile-repeats"),
    pytest.param([past(1), past(2), past(3)], False, None, None, "no attempts left", id="max-attempts"),
    pytest.param([past(1, "completed")], False, None, None, "completed", id="never-after-completed"),
    pytest.param([past(1, "stopped")], False, None, None, "stopped on request", id="never-after-stop"),
    pytest.param([past(1, "stopped", guard_stop=True)], False, None, None, "guard", id="never-after-gpu-held"),
    pytest.param([past(1, "oom", guard_stop=True)], False, None, None, "guard", id="guard-stop-beats-retry-on"),
    pytest.param([past(1, "stalled", guard_stop=True, retry_override=True)], False, None, None, "guard",
                 id="guard-stop-beats-rule"),
    pytest.param([past(1, "crashed")], False, None, None, "not in retry.on", id="crashed-not-in-on"),
    pytest.param([past(1, "crashed", retry_override=True)], True, 2, "fallback-bs1-gc", "rule said retry",
                 id="rule-says-retry"),
    pytest.param([past(1, "oom", retry_override=False)], False, None, None, "not retryable", id="rule-forbids"),
    pytest.param([past(2, "oom"), past(1, "oom")], True, 3, "fallback-bs1-gc", "", id="history-order-free"),
])
def test_next_attempt(history, retry, n, profile, reason_has):
    d = next_attempt(history, SPEC)
    assert (d.retry, d.n, d.profile.profile if d.profile else None) == (retry, n, profile)
    assert reason_has in d.reason


def test_a_diverged_run_is_not_retried_with_the_identical_command():
    """No [[attempts]]: the next attempt would be the same command, which diverges the same way; an OOM
    or a crash still retries as declared (its cause may be the machine's)."""
    plain = replace(SPEC, attempts=(), retry=replace(SPEC.retry, on=("oom", "diverged", "crashed")))
    d = next_attempt([past(1, "diverged")], plain)
    assert not d.retry and "no [[attempts]] are declared" in d.reason and "identical command" in d.reason
    assert next_attempt([past(1, "oom")], plain).retry and next_attempt([past(1, "crashed")], plain).retry
    again = next_attempt([past(1, "oom"), past(2, "diverged")], SPEC)  # profile 3 is profile 2 again
    assert not again.retry and "fallback-bs1-gc again" in again.reason


@pytest.mark.parametrize(("resume", "expected"), [("fresh", False), ("latest-checkpoint", True)])
def test_resume_follows_the_spec(resume, expected):
    spec = replace(SPEC, retry=replace(SPEC.retry, resume=resume))
    assert next_attempt([past(1)], spec).resume is expected


@pytest.mark.parametrize(("attempt", "knobs", "halve", "halvings"), [
    (past(1, host_memory_pressure=True), SPEC.machinery_knobs, True, 1),
    (past(2, host_memory_pressure=True, halved_knobs=1), SPEC.machinery_knobs, True, 2),
    (past(1, host_memory_pressure=False), SPEC.machinery_knobs, False, 0),
    (past(2, host_memory_pressure=False, halved_knobs=1), SPEC.machinery_knobs, False, 1),
    (past(1, host_memory_pressure=True), (), False, 0),  # nothing declared: nothing to rescale
])
def test_machinery_halving_after_host_memory_pressure(attempt, knobs, halve, halvings):
    d = next_attempt([attempt], replace(SPEC, machinery_knobs=knobs))
    assert (d.halve_machinery, d.halvings) == (halve, halvings)


def test_argv_profile_args_and_name_expansion():
    argv, notes = build_argv(SPEC, 1, resume=False, halvings=0)
    assert argv == ["python", "-m", "trainer", "--num-workers", "8", "--prefetch-factor=4", "--out",
                    "outputs/grasp_disc", "--batch-size", "2", "--grad-accum", "8"]
    assert notes == {}


def test_argv_resume_args_appended():
    argv, _ = build_argv(SPEC, 2, resume=True, halvings=0)
    assert argv[-2:] == ["--resume", "latest"]
    assert "--grad-checkpointing" in argv


@pytest.mark.parametrize(("halvings", "workers", "prefetch"), [(1, "4", "2"), (2, "2", "1"), (5, "1", "1")])
def test_knobs_halved_in_both_flag_forms(halvings, workers, prefetch):
    argv, notes = build_argv(SPEC, 2, resume=False, halvings=halvings)
    assert argv[argv.index("--num-workers") + 1] == workers
    assert f"--prefetch-factor={prefetch}" in argv
    assert f"--num-workers 8 → {workers}" in notes["halved"]
    assert f"--prefetch-factor=4 → {prefetch}" in notes["halved"]


def test_training_math_args_are_never_halved():
    argv, _ = build_argv(SPEC, 1, resume=False, halvings=3)
    assert argv[argv.index("--batch-size") + 1] == "2" and argv[argv.index("--grad-accum") + 1] == "8"


@pytest.mark.parametrize(("command", "expected_argv_tail", "note_key", "note_has"), [
    (("t", "--prefetch-factor", "4"), ["--prefetch-factor", "2"], "absent", "--num-workers"),
    (("t", "--num-workers", "auto", "--prefetch-factor", "4"), ["--num-workers", "auto", "--prefetch-factor", "2"],
     "not_integer", "--num-workers auto"),
    (("t", "--num-workers", "0", "--prefetch-factor=4"), ["--num-workers", "0", "--prefetch-factor=2"], "halved",
     "--num-workers 0 → 0"),
    (("t", "--num-workers=8", "--num-workers", "6", "--prefetch-factor=4"),
     ["--num-workers=4", "--num-workers", "3", "--prefetch-factor=2"], "halved", "--num-workers 6 → 3"),
])
def test_knob_edge_cases(command, expected_argv_tail, note_key, note_has):
    spec = replace(SPEC, command=command, attempts=())
    argv, notes = build_argv(spec, 1, resume=False, halvings=1)
    assert argv[1:] == expected_argv_tail
    assert note_has in notes[note_key]


def test_notes_are_readable_lines_only_when_something_happened():
    _, notes = build_argv(SPEC, 2, resume=False, halvings=1)
    assert set(notes) == {"halved"} and all(isinstance(v, str) for v in notes.values())


def test_attempt_placeholder_and_literal_braces():
    spec = replace(SPEC, command=("t", "--out", "o/{name}/a{attempt}", "--json", '{"k": 1}'), attempts=())
    argv, _ = build_argv(spec, 3, resume=False, halvings=0)
    assert argv == ["t", "--out", "o/grasp_disc/a3", "--json", '{"k": 1}']


def test_a_relaunched_run_starts_a_new_sequence_its_numbers_going_on():
    """After `babysit relaunch` (after attempt 3): attempt 4 is the sequence's first (its profile, a fresh
    retry budget); the earlier attempts neither use up max_attempts nor stop the retry."""
    before = [past(1), past(2), past(3, "crashed")]
    first = next_attempt(before, SPEC, after=3)
    assert (first.retry, first.n, first.profile.profile) == (True, 4, "smoke-validated")
    oom = next_attempt([*before, PastAttempt(4, "smoke-validated", "oom")], SPEC, after=3)
    assert (oom.retry, oom.n, oom.profile.profile) == (True, 5, "fallback-bs1-gc")
    assert "attempt 5 of 6" in oom.reason
    spent = next_attempt([*before, *(PastAttempt(n, "x", "oom") for n in (4, 5, 6))], SPEC, after=3)
    assert not spent.retry and "attempt 6 of 6" in spent.reason
    assert build_argv(SPEC, 4, resume=False, halvings=0, after=3)[0][-4:] == ["--batch-size", "2", "--grad-accum", "8"]
    assert build_argv(SPEC, 4, resume=False, halvings=0)[0][-1] == "--grad-checkpointing", "without after: profile 2"


GPU_SPEC = replace(SPEC, retry=RetrySpec(max_attempts=2, on=("oom", "gpu-fault"), gpu_fault_max=2))


@pytest.mark.parametrize(("history", "retry", "reason_has"), [
    pytest.param([past(1, "gpu-fault")], True, "gpu-fault retry 1 of 2", id="gpu-fault-retries"),
    pytest.param([past(1, "oom"), past(2, "gpu-fault")], True, "gpu-fault retry 1 of 2",
                 id="a-machine-fault-costs-the-method-no-attempt"),
    pytest.param([past(1, "gpu-fault"), past(2, "oom")], True, "attempt 3 of 3",
                 id="the-method-keeps-its-attempts-after-a-machine-fault"),
    pytest.param([past(1, "gpu-fault"), past(2, "oom"), past(3, "oom")], False, "no attempts left",
                 id="then-max-attempts"),
    pytest.param([past(1, "gpu-fault"), past(2, "gpu-fault"), past(3, "gpu-fault")], False,
                 "no gpu-fault retries left (retry.gpu_fault_max = 2)", id="gpu-fault-max"),
])
def test_gpu_fault_has_its_own_budget(history, retry, reason_has):
    d = next_attempt(history, GPU_SPEC)
    assert d.retry is retry and reason_has in d.reason


def test_gpu_fault_is_not_retried_unless_in_retry_on():
    d = next_attempt([past(1, "gpu-fault")], SPEC)
    assert d.retry is False and "not in retry.on" in d.reason
