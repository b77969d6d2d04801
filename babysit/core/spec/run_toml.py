"""run.toml → frozen dataclasses (the reference: docs/spec.md).

Every table's dataclass sits beside the checks that fill it, so a field's type, default and rejection
are read together; every rejection names the file, the key path and what was expected. Three tables
have modules of their own: [source] (source.py), [prereg] (prereg.py, frozen and hashed at `register`)
and [slurm] (slurm.py).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any

from babysit.core.campaign.spec import Campaign, RunLink, check_labels, load_campaign, parse_link
from babysit.core.errors import SpecError
from babysit.core.spec import source_kinds
from babysit.core.spec.prereg import Prereg, parse_prereg
from babysit.core.spec.slurm import SlurmSpec, parse_slurm
from babysit.core.spec.source import SourceSpec, needs_run_log, parse_source
from babysit.core.spec.tomlfile import Table, load
from babysit.core.status import FAILURE_OUTCOMES, Outcome

RUN_NAME = re.compile(r"[a-z0-9_.-]{1,64}")
HOST_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}")  # a box's name in a fleet (docs/fleet.md)
FAILURE_CLASSES: tuple[str, ...] = tuple(FAILURE_OUTCOMES)
MIN_POLL_MINUTES = 30  # >= 30-minute cadence after the first poll (docs/spec.md, [poll])
# What `[run] stop_signal` may name: signals a trainer can catch to checkpoint and exit (never KILL/STOP).
STOP_SIGNALS = ("SIGTERM", "SIGINT", "SIGHUP", "SIGUSR1", "SIGUSR2")


@dataclass(frozen=True)
class GuardsSpec:
    exclusive_gpu: bool = True
    gpu_hours_cap: float | None = 12.0
    min_free_host_ram_gib: float = 8.0
    stall_minutes: float = 20.0
    stop_grace_seconds: float = 120.0
    # metrics whose non-finite value is divergence while the run is alive; None: every "loss" metric
    nonfinite_metrics: tuple[str, ...] | None = None


@dataclass(frozen=True)
class PollSpec:
    first_after_minutes: float = 5.0
    every_minutes: float = 30.0
    starvation_util_pct: float = 50.0
    show: tuple[str, ...] | None = None  # metrics a poll prints; None: the prereg metric, loss and eval metrics


@dataclass(frozen=True)
class RetrySpec:
    max_attempts: int = 3
    on: tuple[str, ...] = (Outcome.OOM, Outcome.DIVERGED)
    resume: str = "fresh"  # "fresh" | "latest-checkpoint"
    resume_args: tuple[str, ...] = ("--resume", "latest")  # appended on a latest-checkpoint retry
    gpu_fault_max: int = 2  # gpu-fault retries (their own budget: they never count against max_attempts)


@dataclass(frozen=True)
class AttemptProfile:
    profile: str
    args: tuple[str, ...] = ()


@dataclass(frozen=True)
class ClassifyRule:
    pattern: str
    failure_class: str
    retry: bool | None = None  # None: [retry].on decides


@dataclass(frozen=True)
class NotifySpec:
    channel: str | None = None
    mention_on_incident: tuple[str, ...] = ()


@dataclass(frozen=True)
class SmokeSpec:
    steps: int = 20
    args: tuple[str, ...] = ("--steps", "{steps}", "--eval-every", "0")  # how this trainer runs N steps, eval off
    candidates: tuple[AttemptProfile, ...] = ()  # default: the [[attempts]] profiles in order


@dataclass(frozen=True)
class RunSpec:
    name: str
    command: tuple[str, ...]
    log: Path | None  # [run].log; None only for a non-jsonl [source] without one (records: sources.records_path)
    spec_file: Path
    workdir: Path
    checkpoints: Path
    gpus: tuple[int, ...] = ()
    gpus_any: bool = False  # gpus = "any N": any N healthy GPUs of the box (gpus holds the first choice)
    spare_gpus: tuple[int, ...] = ()  # [run] spare_gpus: stand-ins for a quarantined GPU of `gpus`
    executor: str = "local"
    env: MappingProxyType = field(default_factory=lambda: MappingProxyType({}))
    stop_signal: str = "SIGTERM"  # sent to the run's leader alone on a graceful stop (STOP_SIGNALS)
    total_steps: int | None = None  # the run's last step, for the ETA (else a record's total_steps, or --steps)
    host: str | None = None  # [run] host: the fleet's box the run belongs to (None: the box that takes it up)
    guards: GuardsSpec = GuardsSpec()
    poll: PollSpec = PollSpec()
    retry: RetrySpec = RetrySpec()
    attempts: tuple[AttemptProfile, ...] = ()
    classify: tuple[ClassifyRule, ...] = ()
    machinery_knobs: tuple[str, ...] = ()
    prereg: Prereg | None = None
    notify: NotifySpec = NotifySpec()
    slurm: SlurmSpec | None = None
    smoke: SmokeSpec = SmokeSpec()
    source: SourceSpec = field(default_factory=SourceSpec)  # [source]: where records come from
    campaign: RunLink | None = None  # [campaign]: a campaign run's link to its campaign (docs/campaigns.md)

    def profile_for(self, attempt: int) -> AttemptProfile:
        """Attempt k (1-based) uses attempts[min(k, len) - 1]; no [[attempts]] means one plain profile."""
        if not self.attempts:
            return AttemptProfile("default")
        return self.attempts[min(attempt, len(self.attempts)) - 1]


def load_spec(path: Path | str, display: str | None = None) -> RunSpec:
    """Load and validate a run.toml; errors are SpecError (exit 2) naming file, key and expectation."""
    path = Path(path).resolve()
    shown = display or _display(path)
    return parse_spec(load(path, shown), path, shown)


def parse_spec(data: dict[str, Any], path: Path, shown: str) -> RunSpec:
    top = Table(data, shown)
    run = top.table("run", required=True)
    assert run is not None
    name = run.str("name", check=RUN_NAME.fullmatch, expected="a run name matching [a-z0-9_.-]{1,64}")
    subst = {"name": name}
    command = run.str_list(
        "command", nonempty=True, expected="a non-empty list of strings (argv, never a shell string)"
    )
    if not command[0].strip():
        raise run.error("command", "a program as the first item", list(command))
    base = path.parent
    workdir = (base / _expand(run.str("workdir", "."), subst, run, "workdir")).resolve()
    log_text = run.str("log") if needs_run_log(top.data.get("source")) else run.str("log", None)
    log = workdir / _expand(log_text, subst, run, "log") if log_text is not None else None
    checkpoints = workdir / _expand(run.str("checkpoints", "outputs/{name}/checkpoints"), subst, run, "checkpoints")
    gpus, gpus_any = _gpus(run)
    spare_gpus = run.int_list("spare_gpus", ())
    if set(spare_gpus) & set(gpus) and not gpus_any:
        raise run.error("spare_gpus", "GPUs not already in run.gpus", list(spare_gpus))
    executor = run.choice("executor", ("local", "slurm"), "local")
    env = run.str_map("env", {})
    stop_signal = run.choice("stop_signal", STOP_SIGNALS, "SIGTERM")
    total_steps = run.int("total_steps", None, minimum=1)
    host = run.str("host", None, check=HOST_NAME.fullmatch,
                   expected="a box's host name (letters, digits, '.', '_' or '-', at most 63; docs/fleet.md)")
    run.finish()
    source = parse_source(top.table("source"), workdir=workdir, name=name, log=log)
    log = source.path if source_kinds.rules(source.kind).path == "log" else log  # jsonl: [source].path may name it
    link, campaign = _campaign(top.table("campaign"), base)

    spec = RunSpec(
        name=name,
        command=command,
        log=log,
        spec_file=path,
        workdir=workdir,
        checkpoints=checkpoints,
        gpus=gpus,
        gpus_any=gpus_any,
        spare_gpus=spare_gpus,
        executor=executor,
        env=MappingProxyType(env),
        stop_signal=stop_signal,
        total_steps=total_steps,
        host=host,
        guards=_guards(top.table("guards"), gpus),
        poll=_poll(top.table("poll")),
        retry=_retry(top.table("retry")),
        attempts=tuple(_profile(t) for t in top.tables("attempts")),
        classify=tuple(_classify(t) for t in top.tables("classify")),
        machinery_knobs=_machinery(top.table("machinery")),
        prereg=parse_prereg(top.table("prereg"), base, campaign),
        campaign=link,
        notify=_notify(top.table("notify")),
        slurm=parse_slurm(top.table("slurm")),
        smoke=_smoke(top.table("smoke")),
        source=source,
    )
    top.finish()
    if link is not None and spec.prereg is not None:
        check_labels(link, spec.prereg.labels, shown)
    if executor == "slurm" and spec.slurm is None:
        spec = replace(spec, slurm=SlurmSpec())
    return spec


def check_cadence(spec: RunSpec, accelerated: bool) -> None:
    """The >= 30-minute posted-poll cadence is a rule; only demos and tests (--accelerated) may go faster."""
    if not accelerated and spec.poll.every_minutes < MIN_POLL_MINUTES:
        raise SpecError(
            _display(spec.spec_file), "poll.every_minutes", f"a number >= {MIN_POLL_MINUTES}",
            spec.poll.every_minutes, hint="faster cadences are for demos and tests: pass --accelerated",
        )


def _display(path: Path) -> str:
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def _expand(value: str, subst: dict[str, str], table: Table, key: str) -> str:
    try:
        return value.format(**subst)
    except (KeyError, IndexError, ValueError):
        raise table.error(key, "a path whose only placeholder is {name}", value)


def _guards(t: Table | None, gpus: tuple[int, ...]) -> GuardsSpec:
    if t is None:
        return GuardsSpec()
    if not gpus and t.data.get("exclusive_gpu") is True:  # the default is moot on a CPU run; a written true is not
        raise SpecError(t.file, t.key("exclusive_gpu"), "false, or GPUs in run.gpus (a CPU run holds no GPU)",
                        "<true with run.gpus = []>",
                        hint="declare the run's GPUs (run.gpus = [0]), or set guards.exclusive_gpu = false")
    d = GuardsSpec()
    g = GuardsSpec(
        exclusive_gpu=t.bool("exclusive_gpu", d.exclusive_gpu),
        gpu_hours_cap=t.number("gpu_hours_cap", d.gpu_hours_cap, positive=True),
        min_free_host_ram_gib=t.number("min_free_host_ram_gib", d.min_free_host_ram_gib, minimum=0),
        stall_minutes=t.number("stall_minutes", d.stall_minutes, positive=True),
        stop_grace_seconds=t.number("stop_grace_seconds", d.stop_grace_seconds, minimum=0),
        nonfinite_metrics=t.str_list("nonfinite_metrics", d.nonfinite_metrics,
                                     expected="a list of metric names (default: every metric whose name has \"loss\")"),
    )
    t.finish()
    return g


def _poll(t: Table | None) -> PollSpec:
    if t is None:
        return PollSpec()
    d = PollSpec()
    p = PollSpec(
        first_after_minutes=t.number("first_after_minutes", d.first_after_minutes, positive=True),
        every_minutes=t.number("every_minutes", d.every_minutes, positive=True),
        starvation_util_pct=t.number("starvation_util_pct", d.starvation_util_pct, minimum=0, maximum=100),
        show=t.str_list("show", d.show, expected="a list of metric names"),
    )
    t.finish()
    return p


def _gpus(run: Table) -> tuple[tuple[int, ...], bool]:
    """run.gpus: a list of GPU indices, or "any N" (any N healthy GPUs of the box, picked at launch)."""
    value = run.raw("gpus", None)
    if isinstance(value, str):
        m = re.fullmatch(r"\s*any\s+([1-9]\d*)\s*", value)
        if m is None:
            raise run.error("gpus", 'a list of GPU indices ([0, 1]) or "any N" (N a positive integer)', value)
        return tuple(range(int(m.group(1)))), True
    return run.int_list("gpus", ()), False


def _retry(t: Table | None) -> RetrySpec:
    if t is None:
        return RetrySpec()
    d = RetrySpec()
    on = t.str_list("on", d.on, expected="a list of failure classes (" + " | ".join(FAILURE_CLASSES) + ")")
    if any(c not in FAILURE_CLASSES for c in on):
        raise t.error("on", "a list of failure classes (" + " | ".join(FAILURE_CLASSES) + ")", list(on))
    r = RetrySpec(
        max_attempts=t.int("max_attempts", d.max_attempts, minimum=1),
        on=on,
        resume=t.choice("resume", ("fresh", "latest-checkpoint"), d.resume),
        resume_args=t.str_list("resume_args", d.resume_args),
        gpu_fault_max=t.int("gpu_fault_max", d.gpu_fault_max, minimum=0),
    )
    t.finish()
    return r


def _profile(t: Table) -> AttemptProfile:
    p = AttemptProfile(profile=t.str("profile", check=bool, expected="a non-empty profile name"),
                       args=t.str_list("args", ()))
    t.finish()
    return p


def _classify(t: Table) -> ClassifyRule:
    pattern = t.str("pattern", check=bool, expected="a non-empty regular expression")
    try:
        re.compile(pattern)
    except re.error as exc:
        raise t.error("pattern", f"a valid regular expression ({exc})", pattern)
    rule = ClassifyRule(
        pattern=pattern,
        failure_class=t.choice("class", FAILURE_CLASSES),
        retry=t.bool("retry", None),
    )
    t.finish()
    return rule


def _machinery(t: Table | None) -> tuple[str, ...]:
    if t is None:
        return ()
    knobs = t.str_list("knobs", (), expected="a list of command-line flags such as \"--num-workers\"")
    if any(not k.startswith("-") for k in knobs):
        raise t.error("knobs", "a list of command-line flags such as \"--num-workers\"", list(knobs))
    t.finish()
    return knobs


def _notify(t: Table | None) -> NotifySpec:
    if t is None:
        return NotifySpec()
    n = NotifySpec(
        channel=t.str("channel", None, check=bool, expected="a Slack channel name or ID"),
        mention_on_incident=t.str_list("mention_on_incident", (), expected="a list of Slack user IDs"),
    )
    t.finish()
    return n


def _smoke(t: Table | None) -> SmokeSpec:
    if t is None:
        return SmokeSpec()
    d = SmokeSpec()
    s = SmokeSpec(
        steps=t.int("steps", d.steps, minimum=1),
        args=t.str_list("args", d.args),
        candidates=tuple(_profile(c) for c in t.tables("candidates")),
    )
    t.finish()
    return s


def _campaign(t: Table | None, base: Path) -> tuple[RunLink | None, Campaign | None]:
    """[campaign]: the run's link and its campaign (whose banked deltas become references)."""
    if t is None:
        return None, None
    link = parse_link(t, base)
    return link, load_campaign(link.file)


