"""`babysit node list|quarantine|release NAME`: the Slurm nodes babysit keeps runs off.

A node Slurm lost under a run's job (NODE_FAIL, BOOT_FAIL) is quarantined at once: every later
submission of every run of this registry is made with `--exclude` of it. `release` lifts it once the
node is fixed; the next submissions may use it again (babysit/executors/slurm_nodes.py).
"""

from __future__ import annotations

import argparse
import getpass
import re
import time

from babysit.core.errors import BadInput
from babysit.executors import slurm_nodes
from babysit.runtime import registry

_NODE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]*")  # one Slurm node name, not a hostlist (n[1-3])


def run(args: argparse.Namespace) -> int:
    state_dir = registry.load(registry.resolve_registry_path(args.registry)).state_dir
    rows = slurm_nodes.quarantined(state_dir)
    if args.action == "list":
        lines = slurm_nodes.lines(rows)
        print("\n".join(lines) if lines else "no node is quarantined")
        return 0
    if not args.name or not _NODE.fullmatch(args.name):
        got = f", got {args.name!r}" if args.name else ""
        raise BadInput(f"babysit node {args.action}: expected one Slurm node name (as sinfo -N lists it){got}",
                       hint=f"`babysit node {args.action} n17`; `babysit node list` shows the quarantined ones")
    if args.action == "quarantine":
        new = slurm_nodes.quarantine(state_dir, [args.name], args.reason or "quarantined by hand", time.time(),
                                     by=f"cli:{getpass.getuser()}")
        print(f"node {args.name} " + ("quarantined: no run is submitted to it until `babysit node release "
                                      f"{args.name}`" if new else "was already quarantined"))
        return 0
    if not slurm_nodes.release(state_dir, args.name):
        raise BadInput(f"babysit node release: node {args.name} is not quarantined "
                       f"(quarantined: {', '.join(rows) or 'none'})", hint="`babysit node list` shows them")
    print(f"node {args.name} released: the next submissions may use it again")
    return 0
