"""Every rank's stack on this node, for a stalled Slurm job: `python -m babysit.run.node_stacks --job-id J`.

The daemon runs it on each node of the job through `srun --overlap` (babysit/executors/slurm.py,
`SlurmExecutor.stack_dump`), since its own host cannot see the job's processes. On the node it finds the
job's ranks (processes whose environment holds SLURM_JOB_ID=J and RANK, on this node's SLURMD_NODENAME:
several slurmd may share a host), dumps each with py-spy (`stackdump.stack_dump`: a stopped rank read
without suspending it) and prints one JSON line: the node, and each rank's pid, rank, process state and
stack.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
from pathlib import Path

from babysit.run.stackdump import proc_state, stack_dump


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
        if env.get("SLURM_JOB_ID") != job_id or "RANK" not in env:
            continue
        if node is not None and env.get("SLURMD_NODENAME", node) != node:
            continue
        out[int(entry.name)] = env
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m babysit.run.node_stacks")
    p.add_argument("--job-id", required=True)
    p.add_argument("--timeout", type=float, default=15.0)
    args = p.parse_args(argv)
    node = os.environ.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]
    ranks = job_ranks(args.job_id, os.environ.get("SLURMD_NODENAME"))
    dumps = stack_dump(frozenset(ranks), timeout_s=args.timeout) if ranks else {}
    procs = [{"pid": pid, "rank": int(env.get("RANK", -1)), "local_rank": env.get("LOCAL_RANK"),
              "state": proc_state(pid), "stack": dumps.get(str(pid))} for pid, env in sorted(ranks.items())]
    note = dumps.get("note") or (None if ranks else f"no rank of job {args.job_id} on {node}")
    print(json.dumps({"node": node, "procs": procs, "note": note}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
