"""A hung collective explained: which rank never entered it, and whether its GPU is to blame.

At launch babysit turns on PyTorch's flight recorder (unless the user set it): a ring of the last
collectives each rank entered, dumped to `<attempt dir>/nccl_trace_rank_<rank>` on an NCCL timeout,
or at once when babysit writes to the rank's dump pipe. When a multi-rank run stalls, the stall guard
has already taken every rank's stack (babysit/run/stackdump.py); then `explain_stall`:

1. maps each dumped process to its rank (RANK / LOCAL_RANK in its environment);
2. asks every rank for its flight record (the dump pipe) and reads the files in PyTorch's format
   (a pickle of plain data, read with an unpickler that builds nothing but built-in values);
   the rank whose newest collective is behind the others' never entered the collective the others
   wait in; the same sequence number with different operations is a mismatch;
3. without records (gloo before the recorder, a trainer that disabled it): the stacks say it — the
   ranks waiting in a collective and the ones that are not;
   a rank whose process is stopped (state T: SIGSTOP, a debugger) is named whatever the records and
   stacks say: it answers no dump request, and may have been stopped inside the collective itself,
   where its stack looks like the others';
4. the verdict: a missing rank whose GPU shows a machine-side signal → `gpu-fault`; the ranks named
   and their GPUs healthy → the trainer's bug (a rank that skipped or reordered a collective); nothing
   conclusive → said so.

PyTorch's own analyser (`python -m torch.distributed.flight_recorder.fr_trace`) runs too where the
trainer's interpreter has it; its output (or why there is none) is attached.
"""

from __future__ import annotations

import io
import json
import os
import pickle
import re
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from babysit.run.stackdump import proc_state

TRACE_PREFIX = "nccl_trace_rank_"
PIPE_PREFIX = "nccl_pipe_rank_"
TRACE_BUFFER = "2000"  # collectives kept per rank (PyTorch's default is 0: off)
DUMP_WAIT_S = 5.0  # how long to wait for the ranks' records after asking
ANALYSER_TIMEOUT_S = 20.0

# frames that mean "this rank waits in a collective" in a py-spy dump
_COLLECTIVE = re.compile(r"^\s*(all_reduce|all_gather\w*|reduce_scatter\w*|broadcast\w*|barrier|all_to_all\w*|"
                         r"reduce|gather|scatter|send|recv|isend|irecv|wait|_wait|synchronize|monitored_barrier)"
                         r"\s*\(", re.M)


def flight_recorder_env(env: Mapping[str, str], attempt_dir: Path) -> dict[str, str]:
    """The flight recorder's variables babysit adds to a launch: only those the user did not set."""
    wanted = {"TORCH_NCCL_TRACE_BUFFER_SIZE": TRACE_BUFFER, "TORCH_FR_BUFFER_SIZE": TRACE_BUFFER,
              "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
              "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": str(attempt_dir / TRACE_PREFIX),
              "TORCH_NCCL_DEBUG_INFO_PIPE_FILE": str(attempt_dir / PIPE_PREFIX)}
    if "TORCH_NCCL_TRACE_BUFFER_SIZE" in env or "TORCH_FR_BUFFER_SIZE" in env:  # the user's size, either name
        wanted.pop("TORCH_NCCL_TRACE_BUFFER_SIZE")
        wanted.pop("TORCH_FR_BUFFER_SIZE")
    return {k: v for k, v in wanted.items() if k not in env}


# -- ranks ----------------------------------------------------------------------------------------


def rank_of(pid: int) -> tuple[int, int | None] | None:
    """(RANK, LOCAL_RANK) from a process's environment; None for a process that is no rank (torchrun's
    agent, babysit's shim) or one babysit cannot read."""
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return None
    env = dict(item.split(b"=", 1) for item in raw.split(b"\0") if b"=" in item)
    if b"RANK" not in env:
        return None
    try:
        local = env.get(b"LOCAL_RANK")
        return int(env[b"RANK"]), None if local is None else int(local)
    except ValueError:
        return None


def main_thread(stack: str) -> str:
    """The main thread's frames of a py-spy dump (a rank's other threads — a data loader, a watchdog —
    wait for other reasons); the whole text when no thread is named."""
    blocks = re.split(r"(?m)^(?=Thread )", stack)
    threads = [b for b in blocks if b.startswith("Thread ")]
    main = next((b for b in threads if '"MainThread"' in b.splitlines()[0]), threads[0] if threads else stack)
    return "\n".join(main.splitlines()[1:]) if main.startswith("Thread ") else main


def top_frame(stack: str) -> str | None:
    """The innermost frame of the main thread in a py-spy dump ("all_reduce (…/distributed_c10d.py:2501)")."""
    for line in main_thread(stack).splitlines():
        s = line.strip()
        if s and not s.startswith(("Process ", "Python ", "Thread ")):
            return s[:200]
    return None


# -- flight records -------------------------------------------------------------------------------


class _PlainUnpickler(pickle.Unpickler):
    """Built-in values only: a record is the run's data, and unpickling must never run its code."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"refusing {module}.{name}: a flight record holds plain data only")


def load_record(path: Path) -> dict[str, Any]:
    """One rank's flight record (PyTorch writes a pickle; its JSON dump is read too)."""
    data = path.read_bytes()
    if data[:1] in (b"{", b"["):
        return json.loads(data)
    return _PlainUnpickler(io.BytesIO(data)).load()


def ask_for_records(attempt_dir: Path) -> list[int]:
    """Write to every rank's dump pipe (PyTorch dumps its record when its pipe is written); the ranks asked."""
    asked = []
    for pipe in sorted(attempt_dir.glob(PIPE_PREFIX + "*")):
        suffix = pipe.name[len(PIPE_PREFIX):].removesuffix(".pipe")
        if not suffix.isdigit():
            continue
        try:
            fd = os.open(pipe, os.O_WRONLY | os.O_NONBLOCK)
        except OSError:
            continue  # nobody reads it (the rank died, or its PyTorch has no pipe)
        try:
            os.write(fd, b"1\n")
            asked.append(int(suffix))
        except OSError:
            pass
        finally:
            os.close(fd)
    return asked


def read_records(attempt_dir: Path) -> tuple[dict[int, dict[str, Any]], list[str]]:
    """Every rank's record in the attempt dir: rank -> record, and the files that could not be read."""
    records: dict[int, dict[str, Any]] = {}
    bad: list[str] = []
    for path in sorted(attempt_dir.glob(TRACE_PREFIX + "*")):
        suffix = path.name[len(TRACE_PREFIX):]
        if not suffix.isdigit():
            continue
        try:
            record = load_record(path)
            if not isinstance(record, dict) or not isinstance(record.get("entries"), list):
                raise ValueError("no 'entries' list")
            records[int(suffix)] = record
        except (OSError, ValueError, EOFError, pickle.UnpicklingError) as exc:
            bad.append(f"{path.name}: {type(exc).__name__}: {exc}"[:200])
    return records, bad


def behind(records: Mapping[int, Mapping[str, Any]]) -> dict[str, Any]:
    """From the records: per process group, each rank's newest collective; the ranks behind the newest
    (they never entered it); and mismatches (one sequence number, different operations or sizes)."""
    newest: dict[str, dict[int, dict[str, Any]]] = {}
    ops: dict[tuple[str, int], dict[int, tuple[Any, Any]]] = {}
    for rank, record in records.items():
        for e in record.get("entries") or ():
            if not isinstance(e, Mapping) or e.get("is_p2p"):
                continue
            pg = str((e.get("process_group") or (e.get("pg_id"), ""))[0])
            seq = int(e.get("collective_seq_id") or 0)
            ops.setdefault((pg, seq), {})[rank] = (e.get("profiling_name"), json.dumps(e.get("input_sizes")))
            if seq >= int(newest.setdefault(pg, {}).get(rank, {}).get("collective_seq_id") or -1):
                newest[pg][rank] = dict(e)
    missing: dict[int, dict[str, Any]] = {}
    groups = {}
    for pg, by_rank in newest.items():
        top = max(int(e.get("collective_seq_id") or 0) for e in by_rank.values())
        waiting = next(e for e in by_rank.values() if int(e.get("collective_seq_id") or 0) == top)
        groups[pg] = {"newest_seq": top, "op": waiting.get("profiling_name"),
                      "ranks": {r: int(e.get("collective_seq_id") or 0) for r, e in sorted(by_rank.items())}}
        for rank in records:
            seq = int(by_rank[rank].get("collective_seq_id") or 0) if rank in by_rank else -1
            if seq < top:
                missing.setdefault(rank, {"pg": pg, "last_seq": seq if seq >= 0 else None, "waited_seq": top,
                                          "op": waiting.get("profiling_name")})
    mismatches = [{"pg": pg, "seq": seq, "ops": {r: o[0] for r, o in sorted(by.items())}}
                  for (pg, seq), by in sorted(ops.items()) if len(set(by.values())) > 1]
    return {"groups": groups, "missing": missing, "mismatches": mismatches}


def run_analyser(python: str | None, attempt_dir: Path) -> str:
    """PyTorch's own analyser over the records, where the trainer's interpreter has it: its text, or why not."""
    if python is None:
        return "PyTorch's analyser not run: the trainer's interpreter is unknown"
    try:
        done = subprocess.run([python, "-m", "torch.distributed.flight_recorder.fr_trace", str(attempt_dir),
                               "-p", TRACE_PREFIX, "--allow-incomplete-ranks"], capture_output=True, text=True,
                              timeout=ANALYSER_TIMEOUT_S, stdin=subprocess.DEVNULL, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"PyTorch's analyser not run: {type(exc).__name__}: {exc}"[:300]
    text = (done.stdout + ("\n" + done.stderr if done.returncode else "")).strip()
    if done.returncode:
        last = [line for line in text.splitlines() if line.strip()][-1:] or ["no output"]
        return f"PyTorch's analyser failed (exit {done.returncode}): {last[0][:200]}"
    return text[-4000:] or "PyTorch's analyser found nothing to report"


# -- the explanation ------------------------------------------------------------------------------


def explain_stall(stacks: Mapping[str, str], attempt_dir: Path, gpus: Sequence[int],
                  evidence: Sequence[Mapping[str, Any]] | None, *,
                  wait_s: float = DUMP_WAIT_S) -> dict[str, Any] | None:
    """Which rank the others wait for, from the flight records or else the stacks; None when the run has
    fewer than two ranks (a single process stalls for other reasons). See the module docstring."""
    ranks: dict[int, dict[str, Any]] = {}
    python = None
    for pid_text, stack in stacks.items():
        if not pid_text.isdigit():
            continue
        found = rank_of(int(pid_text))
        if found is None:
            continue
        rank, local = found
        gpu = gpus[local] if local is not None and 0 <= local < len(gpus) else None
        ranks[rank] = {"pid": int(pid_text), "local_rank": local, "gpu": gpu, "top": top_frame(stack),
                       "in_collective": bool(_COLLECTIVE.search(main_thread(stack))),
                       "stopped": proc_state(int(pid_text)) in ("T", "t")}
        python = python or _exe(int(pid_text))
    if len(ranks) < 2:
        return None
    asked = ask_for_records(attempt_dir)
    # a stopped rank cannot answer: wait only for those that can, so a SIGSTOP costs no full wait
    can_answer = set(asked) - {r for r, v in ranks.items() if v["stopped"]}
    records, bad = read_records(attempt_dir)
    deadline = time.monotonic() + (wait_s if can_answer else 0.0)
    while can_answer - set(records) and time.monotonic() < deadline:
        time.sleep(0.2)
        records, bad = read_records(attempt_dir)
    out: dict[str, Any] = {"ranks": {str(r): v for r, v in sorted(ranks.items())}, "records": sorted(records),
                           "unreadable_records": bad, "no_record": sorted(set(ranks) - set(records))}
    if len(records) >= 2:
        found = behind(records)
        missing = sorted(found["missing"])
        out.update(source="flight-recorder", missing_ranks=missing, groups=found["groups"],
                   mismatches=found["mismatches"], analyser=run_analyser(python, attempt_dir))
        waited = next(iter(found["missing"].values()), {})
        how = (f"rank {', '.join(map(str, missing))} never entered {waited.get('op')} #{waited.get('waited_seq')} "
               "that the others wait in (flight recorder)") if missing else ""
    else:
        waiting = sorted(r for r, v in ranks.items() if v["in_collective"])
        missing = sorted(r for r, v in ranks.items() if not v["in_collective"]) if waiting else []
        out.update(source="stacks", missing_ranks=missing, waiting_ranks=waiting)
        how = (f"rank {', '.join(map(str, waiting))} wait in a collective, rank {', '.join(map(str, missing))} "
               f"never entered it (stacks: {ranks[missing[0]]['top']})") if missing else ""
    stopped = sorted(r for r, v in ranks.items() if v["stopped"])
    if stopped and len(stopped) < len(ranks):
        missing = sorted({*missing, *stopped})
        out.update(missing_ranks=missing, stopped_ranks=stopped)
        how = (f"rank {', '.join(map(str, stopped))} is stopped (process state T: SIGSTOP or a debugger) and the "
               "others wait for it" + (f"; {how}" if how else ""))
    machine = {e.get("gpu") for e in evidence or () if e.get("side") == "machine"}
    faulty = [r for r in missing if ranks.get(r, {}).get("gpu") in machine]
    if faulty:
        out["verdict"] = "gpu-fault"
        out["summary"] = (f"{how}; GPU {ranks[faulty[0]]['gpu']} of rank {faulty[0]} shows a machine-side fault: "
                          "the machine's fault")
    elif stopped and len(stopped) < len(ranks):
        out["verdict"] = "stopped"
        out["summary"] = (f"{how}; its GPU shows no fault: something stopped the process (a SIGSTOP, a debugger, "
                          "job control) — SIGCONT resumes it")
    elif missing or out.get("mismatches"):
        out["verdict"] = "trainer"
        mism = out.get("mismatches") or []
        said = how or f"mismatched collectives at #{mism[0]['seq']}: {mism[0]['ops']}"
        out["summary"] = (f"{said}; their GPUs show no fault: the trainer's bug (a rank skipped or reordered a "
                          "collective)")
    else:
        out["verdict"] = "unknown"
        out["summary"] = ("no evidence of which rank is missing: every rank is in a collective (or none is) and "
                          "no flight record says more" + (f"; unreadable records: {bad[0]}" if bad else ""))
    return out


def _exe(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/exe")
    except OSError:
        return None
