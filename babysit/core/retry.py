"""Retry policy and attempt argv: pure functions over the attempt history and the RunSpec.

Resource selection is kept apart from method-stability attempts (docs/guards.md, Retries):
attempt k runs `spec.profile_for(k)`, whatever failed before; the failure only decides *whether*
there is an attempt k. The one thing a failure changes besides that is the declared
`[machinery]` knobs (loader workers, prefetch), halved after host-memory pressure, because they
are declared not to touch the training math.

A `gpu-fault` or a `node-lost` (the machine's fault, never the method's) has its own budget: `[retry]
gpu_fault_max` retries, which do not count against `max_attempts`; the supervisor quarantines the faulty
GPU and relaunches on healthy ones (a run with `gpus = "any N"` or spare GPUs) or waits for it; a lost
node is quarantined and left out of the next submissions. A `time-limit` or `preempted` attempt (the
scheduler's own end) is continued in a new one from its checkpoint, whatever `retry.on` says, at no cost.

Never retried: a diverged attempt whose next profile is the same one (no [[attempts]] declared: the
identical command diverges the same way), a completed attempt, a stop on request, a guard stop (gpu-held, gpu-hours-cap,
abort), an outcome outside `[retry].on` unless a `[[classify]]` rule said retry = true, and any
outcome a rule marked retry = false.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from babysit.core.spec.run_toml import AttemptProfile, RunSpec
from babysit.core.status import CHAINED_OUTCOMES, MACHINE_FAULTS, Outcome

_INT = re.compile(r"[+-]?\d+")
# Stops that are never retried: the reason is outside the run (a foreign GPU holder, the budget, a person).
# stalled, diverged and gpu-fault stops keep their class and follow retry.on.
GUARD_STOPS = ("gpu-held", "gpu-hours-cap", "abort")


def is_guard_stop(stopped_by: str | None) -> bool:
    """Whether the stop that decided an attempt's outcome is one that is never retried."""
    return stopped_by in GUARD_STOPS


@dataclass(frozen=True)
class PastAttempt:
    n: int
    profile: str
    outcome: str
    retry_override: bool | None = None  # ExitClass.retry
    guard_stop: bool = False  # stopped by a guard or an abort: gpu-held, gpu-hours-cap, abort
    host_memory_pressure: bool = False  # a host-memory-pressure incident was raised in this attempt
    halved_knobs: int = 0  # how many halvings this attempt's argv already carried


@dataclass(frozen=True)
class RetryDecision:
    retry: bool
    reason: str
    n: int | None  # the next attempt's number, when retry
    profile: AttemptProfile | None
    resume: bool
    halve_machinery: bool
    halvings: int = 0  # total halvings for the next attempt's argv (pass to build_argv)


def next_attempt(history: Sequence[PastAttempt], spec: RunSpec, after: int = 0) -> RetryDecision:
    """What to do after the newest attempt in `history` ended. An empty history means: launch attempt 1.

    `after`: the run was relaunched after attempt `after` (`babysit relaunch`): the attempts up to it are
    another sequence's. Attempt numbers go on (after+1, after+2, …) while profiles and `max_attempts`
    count from the relaunch, as for a new run: its attempt after+k uses `profile_for(k)`, and the last one
    allowed is after+max_attempts."""
    history = [a for a in history if a.n > after]
    if not history:
        return RetryDecision(True, "first attempt", after + 1, spec.profile_for(1), False, False, 0)
    last = max(history, key=lambda a: a.n)

    def no(reason: str) -> RetryDecision:
        return RetryDecision(False, reason, None, None, False, False, last.halved_knobs)

    if last.outcome == Outcome.COMPLETED:
        return no(f"attempt {last.n} completed")
    if last.guard_stop:
        return no(f"attempt {last.n} was stopped by a guard ({last.outcome}): a guard stop is never retried")
    if last.outcome == Outcome.STOPPED:
        return no(f"attempt {last.n} was stopped on request")
    if last.retry_override is False:
        return no(f"a [[classify]] rule marked {last.outcome} as not retryable")
    if last.outcome in CHAINED_OUTCOMES:  # one run across jobs: the next link resumes, whatever retry.on says
        n = last.n + 1
        why = "reached its scheduler time limit" if last.outcome == Outcome.TIME_LIMIT else \
            "was preempted by the scheduler, not by a fault of the trainer's"
        return RetryDecision(True, f"attempt {last.n} {why}: continued as attempt {n}, "
                             "resuming from the latest checkpoint", n, spec.profile_for(n - after), True, False,
                             last.halved_knobs)
    on = spec.retry.on
    if last.retry_override is not True and last.outcome not in on:
        return no(f"{last.outcome} is not in retry.on ({', '.join(on) or 'empty'})")
    faults = sum(1 for a in history if a.outcome in MACHINE_FAULTS)
    if last.outcome in MACHINE_FAULTS and faults > spec.retry.gpu_fault_max:
        return no(f"attempt {last.n} ended {last.outcome}, the {_nth(faults)} machine fault: no {last.outcome} "
                  f"retries left (retry.gpu_fault_max = {spec.retry.gpu_fault_max})")
    links = sum(1 for a in history if a.outcome in CHAINED_OUTCOMES)
    most = after + spec.retry.max_attempts + faults + links  # a machine fault, a time limit: no attempt lost
    if last.outcome not in MACHINE_FAULTS and last.n >= most:
        return no(f"attempt {last.n} of {most} failed ({last.outcome}): no attempts left")
    n = last.n + 1
    if last.outcome == Outcome.DIVERGED and spec.profile_for(n - after) == spec.profile_for(last.n - after):
        same = "no [[attempts]] are declared" if not spec.attempts else \
            f"the next profile is {spec.profile_for(n - after).profile} again"
        return no(f"attempt {last.n} diverged and {same}: a retry would run the identical command, which diverges "
                  "the same way; declare [[attempts]] with another profile (a lower learning rate, fp32) to retry it")
    halve = last.host_memory_pressure and bool(spec.machinery_knobs)
    halvings = last.halved_knobs + (1 if halve else 0)
    resume = spec.retry.resume == "latest-checkpoint"
    why = "a [[classify]] rule said retry" if last.retry_override else f"{last.outcome} is in retry.on"
    profile = spec.profile_for(n - after)
    of = (f"{last.outcome} retry {faults} of {spec.retry.gpu_fault_max}" if last.outcome in MACHINE_FAULTS
          else f"attempt {n} of {most}")
    reason = (f"attempt {last.n} ended {last.outcome} ({why}): {of}, "
              f"profile {profile.profile}" + (", resuming from the latest checkpoint" if resume else ", fresh")
              + (", [machinery] knobs halved after host-memory pressure" if halve else ""))
    return RetryDecision(True, reason, n, profile, resume, halve, halvings)


def build_argv(spec: RunSpec, n: int, *, resume: bool, halvings: int, after: int = 0) -> tuple[list[str], dict]:
    """The argv of attempt n: command + profile args (+ resume args), knobs halved `halvings` times; `after`:
    the attempt the run was relaunched after (its profile is `profile_for(n - after)`, see next_attempt).

    Placeholders `{name}` and `{attempt}` are replaced in every item (plain replacement: other braces,
    e.g. JSON in an argument, stay as written). Knobs are matched as "--flag N" and "--flag=N"; a
    knob absent from the argv, or with a non-integer value, is left alone and reported in notes.
    `notes` maps "halved" / "absent" / "not_integer" to one readable line each, only when non-empty
    (e.g. {"halved": "machinery knobs halved after host-memory pressure: --num-workers 8 → 4"}).
    """
    profile = spec.profile_for(n - after)
    argv = [*spec.command, *profile.args, *(spec.retry.resume_args if resume else ())]
    argv = [a.replace("{name}", spec.name).replace("{attempt}", str(n)) for a in argv]
    found_notes: dict[str, list[str]] = {"halved": [], "absent": [], "not_integer": []}
    if halvings > 0:
        _halve_knobs(argv, spec.machinery_knobs, 2**halvings, found_notes)
    notes: dict[str, str] = {}  # one readable line per kind, only those that happened (for the launch post)
    if found_notes["halved"]:
        notes["halved"] = "machinery knobs halved after host-memory pressure: " + ", ".join(found_notes["halved"])
    if found_notes["absent"]:
        notes["absent"] = ("machinery knobs not in the command, left alone: " + ", ".join(found_notes["absent"]))
    if found_notes["not_integer"]:
        notes["not_integer"] = "machinery knobs with a non-integer value, left alone: " + ", ".join(
            found_notes["not_integer"])
    return argv, notes


def rerun_argv(spec: RunSpec, argv: Sequence[str], n: int) -> tuple[str, ...]:
    """What attempt n runs when its scheduler reruns it in place (a Slurm requeue: same job, same attempt):
    its argv with the resume args, as a retry would resume; () where the run does not resume from a
    checkpoint, or the argv resumes already."""
    if spec.retry.resume != "latest-checkpoint" or not spec.retry.resume_args:
        return ()
    extra = [a.replace("{name}", spec.name).replace("{attempt}", str(n)) for a in spec.retry.resume_args]
    if list(argv[len(argv) - len(extra):]) == extra:
        return ()
    return (*argv, *extra)


def _halve_knobs(argv: list[str], knobs: Sequence[str], factor: int, notes: dict[str, list[str]]) -> None:
    """Halve every occurrence of each knob in place, in both "--flag N" and "--flag=N" forms."""
    for knob in knobs:
        found = False
        for i, item in enumerate(argv):
            if item == knob and i + 1 < len(argv):
                found = True
                new = _halve(argv[i + 1], factor)
                if new is None:
                    notes["not_integer"].append(f"{knob} {argv[i + 1]}")
                    continue
                notes["halved"].append(f"{knob} {argv[i + 1]} → {new}")
                argv[i + 1] = new
            elif item.startswith(knob + "="):
                found = True
                value = item[len(knob) + 1:]
                new = _halve(value, factor)
                if new is None:
                    notes["not_integer"].append(item)
                    continue
                notes["halved"].append(f"{knob}={value} → {new}")
                argv[i] = f"{knob}={new}"
        if not found:
            notes["absent"].append(knob)


def _halve(value: str, factor: int) -> str | None:
    """`value` divided by `factor`, at least 1; a value already <= 1 (0 workers) is kept as is."""
    if not _INT.fullmatch(value.strip()):
        return None
    number = int(value)
    if number <= 1:
        return str(number)
    return str(max(1, number // factor))


def _nth(k: int) -> str:
    return {1: "1st", 2: "2nd", 3: "3rd"}.get(k, f"{k}th")
