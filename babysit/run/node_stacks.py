"""Every rank's stack on this node, for a stalled Slurm job: `python -m babysit.run.node_stacks --job-id J`.

The daemon runs it on each node of the job through `srun --overlap` (babysit/executors/slurm.py,
`SlurmExecutor.stack_dump`), since its own host cannot see the job's processes. On the node it finds the
job's ranks (processes whose environment holds SLURM_JOB_ID=J and RANK, on this node's SLURMD_NODENAME:
several slurmd may share a host), dumps each with py-spy (`stackdump.stack_dump`: a stopped rank read
without suspending it) and prints one JSON line: the node, and each rank's pid, rank, process state and
stack. It writes the same line to `stacks/node-<node>.json` too: srun interleaves two nodes' long lines
(stacks run to tens of KiB) when they print at once, and a file on the shared disk is whole.

A rank that runs PyTorch's flight recorder (TORCH_NCCL_TRACE_BUFFER_SIZE or TORCH_FR_BUFFER_SIZE above 0 in
its environment) dumps its ring of collectives to `<TORCH_NCCL_DEBUG_INFO_TEMP_FILE><rank>` (newer PyTorch:
TORCH_FR_DUMP_TEMP_FILE) on an NCCL timeout, or when its dump pipe is written. That file is on the node's
own disk unless the prefix points at a shared one. So each node asks its ranks' pipes for a dump, waits a
moment, and copies each rank's dump written since the rank started into `stacks/` of its working directory
(the daemon runs it in the attempt directory): `stacks/nccl_trace_rank_<rank>`, named in its JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from babysit.probes.host import process_create_time
from babysit.run.stackdump import proc_state, stack_dump
from babysit.runtime.atomic import write_atomic

STACKS_DIR = "stacks"  # beside the daemon's attempt files: where every node's flight records are gathered
RECORD_NAME = "nccl_trace_rank_"  # a gathered record's name: this, then the rank (babysit/run/nccl.py's prefix)
DEFAULT_TEMP_FILE = "/tmp/nccl_trace_rank_"  # PyTorch's, where the rank's environment names none
DUMP_WAIT_S = 3.0  # how long a node waits for the dumps it asked for


def environ(pid: int) -> dict[str, str]:
    """A process's environment (empty when it cannot be read: another user's, or gone)."""
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    pairs = (item.split(b"=", 1) for item in raw.split(b"\0") if b"=" in item)
    return {k.decode(errors="replace"): v.decode(errors="replace") for k, v in pairs}


def job_ranks(job_id: str, node: str | None) -> dict[int, dict[str, str]]:
    """pid -> environment of every rank of job `job_id` on this node."""
    out = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        env = environ(int(entry.name))
        if env.get("SLURM_JOB_ID") != job_id or not env.get("RANK", "").isdigit():
            continue  # not the job's, or not a rank (the probe sidecar runs in the job with RANK cleared)
        if node is not None and env.get("SLURMD_NODENAME", node) != node:
            continue
        out[int(entry.name)] = env
    return out


def recorder(env: Mapping[str, str]) -> tuple[str, str | None] | None:
    """(the dump file's prefix, the dump pipe's prefix) of a rank whose flight recorder is on; None when off."""
    size = env.get("TORCH_FR_BUFFER_SIZE") or env.get("TORCH_NCCL_TRACE_BUFFER_SIZE") or "0"
    if not size.strip().isdigit() or int(size) <= 0:
        return None
    temp = env.get("TORCH_FR_DUMP_TEMP_FILE") or env.get("TORCH_NCCL_DEBUG_INFO_TEMP_FILE") or DEFAULT_TEMP_FILE
    return temp, env.get("TORCH_NCCL_DEBUG_INFO_PIPE_FILE") or None


def gather_records(ranks: Mapping[int, Mapping[str, str]], into: Path, *,
                   wait_s: float = DUMP_WAIT_S) -> tuple[list[dict[str, Any]], list[str]]:
    """Each recording rank's flight record on this node, asked for and copied into `into`: (what was
    gathered, {"rank", "from", "to", "bytes"} each; what was not, in words). A dump older than its rank
    is an earlier run's, never this one's."""
    wanted: dict[int, tuple[Path, float]] = {}  # rank -> (its dump file, its process's start)
    for pid, env in ranks.items():
        found = recorder(env)
        rank = env.get("RANK", "")
        if found is None or not rank.isdigit():
            continue
        temp, pipe = found
        wanted[int(rank)] = (Path(temp + rank), process_create_time(pid) or 0.0)
        if pipe:
            _ask(Path(f"{pipe}{rank}.pipe"))
    deadline = time.monotonic() + wait_s
    while any(not _fresh(*w) for w in wanted.values()) and time.monotonic() < deadline:
        time.sleep(0.2)
    gathered, missing = [], []
    for rank, (path, started) in sorted(wanted.items()):
        if not _fresh(path, started):
            missing.append(f"rank {rank}: flight recorder on, but no dump at {path} since it started")
            continue
        into.mkdir(parents=True, exist_ok=True)
        to = into / f"{RECORD_NAME}{rank}"
        try:
            if to.resolve() != path.resolve():  # a prefix that already points here: nothing to copy
                shutil.copyfile(path, to)
        except OSError as exc:
            missing.append(f"rank {rank}: cannot copy {path}: {exc.strerror or exc}")
            continue
        gathered.append({"rank": rank, "from": str(path), "to": str(to.resolve()), "bytes": to.stat().st_size})
    return gathered, missing


def _fresh(path: Path, started: float) -> bool:
    try:
        return path.stat().st_mtime >= started - 1.0
    except OSError:
        return False


def _ask(pipe: Path) -> None:
    """Write to a rank's dump pipe (PyTorch dumps its record when it is written); nobody reading: nothing."""
    try:
        fd = os.open(pipe, os.O_WRONLY | os.O_NONBLOCK)
    except OSError:
        return
    try:
        os.write(fd, b"1\n")
    except OSError:
        pass
    finally:
        os.close(fd)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m babysit.run.node_stacks")
    p.add_argument("--job-id", required=True)
    p.add_argument("--timeout", type=float, default=15.0)
    p.add_argument("--into", default=STACKS_DIR, help="where the ranks' flight records are copied")
    args = p.parse_args(argv)
    node = os.environ.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]
    ranks = job_ranks(args.job_id, os.environ.get("SLURMD_NODENAME"))
    dumps = stack_dump(frozenset(ranks), timeout_s=args.timeout) if ranks else {}
    procs = [{"pid": pid, "rank": int(env.get("RANK", -1)), "local_rank": env.get("LOCAL_RANK"),
              "state": proc_state(pid), "stack": dumps.get(str(pid))} for pid, env in sorted(ranks.items())]
    note = dumps.get("note") or (None if ranks else f"no rank of job {args.job_id} on {node}")
    records, missing = gather_records(ranks, Path(args.into))  # after the stacks: a dump never delays them
    line = json.dumps({"node": node, "procs": procs, "note": note, "flight_records": records,
                       "flight_missing": missing})
    try:
        Path(args.into).mkdir(parents=True, exist_ok=True)
        write_atomic(Path(args.into) / f"node-{node}.json", line + "\n")
    except OSError as exc:
        print(f"babysit.run.node_stacks: cannot write {args.into}/node-{node}.json: {exc}", file=sys.stderr)
    print(line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
