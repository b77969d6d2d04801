"""Guard decisions: pure functions from plain readings to actions. No clock, no NVML, no psutil.

The daemon gathers facts (a GpuView, the run's pids, GPU-hours, seconds since the last log record,
free RAM), calls `prelaunch` before starting an attempt and `live` at every check, and acts on the
returned actions in order. The guards never act themselves, and a fact that could not be measured
is never read as "fine": an unavailable GPU view refuses a launch (`gpu-unseen`) and warns during a
run.

Action kinds:
  refuse   — do not launch this attempt (prelaunch only).
  stop     — stop the run gracefully (the stop signal to its leader, grace, SIGKILL); the daemon
             takes a py-spy dump first when the incident is `stalled`.
  confirm  — a GPU holder that looks foreign was seen for the first time: read again soon, act only
             if it is still there (an exiting trainer's pid lingers in NVML for a moment).
  incident — raise an incident (posted with mentions), the run continues.
  warn     — post a warning, the run continues.

`Action.key` is what the daemon adds to `LiveFacts.already_warned` after raising a non-stop action:
an action whose key is already there is not returned again for this attempt.

Who is foreign. A pid on the run's GPUs is the run's own when it is in the run's process tree now,
or ever was (`past_run_pids`: an exiting trainer leaves the tree before NVML forgets it), and it is
never foreign while it is a zombie (it has exited). What remains must be seen on consecutive reads
before the run is stopped: two for a live process babysit can see, three (so at least one whole
guard interval) for a pid no process here has — an exited process NVML has not forgotten yet, or a
process in another PID namespace, which stays.

A job across nodes. Its view holds every node's GPUs, each reading naming its node (the run's `gpus`
on each node): every GPU check runs on each node's part, and its text, detail and key name the node
("GPU 0 on n2: …"), so a holder or an Xid on n2 stops the run as on one box and says where. A view
still `pending` (the job's sidecars starting) is waited for, not warned about.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

from babysit.core.fmt import GIB, fmt_duration, gib, hours
from babysit.core.gpu import health as gpuhealth
from babysit.core.progress import projection_words
from babysit.core.readings import GpuProcess, GpuReading, GpuView
from babysit.core.spec.run_toml import GuardsSpec

WARN_NUMERATOR, WARN_DENOMINATOR = 4, 5  # warn once at 80 % of the GPU-hours cap (docs/spec.md)


@dataclass(frozen=True)
class Holder:
    gpu: int
    pid: int
    name: str
    used_memory_bytes: int | None
    node: str | None = None  # the node the GPU is on (a job across nodes); None: one box

    def describe(self) -> str:
        mem = "memory unknown" if self.used_memory_bytes is None else gib(self.used_memory_bytes)
        return f"GPU {self.gpu}{on_node(self.node)}: pid {self.pid} ({self.name}, {mem})"

    @property
    def sighting(self) -> SightingKey:
        """What its consecutive reads are counted under: (gpu, pid), and the node on a job across nodes
        (one pid number on two nodes is two processes)."""
        return (self.gpu, self.pid) if self.node is None else (self.gpu, self.pid, self.node)

    def to_dict(self) -> dict[str, object]:
        return {"gpu": self.gpu, "pid": self.pid, "name": self.name, "used_memory_bytes": self.used_memory_bytes,
                **({"node": self.node} if self.node is not None else {})}


SightingKey = tuple[int, int] | tuple[int, int, str]


def on_node(node: str | None) -> str:
    """" on n2" for a GPU of a job across nodes, "" on one box: every GPU sentence names its node."""
    return f" on {node}" if node else ""


@dataclass(frozen=True)
class Action:
    kind: str  # refuse | stop | incident | warn | confirm
    incident: str  # an incident kind (docs/guards.md), plus gpu-unseen
    message: str
    detail: Mapping[str, object] = field(default_factory=lambda: MappingProxyType({}))
    key: str = ""  # dedupe key for warn-once; defaults to the incident kind

    def __post_init__(self) -> None:
        if not self.key:
            object.__setattr__(self, "key", self.incident)
        if not isinstance(self.detail, MappingProxyType):
            object.__setattr__(self, "detail", MappingProxyType(dict(self.detail)))


@dataclass(frozen=True)
class LiveFacts:
    gpus: tuple[int, ...]
    view: GpuView | None  # None: the GPUs were not read for this check (GPU checks skipped)
    run_pids: frozenset[int]
    gpu_hours_used: float
    gpu_hours_projected_at_end: float | None  # None: cannot project yet
    seconds_since_last_record: float | None  # real seconds; pass those since launch while no record exists yet
    process_alive: bool
    available_ram_bytes: int | None
    already_warned: frozenset[str] = frozenset()
    past_run_pids: frozenset[int] = frozenset()  # every pid the run's tree ever held (all attempts)
    sightings: Mapping[SightingKey, int] = field(default_factory=dict)  # Holder.sighting -> consecutive reads
    nonfinite: tuple[int, str, float] | None = None  # (step, metric, value): a watched metric went NaN/inf
    minute_seconds: float = 60.0  # real seconds a declared minute lasts (1 under --accelerated)
    ram_node: str | None = None  # a job across nodes: the node whose free RAM `available_ram_bytes` is (its lowest)


CONFIRM_READS_VISIBLE = 2  # a live foreign process babysit can see: this read and the one before
CONFIRM_READS_INVISIBLE = 3  # a pid with no process here: gone (an exit NVML lags on) or another namespace


def is_foreign(proc: GpuProcess, run_pids: frozenset[int]) -> bool:
    """The one foreign-holder predicate (the guards and the poll): a process on the run's GPU that is not
    the run's (`run_pids`: now or ever) and has not exited (a zombie NVML still lists is gone)."""
    return proc.pid not in run_pids and not proc.zombie


def below_ram_floor(available_ram_bytes: int | None, floor_gib: float | None) -> bool:
    """The one RAM-floor predicate (the guard's incident and the poll's flag): measured, a floor set, under it."""
    return available_ram_bytes is not None and bool(floor_gib) and available_ram_bytes < (floor_gib or 0) * GIB


def foreign_holders(view: GpuView, gpus: Sequence[int], run_pids: frozenset[int]) -> tuple[Holder, ...]:
    """Compute processes on the run's GPUs that are not the run's (`run_pids`) and have not exited; on a
    view across nodes, every node's (each holder names its node)."""
    if not view.available:
        return ()
    holders = []
    for node, part in view.by_node():
        for index in gpus:
            reading = part.gpu(index)
            if reading is None:
                continue
            for proc in reading.processes:
                if is_foreign(proc, run_pids):
                    holders.append(Holder(index, proc.pid, proc.name, proc.used_memory_bytes, node))
    return tuple(holders)


def track_sightings(previous: Mapping[SightingKey, int], holders: Sequence[Holder]) -> dict[SightingKey, int]:
    """Consecutive reads each foreign-looking (gpu, pid[, node]) has been seen on; one missing read resets it."""
    return {h.sighting: previous.get(h.sighting, 0) + 1 for h in holders}


def confirmed(holder: Holder, view: GpuView, sightings: Mapping[SightingKey, int]) -> bool:
    """Seen on enough consecutive reads to act on (see the module docstring)."""
    needed = CONFIRM_READS_INVISIBLE if _invisible(view, holder) else CONFIRM_READS_VISIBLE
    return sightings.get(holder.sighting, 0) >= needed


def prelaunch(guards: GuardsSpec, gpus: Sequence[int], view: GpuView,
              past_run_pids: frozenset[int] = frozenset(),
              quarantined: Mapping[str, str] | None = None) -> tuple[Action, ...]:
    """Whether an attempt may start on `gpus`. Any "refuse" in the result means: do not launch.

    `past_run_pids`: the run's earlier attempts' processes; an OOM'd attempt's pid NVML still lists
    while the retry starts is not a holder. `quarantined`: UUID -> why, for GPUs babysit quarantined
    after a machine fault (`babysit gpu release` lifts it). Only machine-side signals refuse: a
    trainer's own Xid (13/31/43) leaves the GPU healthy, and a warning (throttling) is no fault."""
    if not gpus:
        return ()
    if not view.available:
        return (Action("refuse", "gpu-unseen", f"cannot see the run's GPUs, refusing to launch: {view.reason}",
                       {"gpus": list(gpus), "reason": view.reason}),)
    actions: list[Action] = []
    visible = sorted(g.index for g in view.gpus)
    missing = [i for i in gpus if view.gpu(i) is None]
    if missing:
        actions.append(Action("refuse", "gpu-unseen",
                              f"GPU {_join(missing)} not visible (visible: {_join(visible) or 'none'}), "
                              "refusing to launch — fix run.gpus or check `nvidia-smi`",
                              {"missing": missing, "visible": visible}))
    for index in gpus:
        reading = view.gpu(index)
        if reading is None:
            continue
        if quarantined and reading.uuid in quarantined:
            actions.append(Action("refuse", "gpu-quarantined",
                                  f"GPU {index} ({reading.uuid}) is quarantined: {quarantined[reading.uuid]} — "
                                  f"`babysit gpu release {reading.uuid}` once it is reset or replaced",
                                  {"gpu": index, "uuid": reading.uuid}))
        machine = [s for s in gpuhealth.signals_of(reading) if gpuhealth.assess(s).machine]
        if machine:
            said = ", ".join(dict.fromkeys(s.text or s.kind for s in machine))
            actions.append(Action("refuse", "gpu-fault",
                                  f"GPU {index} reports {said}, refusing to launch — "
                                  "reset or drain the GPU (`nvidia-smi -q -d ECC,PAGE_RETIREMENT`)",
                                  {"gpu": index, "uuid": reading.uuid, "faults": [s.text or s.kind for s in machine]}))
        if guards.exclusive_gpu and not reading.processes_known and "device lost" not in reading.faults:
            actions.append(Action("refuse", "gpu-unseen",
                                  f"cannot list the processes on GPU {index}, so exclusivity cannot be checked; "
                                  "refusing to launch — fix NVML access or set guards.exclusive_gpu = false",
                                  {"gpu": index, "errors": list(reading.errors)}))
    holders = foreign_holders(view, gpus, past_run_pids)
    if holders:
        text = "; ".join(h.describe() for h in holders)
        if guards.exclusive_gpu:
            actions.append(Action("refuse", "gpu-held",
                                  f"{text} — refusing to launch on a held GPU; stop that process "
                                  "or set guards.exclusive_gpu = false" + _namespace_hint(holders, view),
                                  {"holders": [h.to_dict() for h in holders]}))
        else:
            actions.append(Action("warn", "gpu-held", f"{text} — sharing the GPU (guards.exclusive_gpu = false)",
                                  {"holders": [h.to_dict() for h in holders]}))
    return tuple(actions)


def live(guards: GuardsSpec, facts: LiveFacts) -> tuple[Action, ...]:
    """Guard checks on a running attempt: stops first, then incidents and warnings not yet raised."""
    out: list[Action] = []
    out.extend(_gpu_checks(guards, facts))
    out.extend(_hours_checks(guards, facts))
    if facts.process_alive and facts.nonfinite is not None:
        step, metric, value = facts.nonfinite
        out.append(Action("stop", "diverged", f"{metric} = {value} at step {step} — stopping the run; it ends "
                          "classified diverged",
                          {"step": step, "metric": metric, "value": str(value)}))
    stall_s = guards.stall_minutes * facts.minute_seconds  # a declared limit, in real seconds
    since = facts.seconds_since_last_record
    if facts.process_alive and since is not None and since >= stall_s:
        limit = f"{guards.stall_minutes:g} min" if facts.minute_seconds == 60 else \
            f"stall_minutes = {guards.stall_minutes:g}: {fmt_duration(stall_s)} under --accelerated"
        out.append(Action("stop", "stalled",
                          f"no new log record and no output for {fmt_duration(since)} (limit {limit}) while the "
                          "process is alive — taking a stack dump, then stopping",
                          {"seconds_since_last_record": since, "stall_minutes": guards.stall_minutes}))
    ram = facts.available_ram_bytes
    if ram is not None and below_ram_floor(ram, guards.min_free_host_ram_gib):
        out.append(Action("incident", "host-memory-pressure",
                          f"host RAM available {gib(ram)}{f' on node {facts.ram_node}' if facts.ram_node else ''} < "
                          f"{guards.min_free_host_ram_gib:g} GiB floor — "
                          "the next attempt halves the [machinery] knobs if this one fails",
                          {"available_ram_bytes": ram, "min_free_host_ram_gib": guards.min_free_host_ram_gib,
                           **({"node": facts.ram_node} if facts.ram_node else {})}))
    stops = [a for a in out if a.kind == "stop"]
    rest = [a for a in out if a.kind != "stop" and (a.kind == "confirm" or a.key not in facts.already_warned)]
    return (*stops, *rest)


STARVED_DATA_WAIT_FRAC = 0.2  # the trainer waits on its input this share of each step, or more: starved


def low_util_flag(util_pct: float | None, steps_advanced: bool, threshold_pct: float,
                  data_wait_frac: float | None) -> str | None:
    """What a poll says about a GPU that mostly waits while steps advance.

    `input-starvation` only with evidence: the trainer's own data-wait share of step time is high.
    Low util has other causes (small batches, launch overhead, host-device syncs, a slow collective),
    and "raise --num-workers" is the wrong advice for those: without evidence the poll says
    `gpu-util-low` and lists the causes. Unmeasured util is no evidence of anything.
    """
    if util_pct is None or not steps_advanced or util_pct >= threshold_pct:
        return None
    if data_wait_frac is not None and data_wait_frac >= STARVED_DATA_WAIT_FRAC:
        return "input-starvation"
    return "gpu-util-low"


# -- internals ----------------------------------------------------------------------------------


def _gpu_checks(guards: GuardsSpec, facts: LiveFacts) -> list[Action]:
    view = facts.view
    if not facts.gpus or view is None:
        return []
    if view.pending:  # a job's sidecars starting: said by the poll, warned once it is late (never silent)
        return []
    if not view.available:
        return [Action("warn", "gpu-unseen", f"cannot see the run's GPUs, guards are blind: {view.reason}",
                       {"gpus": list(facts.gpus), "reason": view.reason})]
    out: list[Action] = []
    for node, part in view.by_node():  # a job across nodes: each node's GPUs judged alike, the node named
        out.extend(_node_checks(guards, facts.gpus, node, part))
    holders = foreign_holders(view, facts.gpus, facts.run_pids | facts.past_run_pids)
    if not holders:  # the common check: the run's GPUs hold only the run
        return out
    sure = tuple(h for h in holders if confirmed(h, view, facts.sightings))
    unsure = tuple(h for h in holders if h not in sure)
    if sure:
        text = "; ".join(h.describe() for h in sure)
        detail: dict[str, object] = {"holders": [h.to_dict() for h in sure], "run_pids": sorted(facts.run_pids),
                                     "reads": {":".join(map(str, h.sighting)): facts.sightings.get(h.sighting)
                                               for h in sure}}
        nodes = sorted({h.node for h in sure if h.node})
        if nodes:
            detail["nodes"] = nodes
        if guards.exclusive_gpu:
            out.append(Action("stop", "gpu-held", f"{text} is not the run's — stopping the run (exclusive_gpu)"
                              + _namespace_hint(sure, view), detail))
        else:
            out.append(Action("warn", "gpu-held", f"{text} shares the run's GPU", detail))
    if unsure:
        out.append(Action("confirm", "gpu-held", "; ".join(h.describe() for h in unsure)
                          + " looks foreign: reading again before acting",
                          {"holders": [h.to_dict() for h in unsure]}, key="gpu-held:confirm"))
    return out


def _node_checks(guards: GuardsSpec, gpus: Sequence[int], node: str | None, view: GpuView) -> list[Action]:
    """One node's GPUs (the whole view on one box): each missing, faulty or unlistable GPU said, the node
    named and in the key, so the same GPU index on two nodes is two warnings."""
    out: list[Action] = []
    on, at = on_node(node), f"@{node}" if node else ""
    where = {"node": node} if node else {}
    for index in gpus:
        reading = view.gpu(index)
        if reading is None:
            out.append(Action("warn", "gpu-unseen", f"GPU {index}{on} is no longer visible to NVML — fallen off the "
                              "bus? check `nvidia-smi` and the kernel log", {"gpu": index, **where},
                              key=f"gpu-unseen:{index}{at}"))
            continue
        if reading.signals or reading.faults:  # a healthy GPU: no signal to assess
            out.extend(_health_actions(index, reading))
        if guards.exclusive_gpu and not reading.processes_known and "device lost" not in reading.faults \
                and not any(s.kind == "unresponsive" for s in reading.signals):
            out.append(Action("warn", "gpu-unseen", f"cannot list the processes on GPU {index}{on}: exclusivity "
                              "is not being checked", {"gpu": index, "errors": list(reading.errors), **where},
                              key=f"gpu-unseen:procs:{index}{at}"))
    return out


def _health_actions(index: int, reading: GpuReading) -> list[Action]:
    """What one GPU's health signals call for (babysit/core/gpu/health.py): a machine fault that stops
    stops the run (classified gpu-fault), one that does not is an incident; a trainer's own Xid is an
    incident that blames the trainer; a warning is one warning per kind and GPU. Each machine-side
    action carries its evidence, which the supervisor records on the attempt; on a job across nodes the
    GPU's node is in the text, the detail and the evidence (the machine's fault is that node's)."""
    out = []
    node, at = reading.node, f"@{reading.node}" if reading.node else ""
    where = {"node": node} if node else {}
    for sig in gpuhealth.signals_of(reading):
        a = gpuhealth.assess(sig)
        text = gpuhealth.describe(index, sig, node)
        what = sig.text or sig.kind
        detail: dict[str, object] = {"gpu": index, "uuid": reading.uuid, "fault": what, **where,
                                     "evidence": [gpuhealth.evidence(reading, sig, sig.at)]}
        if a.machine and a.stop:
            out.append(Action("stop", "gpu-fault", f"{text} — stopping the run (classified gpu-fault; retried "
                              f"per retry.on on a healthy {'node' if node else 'GPU'})", detail))
        elif a.machine:
            out.append(Action("incident", "gpu-fault", f"{text} — check `nvidia-smi -q` and the kernel log "
                              f"(dmesg | grep -i xid){on_node(node)}", detail, key=f"gpu-fault:{index}{at}:{what}"))
        elif a.side == "application":
            out.append(Action("incident", "gpu-app-error", f"{text}: the trainer's bug, not the machine's",
                              detail, key=f"gpu-app-error:{index}{at}:{what}"))
        elif a.side == "warn":
            out.append(Action("warn", "gpu-health", text, {"gpu": index, "uuid": reading.uuid, "signal": sig.kind,
                                                          "value": sig.value, "text": what, **where},
                              key=f"gpu-health:{index}{at}:{sig.kind}"))
        else:
            out.append(Action("warn", "gpu-health", text, {"gpu": index, "uuid": reading.uuid, "text": what,
                                                          **where},
                              key=f"gpu-health:{index}{at}:{what}"))
    return out


def _hours_checks(guards: GuardsSpec, facts: LiveFacts) -> list[Action]:
    cap = guards.gpu_hours_cap
    if cap is None:
        return []
    used = facts.gpu_hours_used
    projected = facts.gpu_hours_projected_at_end
    warn = used * WARN_DENOMINATOR >= cap * WARN_NUMERATOR  # 80 %, without 0.8 * 12 = 9.600000000000001
    sentence = projection_words(used, projected, cap)
    if used < cap and not warn and sentence is None:
        return []  # the common check: nothing to say, no detail made (every run, every guard round)
    detail = {"gpu_hours_used": round(used, 4), "gpu_hours_cap": cap,
              "gpu_hours_projected": None if projected is None else round(projected, 4)}
    if used >= cap:
        return [Action("stop", "gpu-hours-cap", f"GPU-hours {hours(used)} reached the cap {hours(cap)} — "
                       "stopping the run", detail)]
    out = []
    if warn:
        out.append(Action("warn", "gpu-hours-cap", f"GPU-hours {hours(used)} passed 80 % of the cap {hours(cap)}",
                          detail, key="gpu-hours-80"))
    if sentence is not None:
        out.append(Action("warn", "gpu-hours-cap", sentence, detail, key="gpu-hours-projection"))
    return out


def _namespace_hint(holders: Sequence[Holder], view: GpuView) -> str:
    invisible = {(h.gpu, h.pid) for h in holders if _invisible(view, h)}
    if not invisible:
        return ""
    return (" (pid not visible from babysit's PID namespace: another container, or babysit runs in a "
            "container without --pid=host)")


def _invisible(view: GpuView, holder: Holder) -> bool:
    reading = (view.on(holder.node) if holder.node is not None else view).gpu(holder.gpu)
    if reading is None:
        return False
    return any(p.pid == holder.pid and not getattr(p, "visible", True) for p in reading.processes)


def _join(items: Sequence[int]) -> str:
    return ", ".join(str(i) for i in items)
