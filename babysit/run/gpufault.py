"""What the supervisor does about GPU faults: record the evidence, quarantine the GPU, choose healthy
GPUs for the next attempt, or wait for a quarantined one (docs/guards.md, GPU health).

The decisions are pure (babysit/core/gpu/health.py, gpuchoice.py); this module reads the probe and
the store for them. Evidence is recorded on the attempt as it is seen (a guard's action) and, at the
exit, completed from the probe's history of signals since the attempt started: an Xid that arrives
as the trainer dies is counted even when no guard round saw it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from babysit.core.gpu import choice as gpuchoice
from babysit.core.gpu import health as gpuhealth
from babysit.core.guards import Action
from babysit.core.readings import GpuView
from babysit.core.spec.run_toml import RunSpec
from babysit.db.store import Attempt, Store
from babysit.run import nccl
from babysit.run.stackdump import stack_dump

CHOICE_WINDOW = "gpu-choice"  # the probe window of the look at every GPU (closed at once)


def _key(e: Mapping[str, Any]) -> tuple[Any, ...]:
    return e.get("gpu"), e.get("kind"), e.get("code"), e.get("node")


def merge(old: Iterable[Mapping[str, Any]], new: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Evidence lists joined, one item per (gpu, kind, code, node), the first sighting kept."""
    out: dict[tuple[Any, ...], dict[str, Any]] = {}
    for item in (*old, *new):
        out.setdefault(_key(item), dict(item))
    return list(out.values())


def record(store: Store, attempt: Attempt, items: Sequence[Mapping[str, Any]]) -> None:
    """Add evidence (machine- or application-side) to the attempt's detail, once per (gpu, kind, code, node)."""
    if not items:
        return
    current = store.attempt(attempt.run, attempt.n).detail.get("gpu_evidence") or []
    merged = merge(current, items)
    if len(merged) != len(current):
        store.merge_attempt_detail(attempt.id, {"gpu_evidence": merged})


def examine(store: Store, attempt: Attempt, actions: Sequence[Action], run_pids: frozenset[int],
            gpus: Sequence[int], dump: Callable[[frozenset[int]], dict[str, str]] = stack_dump) -> tuple[Action, ...]:
    """A guard round's actions, before the run's transition acts on them: the GPU evidence they carry
    recorded on the attempt; a stall's stacks taken now (before anything is killed) and, for a run of
    several ranks, its hung collective explained (babysit/run/nccl.py) — a missing rank on a GPU with a
    machine-side fault makes the stop a `gpu-fault`."""
    record(store, attempt, [e for a in actions if a.kind in ("stop", "incident")
                            for e in a.detail.get("evidence") or ()])
    out = []
    for action in actions:
        if action.kind == "stop" and action.incident == "stalled":
            detail = dict(action.detail)
            detail["stacks"] = dump(run_pids)  # the executor's: every rank on every node of a Slurm job
            evidence = store.attempt(attempt.run, attempt.n).detail.get("gpu_evidence") or []
            hang = nccl.explain_stall(detail["stacks"], Path(attempt.attempt_dir), gpus, evidence)
            if hang is not None:
                detail["collective"] = hang
            if hang is not None and hang.get("verdict") == "gpu-fault":
                action = Action("stop", "gpu-fault", f"{action.message}: {hang['summary']}", detail)
            else:
                action = Action(action.kind, action.incident, action.message, detail, key=action.key)
        out.append(action)
    return tuple(out)


def at_exit(probe: Any, store: Store, attempt: Attempt, gpus: Sequence[int]) -> list[dict[str, Any]]:
    """Every signal that hit the attempt's GPUs while it ran: what was recorded, and what the probe's
    history holds since its start: NVML's events, or a Slurm job's sidecars' records (`job_evidence`,
    each naming its node); a file probe has no history and adds nothing."""
    recorded = store.attempt(attempt.run, attempt.n).detail.get("gpu_evidence") or []
    since = getattr(probe, "signals_since", None)
    kept = getattr(probe, "job_evidence", None)
    seen = []
    if kept is not None and gpus:
        seen = kept(gpus)
    elif since is not None and gpus and attempt.started_at is not None:
        for index, uuid, sig in since(gpus, attempt.started_at):
            if gpuhealth.assess(sig).side in ("machine", "application"):
                seen.append(gpuhealth.evidence_of(index, uuid, sig, sig.at))
    return merge(recorded, seen)


def quarantine(store: Store, run: str, evidence: Iterable[Mapping[str, Any]], now: float) -> list[dict[str, Any]]:
    """Quarantine each GPU whose machine-side evidence prescribes a reset, a reboot or support; returns
    the items newly quarantined (a GPU already quarantined keeps its first reason). A GPU on a node of a
    job across nodes is not: its node is (`faulty_nodes`), since the scheduler picks GPUs there."""
    new = []
    for e in gpuhealth.machine_evidence(evidence):
        uuid = str(e.get("uuid") or "?")
        if not e.get("quarantine") or uuid == "?" or e.get("node"):
            continue
        on = f" on {e['node']}" if e.get("node") else ""
        reason = f"{e.get('name')}{on} during {run} — {e.get('action_words')}"
        gpu = e.get("gpu")
        if store.quarantine_gpu(uuid, int(gpu) if isinstance(gpu, int) else None, reason, dict(e), now, run=run):
            new.append(e)
    return new


def faulty_nodes(evidence: Iterable[Mapping[str, Any]]) -> dict[str, str]:
    """The nodes whose GPUs show machine-side evidence that prescribes a reset, a reboot or support:
    node -> what was seen there ("Xid 79 (GPU has fallen off the bus) on GPU 0")."""
    out: dict[str, str] = {}
    for e in gpuhealth.machine_evidence(evidence):
        if e.get("quarantine") and e.get("node"):
            out.setdefault(str(e["node"]), f"{e.get('name')} on GPU {e.get('gpu')}")
    return out


def choose(probe: Any, store: Store, spec: RunSpec, declared: Sequence[int], view: GpuView) -> gpuchoice.GpuChoice:
    """The attempt's GPUs: the declared ones unless one is quarantined; then stand-ins from the box
    (`gpus = "any N"`) or the spares, read with one look at every GPU; else wait."""
    quarantined = store.quarantined_gpus()
    uuids = {g.index: g.uuid for g in view.gpus}
    if not quarantined or not any(uuids.get(g) in quarantined for g in declared):
        return gpuchoice.GpuChoice(tuple(declared), None)
    held: set[int] = set()
    if spec.gpus_any or spec.spare_gpus:
        every = probe.read([], window=CHOICE_WINDOW)
        probe.close_window(CHOICE_WINDOW)
        if every.available:
            uuids = {g.index: g.uuid for g in every.gpus}
            held = {g.index for g in every.gpus if g.processes or not g.processes_known}
    return gpuchoice.choose(declared, any_gpu=spec.gpus_any, spares=spec.spare_gpus, uuids=uuids,
                            quarantined=set(quarantined), held=held)


def release_target(store: Store, target: str, uuids: Mapping[int, str]) -> str | None:
    """The UUID `babysit gpu release TARGET` means: a UUID, or an index (the box's, else the one recorded
    when it was quarantined). None: nothing quarantined by that name."""
    quarantined = store.quarantined_gpus()
    if target in quarantined:
        return target
    if target.isdigit():
        index = int(target)
        if uuids.get(index) in quarantined:
            return uuids[index]
        for uuid, row in quarantined.items():
            if row.get("gpu") == index:
                return uuid
    return None


def quarantine_lines(rows: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """One line a quarantined GPU: index, UUID, why, since when, by whom."""
    out = []
    for uuid, q in rows.items():
        when = datetime.fromtimestamp(float(q["at"]), timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
        index = "" if q.get("gpu") is None else f"GPU {q['gpu']} "
        out.append(f"{index}{uuid}: quarantined {when} by {q.get('by')}: {q.get('reason')}")
    return out
