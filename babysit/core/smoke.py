"""Smoke runs: their evidence, the profile selection, and attempt 1's profile (issue 7; docs/smoke.md).

Pure: every function here takes what the shell (`babysit/commands/smoke.py`) measured and returns
frozen values; nothing here starts a process, reads a clock or touches NVML.

Blindness is structural. A smoke log is split by `drop_eval` before anything else sees it: records
carrying any key that starts with "eval" are dropped and only *counted*. `TrainOnlyLog`,
`TrainEvidence` and `ProfileEvidence` have no field that could hold an eval value, so the selector
(`select_profile`) cannot be influenced by one even by accident — a hardware profile chosen by a
metric it was meant to be blind to would make every later verdict suspect.

`selected_profile` / `attempt_spec` are what the daemon asks at launch: when a smoke run recorded
its selection in the store, attempt 1 runs that profile instead of `spec.profile_for(1)`.
"""

from __future__ import annotations

import os
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from babysit.core import retry
from babysit.core.classify import ExitClass
from babysit.core.errors import BadInput
from babysit.core.reading import tails
from babysit.core.reading.log_records import LogRecord
from babysit.core.spec.run_toml import AttemptProfile, RunSpec

EVAL_PREFIX = "eval"
STDERR_LINES = 20
OK = "ok"


# -- the log, eval dropped first ---------------------------------------------------------------------

@dataclass(frozen=True)
class TrainOnlyLog:
    """A smoke log with its eval records removed: the only trace of them is how many there were."""

    records: tuple[LogRecord, ...]
    eval_records_dropped: int
    garbage_lines: int = 0


@dataclass(frozen=True)
class TrainEvidence:
    """What a smoke log says about memory and speed, from train records only (no eval field by design)."""

    train_records: int
    eval_records_dropped: int
    garbage_lines: int
    last_step: int | None
    max_memory_allocated_gib: float | None  # the framework's peak (CUDA runs)
    peak_rss_gib: float | None  # the trainer's own ru_maxrss (CPU memory)
    median_step_time_s: float | None


def is_eval_record(record: LogRecord) -> bool:
    """Any key, numeric or not, that starts with "eval" (eval_chunk_mae, eval/<dataset>, eval_every…)."""
    keys = (*record.metrics.keys(), *record.fields.keys())
    return any(k.startswith(EVAL_PREFIX) for k in keys)


def drop_eval(records: Iterable[LogRecord], garbage_lines: int = 0) -> TrainOnlyLog:
    """Split a smoke log: train records kept in order, eval records counted and dropped."""
    kept: list[LogRecord] = []
    dropped = 0
    for record in records:
        if is_eval_record(record):
            dropped += 1
        else:
            kept.append(record)
    return TrainOnlyLog(tuple(kept), dropped, garbage_lines)


def train_evidence(log: TrainOnlyLog) -> TrainEvidence:
    """Peak memory and the median step time of a (train-only) smoke log."""
    def peak(key: str) -> float | None:
        values = [r.metrics[key] for r in log.records if key in r.metrics]
        return max(values) if values else None

    times = [r.metrics["step_time_s"] for r in log.records if "step_time_s" in r.metrics]
    steps = [r.step for r in log.records if "train_loss" in r.metrics]
    return TrainEvidence(
        train_records=len(log.records), eval_records_dropped=log.eval_records_dropped,
        garbage_lines=log.garbage_lines, last_step=max(steps) if steps else None,
        max_memory_allocated_gib=peak("max_memory_allocated_gib"), peak_rss_gib=peak("peak_rss_gib"),
        median_step_time_s=statistics.median(times) if times else None)


# -- one profile's evidence ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Sampled:
    """Sampled while the smoke run ran (probes): NVML memory of the run's process tree, and its RSS.

    None means "not measured" (no GPU, or the tree's pids were not in NVML's list), never zero.
    """

    samples: int = 0
    nvml_process_peak_bytes: int | None = None  # max over samples of the tree's summed used_memory_bytes
    nvml_device_peak_bytes: int | None = None  # max over samples of the run's GPUs' memory used (whole device)
    rss_peak_bytes: int | None = None  # max over samples of the tree's summed RSS


@dataclass(frozen=True)
class ProfileEvidence:
    profile: str
    args: tuple[str, ...]
    argv: tuple[str, ...]
    outcome: str  # ok | oom | crashed | diverged | gpu-fault | stalled | timeout
    summary: str
    exit_code: int | None
    signal: int | None
    wall_s: float
    steps_requested: int
    train: TrainEvidence
    sampled: Sampled
    failed_alloc_bytes: int | None
    in_use_bytes: int | None
    stderr_tail: tuple[str, ...]
    smoke_dir: str


def profile_evidence(*, profile: AttemptProfile, argv: Sequence[str], cls: ExitClass, timed_out: bool,
                     wall_s: float, steps: int, train: TrainEvidence, sampled: Sampled,
                     smoke_dir: str) -> ProfileEvidence:
    """One tried profile: the classifier's verdict on its exit, plus what was measured.

    A completed smoke is "ok"; a smoke killed at its timeout is "timeout" (not selectable: it did not
    show that the profile finishes N steps), whatever the classifier made of the kill.
    """
    detail = cls.detail
    if timed_out:
        outcome, summary = "timeout", f"timeout: killed after {wall_s:.0f} s before completing {steps} steps"
    elif cls.outcome == "completed":
        outcome, summary = OK, f"completed {steps} steps"
    else:
        outcome, summary = cls.outcome, cls.summary
    tail = tails.collapse(str(detail.get("stderr_tail") or ""))[-STDERR_LINES:]
    return ProfileEvidence(
        profile=profile.profile, args=tuple(profile.args), argv=tuple(argv), outcome=outcome, summary=summary,
        exit_code=_opt_int(detail.get("exit_code")), signal=_opt_int(detail.get("signal")), wall_s=wall_s,
        steps_requested=steps, train=train, sampled=sampled,
        failed_alloc_bytes=_opt_int(detail.get("failed_alloc_bytes")),
        in_use_bytes=_opt_int(detail.get("in_use_bytes")), stderr_tail=tuple(tail), smoke_dir=smoke_dir)


def select_profile(evidence: Sequence[ProfileEvidence]) -> ProfileEvidence | None:
    """The first profile, in the declared order, whose smoke run completed; None when none did."""
    return next((e for e in evidence if e.outcome == OK), None)


def candidates(spec: RunSpec) -> tuple[AttemptProfile, ...]:
    """[smoke].candidates when given, else the [[attempts]] profiles in order, else the plain command."""
    return spec.smoke.candidates or spec.attempts or (spec.profile_for(1),)


# -- the smoke run's argv and env ---------------------------------------------------------------------

def smoke_argv(spec: RunSpec, profile: AttemptProfile, steps: int, log: Path, checkpoints: Path,
               label: str) -> tuple[list[str], list[str]]:
    """command + profile args + the [smoke].args template ({steps} expanded, last so it wins), with the
    run's log and checkpoint paths pointed at the smoke's own. Returns (argv, notes).

    The run's log must appear in the argv (as "PATH" or "--flag=PATH"): a smoke run that wrote into
    the real log would corrupt the run it is sizing, so an unredirectable command is refused.
    """

    def label_of(items: Sequence[str]) -> tuple[str, ...]:  # {attempt} names the smoke, not attempt 1
        return tuple(a.replace("{attempt}", label) for a in items)

    one = replace(spec, command=label_of(spec.command), attempts=(replace(profile, args=label_of(profile.args)),))
    argv, _ = retry.build_argv(one, 1, resume=False, halvings=0)
    argv += [a.replace("{steps}", str(steps)).replace("{name}", spec.name) for a in spec.smoke.args]
    notes: list[str] = []
    argv, found_log = _redirect(argv, spec.workdir, spec.log, log)
    if not found_log:
        raise BadInput(f"{spec.spec_file}: run.command does not name run.log ({spec.log}) in its argv, so a "
                       "smoke run cannot be pointed at its own log and would write into the run's real one",
                       hint="pass the log path in run.command (e.g. \"--log\", \"outputs/{name}/train_log.jsonl\")")
    argv, found_ck = _redirect(argv, spec.workdir, spec.checkpoints, checkpoints)
    if not found_ck:
        notes.append(f"run.command does not name run.checkpoints ({spec.checkpoints}); smoke runs are killed "
                     "(SIGKILL) at their timeout so they save nothing, but check where the trainer saves")
    return argv, notes


def smoke_env(spec: RunSpec, base: Mapping[str, str], log: Path, checkpoints: Path, label: str) -> dict[str, str]:
    """The daemon's environment for an attempt, pointed at the smoke's paths, with the run's GPUs."""
    env = dict(base)
    env.update(spec.env)
    env.update({"BABYSIT_RUN": spec.name, "BABYSIT_ATTEMPT": label, "BABYSIT_SMOKE": "1",
                "BABYSIT_LOG": str(log), "BABYSIT_CHECKPOINTS": str(checkpoints),
                "PYTHONUNBUFFERED": env.get("PYTHONUNBUFFERED", "1"),
                "CUDA_DEVICE_ORDER": "PCI_BUS_ID",  # CUDA's indices are NVML's, which the guard read
                "CUDA_VISIBLE_DEVICES": ",".join(str(g) for g in spec.gpus)})
    for secret in ("SLACK_BOT_TOKEN", "SLACK_APP_TOKEN", "SLACK_SIGNING_SECRET"):
        env.pop(secret, None)
    return env


RLIMIT_EXEC = ("import os, resource, sys; n = int(sys.argv[1]); "
               "resource.setrlimit(resource.RLIMIT_AS, (n, n)); os.execvp(sys.argv[2], sys.argv[2:])")


def rlimit_prefix(python: str, gib: float) -> list[str]:
    """argv prefix that execs the command under RLIMIT_AS = gib (a CPU test/safety knob; CUDA needs far
    more address space than memory, so never use it on a GPU run)."""
    return [python, "-c", RLIMIT_EXEC, str(int(gib * 2**30))]


def _redirect(argv: list[str], workdir: Path, target: Path, new: Path) -> tuple[list[str], bool]:
    out, found = [], False
    want = _norm(target, workdir)
    for item in argv:
        head, eq, value = item.partition("=")
        if eq and head.startswith("-") and _norm(Path(value), workdir) == want:
            out.append(f"{head}={new}")
            found = True
        elif not item.startswith("-") and item and _norm(Path(item), workdir) == want:
            out.append(str(new))
            found = True
        else:
            out.append(item)
    return out, found


def _norm(path: Path, workdir: Path) -> Path:
    return Path(os.path.normpath(workdir / path))


# -- attempt 1 after a smoke ----------------------------------------------------------------------------

def selected_profile(spec: RunSpec, facts: Mapping[str, Any]) -> AttemptProfile | None:
    """The smoke-selected profile recorded in the run's state, if it is still one of the declared
    [[attempts]] with the same args (an edited profile was not the one that was measured)."""
    hp = facts.get("hardware_profile")
    if not isinstance(hp, Mapping):
        return None
    name, args = hp.get("profile"), hp.get("args")
    for profile in spec.attempts:
        if profile.profile == name and (args is None or list(profile.args) == list(args)):
            return profile
    return None


def attempt_spec(spec: RunSpec, n: int, facts: Mapping[str, Any]) -> tuple[RunSpec, str | None]:
    """The spec attempt n is built from, and what selected its profile (None: the declared order).

    Only attempt 1 changes: it runs the smoke-validated profile; attempts 2..N keep `profile_for(n)`.
    """
    chosen = selected_profile(spec, facts) if n == 1 else None
    if chosen is None:
        return spec, None
    hp = facts["hardware_profile"]
    by = f"smoke run {hp.get('measured_at') or hp.get('selected_at')} ({Path(str(hp.get('path', ''))).name})"
    return replace(spec, attempts=(chosen, *spec.attempts[1:])), by


def _opt_int(value: object) -> int | None:
    return None if value is None else int(value)  # type: ignore[call-overload]
