"""hardware_profile.json (docs/smoke.md): the record `babysit smoke` writes, its schema and its validator.

Pure. The shape follows a smoke record a team wrote by hand (schema_version, measured_at, hardware, smoke_evidence,
selected_full_training_profile, retry_semantics, provenance_note), with the prose fields backed by
numbers: every tried profile's outcome, peak memory from three sources, the failed allocation parsed
from the allocator's own message. `SCHEMA` is the table in docs/smoke.md, row for row; `validate`
checks a record against it (tests validate every record they produce).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from babysit.core.fmt import GIB
from babysit.core.smoke import ProfileEvidence
from babysit.core.spec.run_toml import RunSpec

SCHEMA_VERSION = 1
OUTCOMES = ("ok", "oom", "crashed", "diverged", "gpu-fault", "stalled", "timeout")

# (path, types, required, meaning). "a[]" walks every item of list a; types are JSON type names.
SCHEMA: tuple[tuple[str, str, bool, str], ...] = (
    ("schema_version", "integer", True, "1"),
    ("measured_at", "string", True, "UTC ISO 8601 time the smoke finished (…Z)"),
    ("run", "string", True, "run.name"),
    ("spec", "string", True, "absolute path of the run.toml"),
    ("hardware", "object", True, "what the smoke ran on"),
    ("hardware.kind", "string", True, "\"gpu\" or \"cpu\""),
    ("hardware.summary", "string", True, "one line, e.g. \"NVIDIA H200 143771 MiB reported total; "
                                         "139.81 GiB PyTorch-visible capacity\""),
    ("hardware.gpus", "array", True, "one item per run GPU (empty on CPU)"),
    ("hardware.gpus[].index", "integer", True, "NVML index"),
    ("hardware.gpus[].name", "string", True, "NVML name"),
    ("hardware.gpus[].nvml_total_bytes", "integer|null", True, "NVML total memory"),
    ("hardware.gpus[].framework_capacity_bytes", "integer|null", True,
     "torch.cuda.get_device_properties(i).total_memory, from a subprocess with the run's env"),
    ("hardware.framework", "object|null", True, "the framework probe: null on CPU runs"),
    ("hardware.framework.name", "string", True, "\"torch\""),
    ("hardware.framework.version", "string|null", True, "torch.__version__"),
    ("hardware.framework.note", "string|null", True, "why capacity is missing, when it is"),
    ("hardware.cpu", "object", True, "the host"),
    ("hardware.cpu.model", "string", True, "/proc/cpuinfo model name"),
    ("hardware.cpu.logical_cores", "integer|null", True, "os.cpu_count()"),
    ("hardware.cpu.ram_bytes", "integer", True, "total host RAM"),
    ("smoke_evidence", "array", True, "each profile tried, in order; trying stops at the first that completes"),
    ("smoke_evidence[].profile", "string", True, "profile name"),
    ("smoke_evidence[].args", "array", True, "the profile's args"),
    ("smoke_evidence[].argv", "array", True, "the smoke run's full argv (smoke log/checkpoints, eval off)"),
    ("smoke_evidence[].outcome", "string", True, " | ".join(OUTCOMES)),
    ("smoke_evidence[].summary", "string", True, "classifier summary, e.g. \"CUDA OOM: tried to allocate 1.62 GiB "
                                                 "(176.87 GiB in use)\""),
    ("smoke_evidence[].exit_code", "integer|null", True, "trainer exit code (12 = OOM)"),
    ("smoke_evidence[].signal", "integer|null", True, "signal that ended it (9 after a timeout)"),
    ("smoke_evidence[].wall_s", "number", True, "wall time of the smoke run"),
    ("smoke_evidence[].steps_requested", "integer", True, "N"),
    ("smoke_evidence[].last_train_step", "integer|null", True, "last step with a train_loss record"),
    ("smoke_evidence[].peak_memory", "object", True, "peak memory, by source"),
    ("smoke_evidence[].peak_memory.framework_max_allocated_gib", "number|null", True,
     "max of the log's max_memory_allocated_gib (CUDA)"),
    ("smoke_evidence[].peak_memory.nvml_process_peak_bytes", "integer|null", True,
     "max over samples of the process tree's NVML used memory"),
    ("smoke_evidence[].peak_memory.nvml_device_peak_bytes", "integer|null", True,
     "max over samples of the run GPUs' used memory (whole device)"),
    ("smoke_evidence[].peak_memory.log_peak_rss_gib", "number|null", True, "max of the log's peak_rss_gib"),
    ("smoke_evidence[].peak_memory.sampled_rss_peak_bytes", "integer|null", True,
     "max over samples of the tree's RSS (psutil)"),
    ("smoke_evidence[].peak_memory.samples", "integer", True, "probe samples taken"),
    ("smoke_evidence[].median_step_time_s", "number|null", True, "median of the log's step_time_s"),
    ("smoke_evidence[].failed_alloc_bytes", "integer|null", True, "OOM: the allocation that failed, parsed"),
    ("smoke_evidence[].in_use_bytes", "integer|null", True, "CUDA OOM: \"this process has … in use\", parsed"),
    ("smoke_evidence[].stderr_tail", "array", True, "last stderr lines (at most 20)"),
    ("smoke_evidence[].eval_records_ignored", "integer", True, "eval records found in the log and dropped"),
    ("smoke_evidence[].smoke_dir", "string", True, "its log, checkpoints, stdout/stderr"),
    ("selected_full_training_profile", "object|null", True, "null when no profile completed"),
    ("selected_full_training_profile.profile", "string", True, "profile name"),
    ("selected_full_training_profile.args", "array", True, "its args"),
    ("selected_full_training_profile.declared_attempt", "integer|null", True,
     "its 1-based place in [[attempts]]; null for a [smoke] candidate the daemon cannot run"),
    ("selected_full_training_profile.peak_memory", "object", True, "as in smoke_evidence"),
    ("selected_full_training_profile.median_step_time_s", "number|null", True, "as in smoke_evidence"),
    ("retry_semantics", "string", True, "derived from [[attempts]] and [retry]"),
    ("provenance_note", "string", True, "states that no eval result was visible, with the real count"),
)
_TOP = {p for p, *_ in SCHEMA if "." not in p and "[" not in p}


@dataclass(frozen=True)
class GpuInfo:
    index: int
    name: str
    nvml_total_bytes: int | None
    framework_capacity_bytes: int | None


@dataclass(frozen=True)
class Hardware:
    gpus: tuple[GpuInfo, ...]
    cpu_model: str
    logical_cores: int | None
    ram_bytes: int
    framework_version: str | None = None
    framework_note: str | None = None  # why the framework capacity is missing

    @property
    def kind(self) -> str:
        return "gpu" if self.gpus else "cpu"

    def summary(self) -> str:
        if not self.gpus:
            return f"CPU only: {self.cpu_model}, {self.logical_cores} logical cores, {self.ram_bytes / GIB:.1f} GiB RAM"
        parts = []
        for g in self.gpus:
            total = "NVML total unknown" if g.nvml_total_bytes is None else \
                f"{g.nvml_total_bytes // 2**20} MiB reported total"
            cap = (f"{g.framework_capacity_bytes / GIB:.2f} GiB PyTorch-visible capacity"
                   if g.framework_capacity_bytes is not None
                   else f"PyTorch-visible capacity unknown ({self.framework_note or 'not measured'})")
            parts.append(f"GPU {g.index} {g.name} {total}; {cap}")
        return " | ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        framework = None if not self.gpus else {"name": "torch", "version": self.framework_version,
                                                 "note": self.framework_note}
        return {"kind": self.kind, "summary": self.summary(),
                "gpus": [{"index": g.index, "name": g.name, "nvml_total_bytes": g.nvml_total_bytes,
                          "framework_capacity_bytes": g.framework_capacity_bytes} for g in self.gpus],
                "framework": framework,
                "cpu": {"model": self.cpu_model, "logical_cores": self.logical_cores, "ram_bytes": self.ram_bytes}}


def peak_memory(e: ProfileEvidence) -> dict[str, Any]:
    return {"framework_max_allocated_gib": e.train.max_memory_allocated_gib,
            "nvml_process_peak_bytes": e.sampled.nvml_process_peak_bytes,
            "nvml_device_peak_bytes": e.sampled.nvml_device_peak_bytes,
            "log_peak_rss_gib": e.train.peak_rss_gib,
            "sampled_rss_peak_bytes": e.sampled.rss_peak_bytes,
            "samples": e.sampled.samples}


def evidence_dict(e: ProfileEvidence) -> dict[str, Any]:
    return {"profile": e.profile, "args": list(e.args), "argv": list(e.argv), "outcome": e.outcome,
            "summary": e.summary, "exit_code": e.exit_code, "signal": e.signal, "wall_s": round(e.wall_s, 3),
            "steps_requested": e.steps_requested, "last_train_step": e.train.last_step,
            "peak_memory": peak_memory(e), "median_step_time_s": e.train.median_step_time_s,
            "failed_alloc_bytes": e.failed_alloc_bytes, "in_use_bytes": e.in_use_bytes,
            "stderr_tail": list(e.stderr_tail), "eval_records_ignored": e.train.eval_records_dropped,
            "smoke_dir": e.smoke_dir}


def declared_attempt(spec: RunSpec, e: ProfileEvidence) -> int | None:
    for i, p in enumerate(spec.attempts, start=1):
        if p.profile == e.profile and tuple(p.args) == e.args:
            return i
    return None


def retry_semantics(spec: RunSpec, selected: ProfileEvidence | None) -> str:
    """One sentence a reader can check against run.toml: which profile each attempt runs, and when."""
    r = spec.retry
    later = [f"attempt {k} uses '{spec.profile_for(k).profile}'" for k in range(2, r.max_attempts + 1)]
    after = (", ".join(later) + " (attempt k runs [[attempts]][min(k, len) - 1])") if later else \
        "there is no attempt 2 (retry.max_attempts = 1)"
    on = ", ".join(r.on) or "nothing"
    resume = "fresh" if r.resume == "fresh" else "resuming from the latest checkpoint"
    tail = (f"; a further attempt is made only after a failure in retry.on ({on}), {resume}, at most "
            f"{r.max_attempts} attempts in all.")
    head = "Resource selection is separate from method-stability attempts: "
    if selected is None:
        return (head + "no profile completed its smoke run, so nothing was selected and the daemon keeps the "
                f"declared order (attempt 1 uses '{spec.profile_for(1).profile}'); " + after + tail)
    if declared_attempt(spec, selected) is None:
        return (head + f"the smoke-validated profile '{selected.profile}' is a [smoke] candidate, not a declared "
                f"[[attempts]] profile, so the daemon cannot run it: attempt 1 keeps "
                f"'{spec.profile_for(1).profile}'; " + after + tail)
    return head + f"attempt 1 uses the smoke-validated profile '{selected.profile}'; " + after + tail


def provenance_note(evidence: Sequence[ProfileEvidence], smoke_args: Sequence[str]) -> str:
    dropped = sum(e.train.eval_records_dropped for e in evidence)
    eval_off = "ran with eval off" if _eval_off(smoke_args) else \
        "ran with the [smoke].args template, which does NOT turn eval off"
    return (f"No eval result was available when this hardware profile was selected: smoke runs {eval_off} and "
            f"{dropped} eval record{'s' if dropped != 1 else ''} found in their logs "
            f"{'were' if dropped != 1 else 'was'} ignored (dropped before selection; only counted).")


def build_record(*, spec: RunSpec, measured_at: str, hardware: Hardware, evidence: Sequence[ProfileEvidence],
                 selected: ProfileEvidence | None) -> dict[str, Any]:
    chosen = None
    if selected is not None:
        chosen = {"profile": selected.profile, "args": list(selected.args),
                  "declared_attempt": declared_attempt(spec, selected), "peak_memory": peak_memory(selected),
                  "median_step_time_s": selected.train.median_step_time_s}
    return {"schema_version": SCHEMA_VERSION, "measured_at": measured_at, "run": spec.name,
            "spec": str(spec.spec_file), "hardware": hardware.to_dict(),
            "smoke_evidence": [evidence_dict(e) for e in evidence],
            "selected_full_training_profile": chosen,
            "retry_semantics": retry_semantics(spec, selected),
            "provenance_note": provenance_note(evidence, spec.smoke.args)}


def validate(record: Mapping[str, Any]) -> list[str]:
    """Problems of `record` against SCHEMA (empty: valid). Unknown top-level keys are problems too."""
    problems = [f"{k}: not in the schema" for k in record if k not in _TOP]
    for path, types, required, _ in SCHEMA:
        for where, value, present in _walk(record, path):
            if not present:
                if required:
                    problems.append(f"{where}: missing")
                continue
            if not _is(value, types):
                problems.append(f"{where}: expected {types}, got {type(value).__name__}")
            elif path.endswith("].outcome") and value not in OUTCOMES:
                problems.append(f"{where}: expected one of {', '.join(OUTCOMES)}, got {value!r}")
    return problems


def _walk(record: Any, path: str) -> list[tuple[str, Any, bool]]:
    """Every (concrete path, value, present) that `path` names; parents that are null or absent end the walk
    (their own row reports them)."""
    nodes: list[tuple[str, Any]] = [("", record)]
    missing: list[tuple[str, Any, bool]] = []
    parts = path.split(".")
    for i, part in enumerate(parts):
        last = i == len(parts) - 1
        many = part.endswith("[]")
        key = part[:-2] if many else part
        nxt: list[tuple[str, Any]] = []
        for where, node in nodes:
            if not isinstance(node, Mapping):
                continue
            here = f"{where}.{key}" if where else key
            if key not in node:
                if last:
                    missing.append((here, None, False))
                continue
            value = node[key]
            if many and isinstance(value, list) and not last:
                nxt.extend((f"{here}[{j}]", v) for j, v in enumerate(value))
            else:
                nxt.append((here, value))
        nodes = nxt
    return missing + [(w, v, True) for w, v in nodes]


def _is(value: Any, types: str) -> bool:
    checks = {"integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
              "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
              "string": lambda v: isinstance(v, str), "bool": lambda v: isinstance(v, bool),
              "object": lambda v: isinstance(v, Mapping), "array": lambda v: isinstance(v, list),
              "null": lambda v: v is None}
    return any(checks[t](value) for t in types.split("|"))


def _eval_off(args: Sequence[str]) -> bool:
    """Whether the smoke template disables eval ("--eval-every 0" / "--eval-every=0")."""
    items = list(args)
    for i, a in enumerate(items):
        if a in ("--eval-every", "--eval_every") and i + 1 < len(items) and items[i + 1] == "0":
            return True
        if a in ("--eval-every=0", "--eval_every=0"):
            return True
    return False
