"""Slurm job state: parsing what `scontrol`, `sacct`, `squeue` and the jobcomp file say, and mapping it
to babysit's exit info. Pure: text in, frozen dataclasses out; the executor does the calling.

Sources, best first: `scontrol show job -o ID` while slurmctld still holds the job (it forgets ended
jobs after MinJobAge, 300 s by default); `sacct` where accounting runs; the jobcomp/filetxt file where
configured; the `exit.json` the batch script writes into the attempt directory at its end; the last
state babysit saw. "The job vanished" is a state of its own, never read as "completed".
"""

from __future__ import annotations

import re
import signal as signals
import time
from dataclasses import dataclass

from babysit.executors import ExitInfo

# States after which the job will not run again (a requeued PREEMPTED job comes back as PENDING).
TERMINAL = frozenset({"COMPLETED", "FAILED", "OUT_OF_MEMORY", "TIMEOUT", "CANCELLED", "NODE_FAIL", "PREEMPTED",
                      "BOOT_FAIL", "DEADLINE", "SPECIAL_EXIT", "REVOKED"})
VANISHED = "VANISHED"  # babysit's own: Slurm no longer knows the job and nothing recorded its end

# Slurm's end states that say the job did not end by itself: the classifier must see "crashed" with
# the state named, whatever the trainer's exit code was (a TIMEOUT's SIGTERM makes the reference
# trainer exit 10, which would otherwise read as an ordinary stop).
SCHEDULER_KILLED = {
    "TIMEOUT": "the time limit (--time) ran out",
    "NODE_FAIL": "a node of the job failed",
    "PREEMPTED": "the job was preempted by a higher-priority job",
    "BOOT_FAIL": "a node of the job failed to boot",
    "DEADLINE": "the job reached its --deadline",
    "REVOKED": "a sibling cluster started the job (federation)",
}

OOM_LINE = ("slurmstepd: error: Detected oom-kill: Slurm ended job {job} OUT_OF_MEMORY — host MemoryError: "
            "the job exceeded its memory limit (--mem / --mem-per-cpu)")

_KV_SPLIT = re.compile(r" (?=[A-Za-z][A-Za-z0-9_/:.\-]*=)")
_TRES_GPU = re.compile(r"(?:^|,)gres/gpu(?::[^=,]+)?=(\d+)")
_GRES_GPU = re.compile(r"gpu(?::[^:,()]+)?:(\d+)")


@dataclass(frozen=True)
class JobState:
    """One look at a job. `state` is Slurm's base state ("CANCELLED by 0" → "CANCELLED")."""

    job_id: str
    state: str
    source: str  # scontrol | sacct | jobcomp | exit-file | squeue | last-seen
    reason: str | None = None  # the pending reason (squeue %r / scontrol Reason)
    exit_code: int | None = None
    exit_signal: int | None = None
    start: float | None = None  # unix seconds; only real once the job has left PENDING
    end: float | None = None
    alloc_gpus: int | None = None
    nodes: str | None = None
    seen_at: float | None = None  # when babysit read it (wall clock)
    restarts: int | None = None  # how often Slurm requeued the job (scontrol Restarts=); None: not said

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL or self.state == VANISHED

    @property
    def started(self) -> bool:
        """The job ran (or runs): its StartTime is the real one, not the scheduler's estimate."""
        return self.state not in ("PENDING", "") and self.start is not None

    def to_dict(self) -> dict[str, object]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}

    @classmethod
    def from_dict(cls, data: dict[str, object]) -> JobState:
        known = {k: data[k] for k in cls.__dataclass_fields__ if k in data}
        return cls(**known)  # type: ignore[arg-type]


def base_state(text: str) -> str:
    """ "CANCELLED by 1000" → "CANCELLED"; "COMPLETED+" → "COMPLETED"; unknown text is kept, uppercased."""
    word = text.strip().split(" ", 1)[0].rstrip("+").upper()
    return word


def parse_kv(line: str) -> dict[str, str]:
    """`Key=Value Key2=Value with spaces …` (scontrol -o, jobcomp/filetxt) → dict.

    Values may hold spaces (Reason, Command), so a pair ends only where the next `Key=` begins.
    """
    out: dict[str, str] = {}
    for part in _KV_SPLIT.split(line.strip()):
        key, sep, value = part.partition("=")
        if sep:
            out[key] = value.strip()
    return out


def parse_time(text: str | None) -> float | None:
    """Slurm's local `2026-11-29T18:51:03` → unix seconds; Unknown/None/N/A/empty → None."""
    if not text or text in ("Unknown", "None", "N/A", "(null)", "0"):
        return None
    try:
        return time.mktime(time.strptime(text.strip(), "%Y-%m-%dT%H:%M:%S"))
    except ValueError:
        return None


def parse_exit_code(text: str | None) -> tuple[int | None, int | None]:
    """`ExitCode=N:S` → (exit code, signal). S is the signal that ended the batch script, 0 for none."""
    if not text:
        return None, None
    code, _, sig = text.strip().partition(":")
    try:
        exit_code = int(code)
        exit_signal = int(sig) if sig else 0
    except ValueError:
        return None, None
    return exit_code, (exit_signal or None)


def gpus_from_tres(text: str | None) -> int | None:
    """`cpu=8,mem=64G,node=1,billing=8,gres/gpu=4,gres/gpu:h200=4` → 4.

    The untyped `gres/gpu=` count is the total; only typed entries (older Slurm) are summed.
    None when the TRES names no GPU.
    """
    if not text:
        return None
    untyped = re.search(r"(?:^|,)gres/gpu=(\d+)", text)
    if untyped:
        return int(untyped.group(1))
    typed = _TRES_GPU.findall(text)
    return sum(int(n) for n in typed) if typed else None


def gpus_from_gres(text: str | None) -> int | None:
    """A gres request `gpu:h200:8` / `gpu:2` / `gpu` (per node) → 8 / 2 / 1; None for a non-GPU gres."""
    if not text:
        return None
    total = 0
    found = False
    for item in text.split(","):
        item = item.strip()
        if item == "gpu" or item.startswith("gpu:") or item.startswith("gres/gpu"):
            found = True
            m = _GRES_GPU.fullmatch(item.removeprefix("gres/"))
            total += int(m.group(1)) if m else 1
    return total if found else None


def from_scontrol(job_id: str, text: str, now: float) -> JobState | None:
    """`scontrol show job -o ID` → JobState; None when slurmctld no longer knows the job."""
    for line in text.splitlines():
        kv = parse_kv(line)
        if kv.get("JobId") != job_id:
            continue
        code, sig = parse_exit_code(kv.get("ExitCode"))
        alloc = gpus_from_tres(kv.get("AllocTRES") or kv.get("TRES"))
        reason = kv.get("Reason")
        return JobState(job_id=job_id, state=base_state(kv.get("JobState", "")), source="scontrol",
                        reason=None if reason in (None, "None", "(null)") else reason,
                        exit_code=code, exit_signal=sig, start=parse_time(kv.get("StartTime")),
                        end=parse_time(kv.get("EndTime")), alloc_gpus=alloc,
                        nodes=_none(kv.get("NodeList")), seen_at=now, restarts=_int(kv.get("Restarts")))
    return None


def requeued_run(last: JobState | None, job: JobState) -> dict[str, object] | None:
    """The run of a job that Slurm requeued (`scontrol requeue`, a preemption with PreemptMode=REQUEUE,
    `--requeue` after a node failure) between two looks: the same job id, its restart count up. Slurm
    forgets that run's StartTime once it requeues, so it is kept here: from the last start babysit saw to
    when it saw the requeue — the job's new start if it already runs again, else now (at most one poll
    late). None when nothing was requeued, or when the earlier run was never seen started."""
    if last is None or job.restarts is None or job.restarts <= (last.restarts or 0):
        return None
    if not last.started or last.start is None:
        return None
    seen = job.seen_at if job.seen_at is not None else last.start
    end = min(seen, job.start) if job.started and job.start is not None else seen
    return {"restart": job.restarts, "start": last.start, "end": max(last.start, end), "nodes": last.nodes,
            "state": job.state}


SACCT_FIELDS = "JobID,State,ExitCode,Start,End,AllocTRES,NodeList,Reason"


def from_sacct(job_id: str, text: str, now: float) -> JobState | None:
    """`sacct -X -j ID -n -P -o SACCT_FIELDS` → JobState of the allocation (steps are excluded by -X)."""
    found = None
    for line in text.splitlines():
        parts = line.split("|")
        if len(parts) < 5 or parts[0].split(".")[0] != job_id:
            continue
        code, sig = parse_exit_code(parts[2])
        found = JobState(job_id=job_id, state=base_state(parts[1]), source="sacct", exit_code=code, exit_signal=sig,
                         start=parse_time(parts[3]), end=parse_time(parts[4]),
                         alloc_gpus=gpus_from_tres(parts[5]) if len(parts) > 5 else None,
                         nodes=_none(parts[6]) if len(parts) > 6 else None,
                         reason=_none(parts[7]) if len(parts) > 7 else None, seen_at=now)
    return found  # the last line wins: a requeued job lists its earlier runs first


def from_jobcomp(job_id: str, text: str, now: float) -> JobState | None:
    """A jobcomp/filetxt file (one `JobId=… JobState=… ExitCode=…` line per ended job) → the job's last line."""
    found = None
    needle = f"JobId={job_id} "
    for line in text.splitlines():
        if not line.startswith(needle):
            continue
        kv = parse_kv(line)
        code, sig = parse_exit_code(kv.get("ExitCode"))
        found = JobState(job_id=job_id, state=base_state(kv.get("JobState", "")), source="jobcomp",
                         exit_code=code, exit_signal=sig, start=parse_time(kv.get("StartTime")),
                         end=parse_time(kv.get("EndTime")), alloc_gpus=gpus_from_tres(kv.get("Tres")),
                         nodes=_none(kv.get("NodeList")), seen_at=now)
    return found


def from_exit_file(job_id: str, data: dict[str, object], last: JobState | None, now: float) -> JobState:
    """The batch script's own `exit.json` ({"exit_code", "ended_at", "started_at"}): the end of a job
    Slurm has forgotten. Its state is COMPLETED or FAILED by the exit code, as Slurm would say."""
    code = data.get("exit_code")
    exit_code = int(code) if isinstance(code, (int, float)) else None
    sig = None
    if exit_code is not None and exit_code > 128 and exit_code - 128 in (signals.SIGTERM, signals.SIGKILL):
        sig = exit_code - 128
    start = data.get("started_at")
    end = data.get("ended_at")
    return JobState(job_id=job_id, state="COMPLETED" if exit_code == 0 else "FAILED", source="exit-file",
                    exit_code=exit_code, exit_signal=sig,
                    start=float(start) if isinstance(start, (int, float)) else (last.start if last else None),
                    end=float(end) if isinstance(end, (int, float)) else None,
                    alloc_gpus=last.alloc_gpus if last else None, nodes=last.nodes if last else None, seen_at=now)


def vanished(job_id: str, last: JobState | None, now: float) -> JobState:
    """Slurm forgot the job and nothing recorded how it ended: say so, with what was last seen."""
    seen = f"last seen {last.state} via {last.source}" if last else "never seen"
    return JobState(job_id=job_id, state=VANISHED, source="last-seen", reason=seen,
                    start=last.start if last else None, end=last.seen_at if last else now,
                    alloc_gpus=last.alloc_gpus if last else None, nodes=last.nodes if last else None, seen_at=now)


def exit_info(job: JobState, stderr_tail: str) -> ExitInfo:
    """How an ended job reads to babysit's classifier (see `classify.classify_exit`).

    - COMPLETED, FAILED, CANCELLED: the batch script's exit code and signal, as they are (a CANCELLED
      that babysit asked for is a stop; the supervisor knows it asked) — except a CANCELLED with
      ExitCode 0:0 (cancelled while PENDING), which reads as SIGTERM, never as a successful exit 0.
    - OUT_OF_MEMORY: a slurmstepd-style line naming a host MemoryError is appended to the stderr tail,
      so the classifier says `oom` (CPU OOM) even when the OOM killer left the trainer no time to speak.
    - TIMEOUT, NODE_FAIL, PREEMPTED, BOOT_FAIL, DEADLINE: exit status withheld (the trainer's own
      "stopped on SIGTERM" code would read as a clean stop) and a line naming the state appended: `crashed`.
    - VANISHED: exit status unknown, `crashed`, with what was last seen in the note.
    """
    ec = "?" if job.exit_code is None else f"{job.exit_code}:{job.exit_signal or 0}"
    note = f"Slurm job {job.job_id} {job.state} (ExitCode {ec}, from {job.source})"
    tail = stderr_tail
    code, sig = job.exit_code, job.exit_signal
    if job.state == "OUT_OF_MEMORY":
        tail = _append(tail, OOM_LINE.format(job=job.job_id))
    elif job.state in SCHEDULER_KILLED:
        tail = _append(tail, f"babysit: Slurm ended job {job.job_id} {job.state}: {SCHEDULER_KILLED[job.state]}")
        code, sig = None, None
    elif job.state == "CANCELLED":
        tail = _append(tail, f"babysit: Slurm job {job.job_id} was CANCELLED (scancel)")
        if not code and not sig:
            # ExitCode 0:0 on a cancel: the job never ran (cancelled while PENDING) or its shell was
            # terminated without a status. Never "exit 0": a cancelled job did not complete.
            code, sig = None, signals.SIGTERM
            note += ": cancelled before it ran or without an exit status"
    elif job.state == VANISHED:
        tail = _append(tail, f"babysit: Slurm job {job.job_id} vanished ({job.reason}); its end was not recorded "
                             "(no accounting, no jobcomp, no exit file)")
        note = f"Slurm job {job.job_id} vanished: {job.reason}"
        code, sig = None, None
    elif job.state not in ("COMPLETED", "FAILED"):
        tail = _append(tail, f"babysit: Slurm job {job.job_id} ended {job.state}")
    return ExitInfo(exit_code=code, signal=sig, ended_at=job.end or job.seen_at, stderr_tail=tail, note=note,
                    state=job.state)


MACHINE_LOST = ("NODE_FAIL", "BOOT_FAIL")  # ends that are a node's fault: the run is resubmitted without it


def lost_nodes(sinfo_text: str) -> tuple[str, ...]:
    """The nodes `sinfo -h -N -o "%N %T"` shows down, failed, drained or not responding (`*`), sorted."""
    lost = set()
    for line in sinfo_text.splitlines():
        parts = line.split()
        if len(parts) >= 2 and (parts[1].endswith("*") or parts[1].startswith(("down", "fail", "drain"))):
            lost.add(parts[0])
    return tuple(sorted(lost))


def status_note(job: JobState | None) -> str | None:
    """One line for polls: why a job waits, or where it runs."""
    if job is None:
        return None
    again = f", requeued {job.restarts}×" if job.restarts else ""  # the same job, run again
    if job.state == "PENDING":
        return f"Slurm job {job.job_id} PENDING ({job.reason or 'no reason given'}){again}"
    if job.state == "RUNNING":
        return f"Slurm job {job.job_id} RUNNING on {job.nodes or '?'}{again}"
    if job.terminal:
        return None
    return f"Slurm job {job.job_id} {job.state}" + (f" ({job.reason})" if job.reason else "") + again


def _append(tail: str, line: str) -> str:
    return f"{tail.rstrip()}\n{line}" if tail.strip() else line


def _int(text: str | None) -> int | None:
    return int(text) if text is not None and text.isdigit() else None


def _none(text: str | None) -> str | None:
    return None if text in (None, "", "None", "(null)", "Unknown") else text
