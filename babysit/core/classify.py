"""Exit classification: what ended an attempt, from its exit status, stderr tail and last log records.

Pure: the daemon passes what it saw; the result decides the incident kind and feeds `retry`. Order:

1. exit 0 → completed (diverged when a watched metric went non-finite in the log meanwhile), unless
   the daemon had asked for a stop and the run had not reached its end step; a stop the daemon
   requested → stopped (or the stop's reason: stalled, gpu-fault, diverged), unless the
   trainer had logged its completion (`"event": "completed"`) already: a stop that reached it while it
   was exiting did not end its work (a gpu-fault retry would train it again). User rules
   name *failure* classes, so they never turn a success or a requested stop into a failure that
   would earn a retry.
2. the job's time limit near, the trainer stopped for it → time-limit (chained); a node the scheduler lost
   under the job (Slurm NODE_FAIL, BOOT_FAIL) → node-lost: the machine's; a job the scheduler preempted
   for another → preempted (chained: the trainer's fault it is not).
3. user `[[classify]]` rules, in file order, over the stderr tail and the last records' text.
4. built-ins: the reference trainer's codes (12 out of memory, 11 diverged, 10 stopped), OOM text
   (CUDA, cuBLAS, CPU allocator, MemoryError; an OOM on one rank is the root cause of the NCCL
   timeouts on the others), GPU faults (a machine-side signal on one of the run's GPUs during the
   attempt — an Xid the catalog blames on the machine, double-bit/uncorrectable ECC, GPU lost or
   unresponsive, a recovery action — or such an Xid or ECC error in stderr), divergence (a `diverged`
   record, a watched metric's NaN/inf, "loss is nan"), NCCL timeouts, SIGKILL without a stop request
   (the kernel OOM killer when host memory was low), else crashed.

An illegal memory access is classified `crashed`: it is almost always a software bug (an
out-of-bounds index in a kernel), and a retry on the same code fails the same way. So is an Xid the
catalog (babysit/core/gpu/xid_catalog.toml) puts on the application (13, 31, 43): the GPU stays healthy.
"""

from __future__ import annotations

import re
import signal as _signal
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from babysit.core.gpu import health as gpuhealth
from babysit.core.gpu import xid
from babysit.core.reading import nonfinite, tails
from babysit.core.spec.run_toml import ClassifyRule
from babysit.core.status import Outcome

TAIL_LINES = 20
EXIT_STOPPED, EXIT_DIVERGED, EXIT_OOM = 10, 11, 12  # trainer/exitcodes.py

_UNITS = {"": 1, "B": 1, "BYTES": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
          "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}
_SIZE = r"(\d+(?:\.\d+)?)\s*(B|bytes|[KMGT]i?B)?"

_CUDA_TRIED = re.compile(r"CUDA out of memory\.?\s*Tried to allocate " + _SIZE, re.I)
_CUDA_IN_USE = re.compile(r"this process has " + _SIZE + r" memory in use", re.I)
_CUDA_FREE = re.compile(r"of which " + _SIZE + r" is free", re.I)
_CUDA_TOTAL = re.compile(r"total capacity of " + _SIZE, re.I)
_CUDA_GPU = re.compile(r"GPU (\d+) has a total capacity", re.I)
_CPU_ALLOC = re.compile(r"DefaultCPUAllocator: can't allocate memory: you tried to allocate (\d+) bytes", re.I)
_OOM_OTHER = re.compile(r"torch(?:\.cuda)?\.OutOfMemoryError|CUDA out of memory|CUBLAS_STATUS_ALLOC_FAILED"
                        r"|CUDA error: out of memory|\bMemoryError\b|std::bad_alloc")
_NAN_TEXT = re.compile(r"(?i)\b(?:non-finite|nan|inf)\s+loss\b|\bloss\b\s*(?:is|=|:)\s*[-+]?(?:nan|inf)")
_NCCL = re.compile(r"Watchdog caught collective operation timeout|NCCL[^\n]*(?:timeout|timed out)"
                   r"|ProcessGroupNCCL[^\n]*timed out", re.I)
_GPU_FAULT = re.compile(r"uncorrectable ECC error[^\n]*|GPU is lost|fallen off the bus", re.I)


@dataclass(frozen=True)
class ExitClass:
    outcome: Outcome
    retry: bool | None  # a matching rule's `retry`, else None (the [retry] policy decides)
    summary: str
    detail: Mapping[str, object] = field(default_factory=lambda: MappingProxyType({}))

    def __post_init__(self) -> None:
        if not isinstance(self.detail, MappingProxyType):
            object.__setattr__(self, "detail", MappingProxyType(dict(self.detail)))


def parse_size(number: str, unit: str | None) -> int:
    """"1.62", "GiB" → bytes. IEC units are binary, SI units decimal, no unit is bytes."""
    return round(float(number) * _UNITS[(unit or "").upper()])


@dataclass(frozen=True)
class ExitFacts:
    """Everything known of one attempt's end, gathered by the shell (babysit/run/run_exit.py, `babysit
    smoke`): the one value `classify_exit` decides from. Each field is said in `classify_exit`'s docstring."""

    exit_code: int | None
    signal: int | None = None
    stderr_tail: str = ""
    last_records: Sequence[Any] = ()
    rules: Sequence[ClassifyRule] = ()
    stop_requested: bool = False
    stop_reason: str | None = None
    host_memory_pressure: bool = False
    nonfinite_seen: str | None = None
    nonfinite_metrics: Sequence[str] | None = None
    stop_sent_at: float | None = None
    checkpoint_after_stop: tuple[str, float] | None = None
    gpu_evidence: Sequence[Mapping[str, Any]] = ()
    end_step: int | None = None
    lost_nodes: Sequence[str] = ()
    node_fail: str | None = None
    time_limit: bool = False
    preempted: bool = False


def classify_exit(facts: ExitFacts) -> ExitClass:
    """Classify one attempt's end. See the module docstring for the order.

    node_fail: the scheduler's end state when it lost a node under the job (Slurm NODE_FAIL, BOOT_FAIL),
    lost_nodes: which ones. The machine's fault, never the trainer's: `node-lost` (the machine faults' retry
    budget; the executor quarantines those nodes and leaves them out of later submissions).
    preempted: the scheduler ended the job for a higher-priority one (Slurm PREEMPTED): `preempted`, the
    trainer's fault it is not; the run is continued from its checkpoint in a new job (core/retry.py).
    time_limit: the scheduler warned that the job's time limit was near and the trainer was stopped for
    it (Slurm `--signal`): `time-limit`, continued in a new job from its checkpoint (core/retry.py) — only
    when the trainer stopped cleanly (exit 10, or a `stopped` record): a chain must make progress.

    stop_reason: why the daemon asked for the stop ("stalled", "gpu-fault" and "diverged" keep their
    class so that retry.on can name them; anything else is "stopped"). gpu_evidence: the health signals the
    daemon recorded on the run's GPUs during the attempt (gpuhealth.evidence dicts: gpu, uuid, kind,
    xid, at, side, action, and on a job across nodes the GPU's node); only machine-side ones make a gpu-fault,
    and its detail's `fault_nodes` names the nodes they came from (the executor may leave them out of the
    next attempt). host_memory_pressure: available
    RAM was under the floor.
    nonfinite_seen: what the daemon saw go non-finite in the log while the attempt ran ("train_loss =
    nan at step 120"): a trainer that logs NaN and exits 0 (HF Trainer does) diverged, not completed.
    nonfinite_metrics: the run's `[guards] nonfinite_metrics` (None: the default rule), the metrics whose
    NaN/inf in the last records means divergence (`core.nonfinite`, the guard's and the hooks' rule).
    The stderr tail is shown collapsed (`core.tails`: a progress bar's redraws are one line).
    stop_sent_at, checkpoint_after_stop: when the stop signal was sent, and the newest checkpoint file
    written after it (its name, seconds after the signal): what tells a clean stop behind a launcher that
    exits 1 on any signal (torchrun) from a rank that died without saving (see `_stop_evidence`).
    end_step: the run's last step (`progress.end_step`): an exit 0 after a requested stop is `completed`
    only once the last records reached it (or logged their completion), else `stopped`.
    """
    exit_code, signal, stderr_tail, last_records = facts.exit_code, facts.signal, facts.stderr_tail, facts.last_records
    stop_requested, stop_reason, end_step = facts.stop_requested, facts.stop_reason, facts.end_step
    time_limit, nonfinite_seen = facts.time_limit, facts.nonfinite_seen
    if exit_code is not None and exit_code < 0:  # subprocess convention: -N = killed by signal N
        exit_code, signal = None, -exit_code
    if signal is None and exit_code in (128 + _signal.SIGKILL, 128 + _signal.SIGTERM):
        signal = exit_code - 128  # a shell or launcher reported the signal as 128+N
    lines = tails.collapse(stderr_tail)
    tail = "\n".join(lines[-TAIL_LINES:])
    base: dict[str, object] = {"exit_code": exit_code, "signal": signal, "signal_name": _signame(signal),
                               "stderr_tail": tail, "matched_rule": None}
    status = _status(exit_code, signal)

    done = [r for r in last_records if getattr(r, "event", None) == "completed"]
    saved = exit_code == EXIT_STOPPED or any(getattr(r, "event", None) == "stopped" for r in last_records)
    if time_limit and saved and not stop_requested and not done and not _reached(last_records, end_step):
        return ExitClass(Outcome.TIME_LIMIT, None, f"reached its Slurm time limit: warned before it and stopped "
                         f"({status}); the run continues in a new job from its checkpoint",
                         {**base, "time_limit": True})
    if exit_code == 0 and signal is None:
        if nonfinite_seen:
            return ExitClass(Outcome.DIVERGED, None, f"diverged: {nonfinite_seen} (it exited 0 anyway)",
                             {**base, "nonfinite": nonfinite_seen})
        # a trainer that exits 0 on babysit's SIGTERM (it saved and left) was stopped, not completed,
        # unless it had reached its end already: a stop shown as a success hides that the work is undone
        if not stop_requested or done or _reached(last_records, end_step):
            return ExitClass(Outcome.COMPLETED, None, "completed (exit 0)", base)
    # A trainer that died of its own failure (OOM, divergence) while babysit was stopping it died of
    # that failure: the stop did not cause it, and retry.on must see the real class.
    if stop_requested and done:
        said = f" (stop: {stop_reason})" if stop_reason else ""
        return ExitClass(Outcome.COMPLETED, None,
                         f"completed: the trainer logged its completion at step {getattr(done[-1], 'step', '?')} "
                         f"before the stop{said} reached it while it exited ({status})",
                         {**base, "completed_before_stop": stop_reason or "stop"})
    if stop_requested and exit_code not in (EXIT_OOM, EXIT_DIVERGED):
        kept = (Outcome.STALLED, Outcome.GPU_FAULT, Outcome.DIVERGED)
        outcome = Outcome(stop_reason) if stop_reason in kept else Outcome.STOPPED
        clean = exit_code in (0, EXIT_STOPPED) or signal in (_signal.SIGTERM, _signal.SIGKILL)
        evidence = {"clean": True, "by": "exit", "evidence": status} if clean else \
            _stop_evidence(stderr_tail, last_records, facts.stop_sent_at, facts.checkpoint_after_stop)
        if clean:
            note = ""
        elif evidence["clean"]:
            note = f": a clean stop, shown by {evidence['evidence']}"
        else:
            note = f" (it did not exit cleanly: {evidence['evidence']}; check the checkpoint)"
        nodes = gpuhealth.fault_nodes(facts.gpu_evidence) if outcome == Outcome.GPU_FAULT else []
        at_fault = f" — the machine's fault, on {', '.join(nodes)}" if nodes else ""
        return ExitClass(outcome, None, f"{outcome} on request{_reason(stop_reason)}{at_fault}, {status}{note}",
                         {**base, "stop_reason": stop_reason, "clean_stop": evidence,
                          **({"fault_nodes": nodes} if nodes else {})})

    if facts.node_fail:
        which = ", ".join(facts.lost_nodes) or "a node of the job"
        return ExitClass(Outcome.NODE_LOST, None, f"node lost, the machine's fault: Slurm lost {which} under the "
                         f"job ({facts.node_fail}); not the trainer's",
                         {**base, "node_fail": facts.node_fail, "lost_nodes": list(facts.lost_nodes)})
    if facts.preempted:
        return ExitClass(Outcome.PREEMPTED, None, "preempted: Slurm gave the job's nodes to a higher-priority job; "
                         "not the trainer's fault", {**base, "preempted": True})
    text = stderr_tail + "\n" + "\n".join(_record_text(r) for r in last_records)
    for rule in facts.rules:
        match = re.search(rule.pattern, text, re.M)
        if match:
            return ExitClass(rule.failure_class, rule.retry,
                             f"{rule.failure_class}: matched [[classify]] /{rule.pattern}/: {match.group(0)[:120]}",
                             {**base, "matched_rule": rule.pattern})

    if exit_code == EXIT_OOM:
        return _oom(stderr_tail, base, status)
    nonfinite_detail = _nonfinite(last_records, facts.nonfinite_metrics)
    if exit_code == EXIT_DIVERGED:
        what = nonfinite_seen or nonfinite_detail.get("nonfinite") or "the trainer's exit code for divergence"
        return ExitClass(Outcome.DIVERGED, None, f"diverged: {what} ({status})", {**base, **nonfinite_detail})
    if exit_code == EXIT_STOPPED:
        return ExitClass(Outcome.STOPPED, None,
                         "stopped by a signal babysit did not send (exit 10: preempted? Ctrl-C?)",
                         {**base, "stop_reason": "external"})
    if _OOM_OTHER.search(stderr_tail) or _CPU_ALLOC.search(stderr_tail):
        return _oom(stderr_tail, base, status)
    machine = gpuhealth.machine_evidence(facts.gpu_evidence)
    codes = xid.codes_in(stderr_tail)
    machine_codes = [c for c in codes if xid.lookup(c).machine]
    fault = _GPU_FAULT.search(stderr_tail)
    if machine or machine_codes or fault:
        said = [_evidence_words(e) for e in machine] + [
            f"Xid {c} ({xid.lookup(c).name}) in stderr" for c in machine_codes]
        if not said and fault:
            said = [fault.group(0).strip()[:120]]
        nodes = gpuhealth.fault_nodes(machine)
        return ExitClass(Outcome.GPU_FAULT, None, f"GPU fault, the machine's: {'; '.join(said)} ({status})",
                         {**base, "gpu_evidence": machine, "stderr_xids": list(machine_codes),
                          **({"fault_nodes": nodes} if nodes else {})})
    app = [e for e in facts.gpu_evidence if e.get("side") == "application"]
    app_codes = [c for c in codes if xid.lookup(c).side == "application"]
    app_detail: dict[str, object] = {}
    if app or app_codes:
        named = [f"{e.get('name')} on GPU {e.get('gpu')}" for e in app] + [
            f"Xid {c} ({xid.lookup(c).name})" for c in app_codes if c not in {e.get("xid") for e in app}]
        app_detail = {"app_gpu_errors": [dict(e) for e in app] + [{"xid": c} for c in app_codes],
                      "note": f"the trainer's own GPU error: {'; '.join(named)} — the GPU stays healthy"}
        base = {**base, **app_detail}
    nan_text = _NAN_TEXT.search(stderr_tail)
    if nonfinite_detail or nan_text:
        what = nonfinite_detail.get("nonfinite") or (nan_text.group(0) if nan_text else None) or "non-finite loss"
        return ExitClass(Outcome.DIVERGED, None, f"diverged: {what} ({status})", {**base, **nonfinite_detail})
    if _NCCL.search(stderr_tail):
        return ExitClass(Outcome.CRASHED, None, f"crashed: NCCL collective timeout ({status}) — a rank hung or died",
                         {**base, "nccl_timeout": True})
    if signal == _signal.SIGKILL:
        if facts.host_memory_pressure:
            return ExitClass(Outcome.OOM, None, "oom: killed by SIGKILL while host RAM was under the floor (kernel OOM "
                             "killer)", {**base, "host_oom": True})
        return ExitClass(Outcome.CRASHED, None, "crashed: killed by SIGKILL, not by babysit (OOM killer? check dmesg)",
                         {**base, "note": "killed (OOM killer?)"})
    last = lines[-1].strip() if lines else "no stderr"
    if app_detail:
        return ExitClass(Outcome.CRASHED, None, f"crashed ({status}), {app_detail['note']}: {last[:120]}", base)
    return ExitClass(Outcome.CRASHED, None, f"crashed ({status}): {last[:160]}", base)


# -- internals ----------------------------------------------------------------------------------
# torchrun, when a rank outlives its closing signal: "Unable to shutdown process 123 via Signals.SIGTERM,
# forcefully exiting via Signals.SIGKILL"
_LAUNCHER_KILLED = re.compile(r"Unable to shutdown process (\d+) via \S+, forcefully exiting via \S*SIGKILL")
_STOP_SLACK_S = 1.0  # a stop record stamped this much before the signal's recorded time still follows it


def _stop_evidence(stderr: str, records: Sequence[Any], sent_at: float | None,
                   checkpoint: tuple[str, float] | None) -> dict[str, object]:
    """Was a requested stop clean, when the exit status cannot say (a launcher such as torchrun exits 1
    after any signal, whatever its ranks did)? From what the run shows, strongest first: the launcher
    saying it had to SIGKILL a rank (not clean); the trainer's own stop record (`"event": "stopped"`,
    the reference trainer writes one after it checkpoints) logged after the signal; a checkpoint file
    written after the signal. Neither: not clean. Returns {"clean", "by", "evidence"}, `evidence` in words."""
    killed = _LAUNCHER_KILLED.findall(stderr)
    if killed:
        return {"clean": False, "by": "launcher",
                "evidence": f"the launcher SIGKILLed rank pid {', '.join(killed)} when it outlived the stop signal"}
    found = []
    by = None
    stops = [r for r in records if getattr(r, "event", None) == "stopped"
             and (sent_at is None or getattr(r, "ts", 0.0) >= sent_at - _STOP_SLACK_S)]
    if stops:
        by = "stop-record"
        found.append(f"the trainer's stop record at step {getattr(stops[-1], 'step', '?')}")
    if checkpoint is not None:
        by = by or "checkpoint"
        found.append(f"checkpoint {checkpoint[0]} written {checkpoint[1]:.1f} s after the stop signal")
    if found:
        return {"clean": True, "by": by, "evidence": " and ".join(found)}
    return {"clean": False, "by": None,
            "evidence": "no stop record in the log and no checkpoint written after the stop signal"}



def _oom(stderr: str, base: dict[str, object], status: str) -> ExitClass:
    detail: dict[str, object] = {**base, "failed_alloc_bytes": None, "in_use_bytes": None}
    tried = _CUDA_TRIED.search(stderr)
    cpu = _CPU_ALLOC.search(stderr)
    kind = "CUDA OOM"
    tried_text = None
    if tried:
        detail["failed_alloc_bytes"] = parse_size(tried.group(1), tried.group(2))
        tried_text = f"{tried.group(1)} {tried.group(2) or 'B'}"
    elif cpu:
        kind = "CPU OOM"
        detail["failed_alloc_bytes"] = int(cpu.group(1))
        tried_text = f"{int(cpu.group(1)) / 2**30:.2f} GiB"
    elif "CUBLAS_STATUS_ALLOC_FAILED" in stderr:
        kind = "CUDA OOM (cuBLAS workspace)"
    elif re.search(r"\bMemoryError\b|std::bad_alloc", stderr) and "CUDA" not in stderr:
        kind = "CPU OOM"
    in_use_text = None
    for key, pattern in (("in_use_bytes", _CUDA_IN_USE), ("free_bytes", _CUDA_FREE), ("total_bytes", _CUDA_TOTAL)):
        m = pattern.search(stderr)
        if m:
            detail[key] = parse_size(m.group(1), m.group(2))
            if key == "in_use_bytes":
                in_use_text = f"{m.group(1)} {m.group(2) or 'B'}"
    gpu = _CUDA_GPU.search(stderr)
    if gpu:
        detail["gpu"] = int(gpu.group(1))
    summary = kind + (f": tried to allocate {tried_text}" if tried_text else "")
    if in_use_text:
        summary += f" ({in_use_text} in use)"
    if not tried_text and not in_use_text:
        summary += f" ({status})"
    return ExitClass(Outcome.OOM, None, summary, detail)


def _record_text(record: Any) -> str:
    parts = []
    event = getattr(record, "event", None)
    if event:
        parts.append(f"event={event}")
    for source in ("metrics", "fields"):
        values = getattr(record, source, None) or {}
        parts.extend(f"{k}={v}" for k, v in values.items())
    return " ".join(parts)


def _nonfinite(records: Iterable[Any], declared: Sequence[str] | None) -> dict[str, object]:
    """Where the last records say the run went non-finite, the first of: a `diverged` record (the hooks
    and the reference trainer write one, with the values that did it, or a reason), a watched metric's
    NaN/inf by the one rule (core/reading/nonfinite: a default-watched grad norm counts when non-finite twice).
    `nonfinite` names the metric, its value and the step ("grad_norm = nan at step 150")."""
    pending: frozenset[str] = frozenset()  # skip-tolerant names non-finite in their last record (the one rule)
    for record in records:  # in order, the first wins: where it began (a grad norm counts when non-finite twice)
        step = getattr(record, "step", None)
        values = {**(getattr(record, "metrics", None) or {}), **(getattr(record, "fields", None) or {})}
        if getattr(record, "event", None) == "diverged":
            bad = {k: v for k, v in values.items() if nonfinite.is_nonfinite(v)}  # what the trainer named
            reason = values.get("reason")
            what = (f"{nonfinite.describe(bad)} at step {step}" if bad
                    else str(reason) if isinstance(reason, str) and reason else None)
            return {"diverged_step": step, "diverged_record": True, "nonfinite_keys": sorted(bad),
                    **({"nonfinite": what} if what else {})}
        bad, pending = nonfinite.divergence(values, declared, pending)
        if bad:
            return {"diverged_step": step, "nonfinite_keys": sorted(bad),
                    "nonfinite": f"{nonfinite.describe(bad)} at step {step}"}
    return {}


def _reached(last_records: Sequence[Any], end_step: int | None) -> bool:
    """Whether the last records reached the run's end step (False when no end is known)."""
    steps = [s for s in (getattr(r, "step", None) for r in last_records) if isinstance(s, int)]
    return end_step is not None and bool(steps) and max(steps) >= end_step


def _status(exit_code: int | None, signal: int | None) -> str:
    if signal is not None:
        return f"killed by {_signame(signal)}" + (f", exit {exit_code}" if exit_code is not None else "")
    return f"exit {exit_code}" if exit_code is not None else "exit status unknown"


def _signame(signal: int | None) -> str | None:
    if signal is None:
        return None
    try:
        return _signal.Signals(signal).name
    except ValueError:
        return f"signal {signal}"


def _evidence_words(e: Mapping[str, Any]) -> str:
    """"GPU 1 (GPU-8f…): Xid 79 (GPU has fallen off the bus) — reboot the machine"."""
    uuid = f" ({e.get('uuid')})" if e.get("uuid") not in (None, "?") else ""
    on = f" on {e['node']}" if e.get("node") else ""
    return f"GPU {e.get('gpu')}{on}{uuid}: {e.get('name')} — {e.get('action_words') or e.get('action')}"


def _reason(stop_reason: str | None) -> str:
    return f" ({stop_reason})" if stop_reason else ""
