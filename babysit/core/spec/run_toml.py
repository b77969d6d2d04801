"""run.toml → frozen dataclasses (the reference: docs/spec.md).

Every default lives here, every rejection names the file, the key path and what was expected, and
`[prereg]` is canonicalised and hashed so that `register` can freeze it and every later read can
check it was not edited.

Long on purpose: every run.toml table's dataclass sits beside the checks that fill it and their
messages, so a field's type, default and rejection are read (and changed) together.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from babysit.core.campaign.spec import Campaign, RunLink, check_labels, load_campaign, merged_references, parse_link
from babysit.core.errors import SpecError
from babysit.core.spec import expr, source_kinds
from babysit.core.spec.source import SourceSpec, needs_run_log, parse_source
from babysit.core.spec.tomlfile import Table, load
from babysit.core.status import FAILURE_OUTCOMES, Outcome

RUN_NAME = re.compile(r"[a-z0-9_.-]{1,64}")
HOST_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}")  # a box's name in a fleet (docs/fleet.md)
FAILURE_CLASSES: tuple[str, ...] = tuple(FAILURE_OUTCOMES)
CLASSIFY_CLASSES: tuple[str, ...] = tuple(FAILURE_OUTCOMES)
MIN_POLL_MINUTES = 30  # >= 30-minute cadence after the first poll (docs/spec.md, [poll])
AMBIGUOUS_BY_INSTRUMENT = "AMBIGUOUS-BY-INSTRUMENT"
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
class SlurmSpec:
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    nodes: int = 1
    gpus_per_node: int | None = None  # default: len(run.gpus)
    gres: str | None = None  # e.g. "gpu:h200:8"; default derived from gpus_per_node
    time_limit: str | None = None  # sbatch --time, e.g. "12:00:00"
    cpus_per_task: int | None = None
    mem: str | None = None
    sbatch_options: tuple[str, ...] = ()
    torchrun: bool | None = None  # None: wrap in torchrun when more than one GPU per node or several nodes
    time_limit_warning_seconds: int | None = None  # with time_limit: the trainer is stopped this long before
    # it and the run continues in a new job from its checkpoint (sbatch --signal); None: `warning_seconds`

    def warning_seconds(self) -> int | None:
        """Seconds before the time limit the trainer is stopped: as written, else 300 s or a tenth of
        the limit when that is shorter; None without a time limit."""
        if self.time_limit is None:
            return None
        if self.time_limit_warning_seconds is not None:
            return self.time_limit_warning_seconds
        return max(1, min(300, slurm_seconds(self.time_limit) // 10))


def slurm_seconds(text: str) -> int:
    """A Slurm time limit in seconds: "MM", "MM:SS", "HH:MM:SS", "D-HH", "D-HH:MM", "D-HH:MM:SS"."""
    days, _, clock = text.rpartition("-")
    parts = [int(x) for x in clock.split(":")]
    if days:  # D-HH[:MM[:SS]]
        h, m, s = (*parts, 0, 0)[:3]
    elif len(parts) == 3:  # HH:MM:SS
        h, m, s = parts
    else:  # MM[:SS]
        h, m, s = 0, parts[0], parts[1] if len(parts) > 1 else 0
    return int(days or 0) * 86400 + h * 3600 + m * 60 + s


@dataclass(frozen=True)
class SmokeSpec:
    steps: int = 20
    args: tuple[str, ...] = ("--steps", "{steps}", "--eval-every", "0")  # how this trainer runs N steps, eval off
    candidates: tuple[AttemptProfile, ...] = ()  # default: the [[attempts]] profiles in order


@dataclass(frozen=True)
class Band:
    label: str
    max: expr.Expr | None = None  # delta <= max
    min: expr.Expr | None = None  # delta >= min


@dataclass(frozen=True)
class Fixture:
    log: Path
    expect_delta: float
    expect_label: str


@dataclass(frozen=True)
class Prereg:
    question: str
    metric: str
    baseline_step: int
    read_step: int
    bands: tuple[Band, ...]
    precision: int = 4
    train_metric: str | None = None
    references: MappingProxyType = field(default_factory=lambda: MappingProxyType({}))
    otherwise: str = "AMBIGUOUS"
    interpretation: MappingProxyType = field(default_factory=lambda: MappingProxyType({}))
    fixture: Fixture | None = None
    canonical: str = ""  # the canonical JSON of the [prereg] table as written
    sha256: str = ""  # sha256 of `canonical`: what `register` freezes

    @property
    def labels(self) -> tuple[str, ...]:
        return (*(b.label for b in self.bands), self.otherwise)


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
        prereg=_prereg(top.table("prereg"), base, campaign),
        campaign=link,
        notify=_notify(top.table("notify")),
        slurm=_slurm(top.table("slurm")),
        smoke=_smoke(top.table("smoke")),
        source=source,
    )
    top.finish()
    if link is not None and spec.prereg is not None:

        check_labels(link, spec.prereg.labels, shown)
    if executor == "slurm" and spec.slurm is None:
        spec = _replace(spec, slurm=SlurmSpec())
    return spec


def check_cadence(spec: RunSpec, accelerated: bool) -> None:
    """The >= 30-minute posted-poll cadence is a rule; only demos and tests (--accelerated) may go faster."""
    if not accelerated and spec.poll.every_minutes < MIN_POLL_MINUTES:
        raise SpecError(
            _display(spec.spec_file), "poll.every_minutes", f"a number >= {MIN_POLL_MINUTES}",
            spec.poll.every_minutes, hint="faster cadences are for demos and tests: pass --accelerated",
        )


def canonical_prereg(table: dict[str, Any]) -> str:
    """The [prereg] table as canonical JSON: sorted keys, no whitespace, floats in repr form."""
    return json.dumps(table, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def prereg_sha256(table: dict[str, Any]) -> str:
    return hashlib.sha256(canonical_prereg(table).encode("utf-8")).hexdigest()


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


def _replace(spec: RunSpec, **changes: Any) -> RunSpec:
    from dataclasses import replace

    return replace(spec, **changes)


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
        failure_class=t.choice("class", CLASSIFY_CLASSES),
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


def _slurm(t: Table | None) -> SlurmSpec | None:
    if t is None:
        return None
    s = SlurmSpec(
        partition=t.str("partition", None),
        account=t.str("account", None),
        qos=t.str("qos", None),
        nodes=t.int("nodes", 1, minimum=1),
        gpus_per_node=t.int("gpus_per_node", None, minimum=0),
        gres=t.str("gres", None),
        time_limit=t.str("time_limit", None, check=re.compile(r"(\d+-)?\d+(:\d{1,2}){0,2}").fullmatch,
                         expected='a Slurm time limit such as "12:00:00" or "1-00:00:00"'),
        cpus_per_task=t.int("cpus_per_task", None, minimum=1),
        mem=t.str("mem", None),
        sbatch_options=t.str_list("sbatch_options", ()),
        torchrun=t.bool("torchrun", None),
        time_limit_warning_seconds=t.int("time_limit_warning_seconds", None, minimum=1),
    )
    if s.time_limit_warning_seconds is not None and (
            s.time_limit is None or s.time_limit_warning_seconds >= slurm_seconds(s.time_limit)):
        raise t.error("time_limit_warning_seconds", f"a number of seconds under time_limit "
                      f"({s.time_limit or 'not set'})", s.time_limit_warning_seconds)
    t.finish()
    return s


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


def _bound(t: Table, key: str) -> expr.Expr | None:
    if not t.has(key):
        t.raw(key, None)
        return None
    value = t.raw(key)
    try:
        return expr.parse(value)
    except expr.ExprError as exc:
        raise t.error(key, f"a number or arithmetic over numbers and reference names ({exc})", value)


def _campaign(t: Table | None, base: Path) -> tuple[RunLink | None, Campaign | None]:
    """[campaign]: the run's link and its campaign (whose banked deltas become references)."""
    if t is None:
        return None, None

    link = parse_link(t, base)
    return link, load_campaign(link.file)


def _prereg(t: Table | None, base: Path, campaign: Campaign | None = None) -> Prereg | None:
    if t is None:
        return None
    raw = t.data
    question = t.str("question", "")
    metric = t.str("metric", check=bool, expected="the key of the eval metric in the log")
    baseline = t.int("baseline_step", minimum=0)
    read = t.int("read_step", minimum=1)
    if read <= baseline:
        raise t.error("read_step", f"a step after baseline_step ({baseline})", read)
    precision = t.int("precision", 4, minimum=0)
    if precision > 12:
        raise t.error("precision", "an integer between 0 and 12", precision)
    train_metric = t.str("train_metric", None, check=bool, expected="the key of the train-slice metric")

    refs_table = t.table("references")
    references: dict[str, float] = {}
    if refs_table is not None:
        for ref in list(refs_table.data):
            if not ref.isidentifier():
                raise refs_table.error(ref, "a reference name usable in a bound (letters, digits, _)", ref)
            references[ref] = refs_table.number(ref)
        refs_table.finish()
    if campaign is not None:  # a campaign's banked deltas are references by name, frozen in the hash

        references = merged_references(references, campaign, t.file)

    bands: list[Band] = []
    for bt in t.tables("bands"):
        label = bt.str("label", check=bool, expected="a non-empty label")
        band = Band(label=label, max=_bound(bt, "max"), min=_bound(bt, "min"))
        bt.finish()  # a typo ("mx") is named as such, before "no bound" is said
        if band.max is None and band.min is None:
            raise SpecError(bt.file, bt.path, "a band with max, min or both", "<neither>")
        for key, bound in (("max", band.max), ("min", band.min)):
            if bound is None:
                continue
            unknown = sorted(bound.names - set(references))
            if unknown:
                raise bt.error(key, "arithmetic over numbers and names from [prereg.references] ("
                               + (", ".join(sorted(references)) or "none declared") + ")", bound.source)
        bt.finish()
        bands.append(band)
    if not bands:
        raise t.missing("bands", "at least one [[prereg.bands]] table", "<none>")

    other = t.table("otherwise")
    otherwise = "AMBIGUOUS"
    if other is not None:
        otherwise = other.str("label", check=bool, expected="a non-empty label")
        other.finish()
    labels = [b.label for b in bands] + [otherwise]
    duplicates = sorted({lb for lb in labels if labels.count(lb) > 1})
    if duplicates:
        raise t.error("bands", "distinct labels for every band and [prereg.otherwise]", duplicates)
    if AMBIGUOUS_BY_INSTRUMENT in labels:
        raise t.error("bands", f"labels other than {AMBIGUOUS_BY_INSTRUMENT} (babysit reserves it)",
                      AMBIGUOUS_BY_INSTRUMENT)

    interpretation = t.str_map("interpretation", {})
    for label in interpretation:
        if label not in labels and label != AMBIGUOUS_BY_INSTRUMENT:
            raise t.error(f"interpretation.{label}", "a label of the bands, the otherwise label or "
                          + AMBIGUOUS_BY_INSTRUMENT + " (" + ", ".join(labels) + ")", "<unknown label>")

    fixture = None
    ft = t.table("fixture")
    if ft is not None:
        fixture = Fixture(
            log=(base / ft.str("log", check=bool, expected="a path to a train log")).resolve(),
            expect_delta=ft.number("expect_delta"),
            expect_label=ft.str("expect_label", check=lambda v: v in labels,
                                expected="one of the labels (" + ", ".join(labels) + ")"),
        )
        ft.finish()
    t.finish()
    try:
        canonical = canonical_prereg({**raw, "references": references} if campaign is not None else raw)
    except ValueError:
        raise SpecError(t.file, t.path, "finite numbers only", "<nan or inf>")
    return Prereg(
        question=question,
        metric=metric,
        baseline_step=baseline,
        read_step=read,
        bands=tuple(bands),
        precision=precision,
        train_metric=train_metric,
        references=MappingProxyType(references),
        otherwise=otherwise,
        interpretation=MappingProxyType(interpretation),
        fixture=fixture,
        canonical=canonical,
        sha256=hashlib.sha256(canonical.encode("utf-8")).hexdigest(),
    )
