"""`babysit gpu list|quarantine|release`: the GPUs babysit keeps off runs after a machine fault.

A GPU is quarantined by its UUID (indices change when a GPU falls off the bus or the box is
re-cabled); the commands take a UUID or an NVML index, which is looked up on this box (or, for a
release, in the quarantine's record when the GPU is not visible any more). A run waiting for a
released GPU launches at its next look (within a minute).
"""

from __future__ import annotations

import argparse
import getpass
import time

from babysit.core.errors import BadInput
from babysit.db.url import open_store
from babysit.probes.gpu import open_gpu_probe
from babysit.run import gpufault
from babysit.runtime import registry


def run(args: argparse.Namespace) -> int:
    reg = registry.load(registry.resolve_registry_path(args.registry))
    store = open_store(reg)  # a fleet's PostgreSQL, or this box's state.db
    try:
        if args.action == "list":
            lines = gpufault.quarantine_lines(store.quarantined_gpus())
            print("\n".join(lines) if lines else "no GPU is quarantined")
            return 0
        if not args.target:
            raise BadInput(f"babysit gpu {args.action}: expected a GPU (UUID or index)",
                           hint=f"`babysit gpu {args.action} GPU-8f3c…` or `babysit gpu {args.action} 0`")
        uuids = _box_uuids(args.gpu_probe)
        if args.action == "quarantine":
            uuid = _uuid(args.target, uuids)
            index = next((i for i, u in uuids.items() if u == uuid), None)
            reason = args.reason or "quarantined by hand"
            new = store.quarantine_gpu(uuid, index, reason, {"by_hand": True}, time.time(),
                                       by=f"cli:{getpass.getuser()}")
            print(f"GPU {uuid}{'' if index is None else f' (index {index})'} "
                  + ("quarantined: no run launches on it until `babysit gpu release`" if new
                     else "was already quarantined"))
            return 0
        uuid = gpufault.release_target(store, args.target, uuids)
        if uuid is None:
            print(f"GPU {args.target} is not quarantined (`babysit gpu list` shows those that are)")
            return 1
        store.release_gpu(uuid)
        print(f"GPU {uuid} released: runs may launch on it again (a run waiting for it launches within a minute)")
        return 0
    finally:
        store.close()


def _box_uuids(probe_spec: str | None) -> dict[int, str]:
    """index -> UUID of this box's GPUs; {} where none can be read (then only UUIDs are understood)."""
    probe = open_gpu_probe(probe_spec)
    try:
        view = probe.read(())
    finally:
        probe.close()
    return {g.index: g.uuid for g in view.gpus} if view.available else {}


def _uuid(target: str, uuids: dict[int, str]) -> str:
    if target.isdigit():
        if int(target) not in uuids:
            raise BadInput(f"babysit gpu quarantine: no GPU {target} visible here (visible: "
                           f"{', '.join(map(str, sorted(uuids))) or 'none'})",
                           hint="name the GPU by its UUID (`nvidia-smi -L`)")
        return uuids[int(target)]
    if not target.startswith(("GPU-", "MIG-")):
        raise BadInput(f"babysit gpu quarantine: expected a GPU UUID (GPU-…) or an index, got {target!r}",
                       hint="`nvidia-smi -L` lists the UUIDs")
    return target
