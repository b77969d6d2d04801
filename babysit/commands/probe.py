"""`babysit probe`: the sidecar a Slurm job runs beside the trainer (see `babysit/probes/remote.py`).

It samples the job's GPUs (NVML, window-averaged utilisation) and the host (free RAM, the trainer
tree's RSS and CPU) and appends one JSON line per interval to --out, which the daemon on the login
node reads. SIGUSR1 (the batch script's, once the trainer exited) or SIGTERM (Slurm ending the job) ends
it cleanly, after one last record: an Xid that killed the trainer arrives as the job ends, and the
exit's classification reads it there.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import threading
import time

from babysit.core.errors import BadInput
from babysit.probes.gpu import GPU_PROBE_ENV, open_gpu_probe
from babysit.probes.host import process_tree, read_host
from babysit.probes.remote import RECORD_VERSION, SignalsSeen, belongs_to_job, choose_gpus, gpu_record, keep_signals


def run(args: argparse.Namespace) -> int:
    if args.interval <= 0:
        raise BadInput(f"--interval: expected a positive number of seconds, got {args.interval}")
    # the Slurm node's name: several slurmd may share one host (and a node's name is what Slurm reports)
    host = os.environ.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]
    out = args.out.replace("{host}", host)
    job_id = args.job_id or os.environ.get("SLURM_JOB_ID") or None
    # simulated GPUs may differ by node: `file:…/gpus-{host}.json` reads this node's file (tests, demos)
    probe = open_gpu_probe((args.gpu_probe or os.environ.get(GPU_PROBE_ENV) or "nvml").replace("{host}", host))
    stop = threading.Event()
    # USR1 is the batch script's stop (srun passes it on; a TERM to srun SIGKILLs its tasks); TERM is Slurm's
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1):
        signal.signal(sig, lambda *_: stop.set())

    if args.gpus:
        try:
            indices: tuple[int, ...] | None = tuple(int(x) for x in args.gpus.split(",") if x.strip())
        except ValueError:
            raise BadInput(f"--gpus: expected comma-separated NVML indices, got {args.gpus!r}") from None
    else:
        indices = None
    written = 0
    seen: SignalsSeen = {}  # every health signal since the job started: a record a guard round skips loses none
    # Monotonic ticks with `next += interval`, so records do not drift; sample() twice a second in between
    # so utilisation is a window average, not an instant.
    next_at = time.monotonic()
    try:
        with open(out, "a", encoding="utf-8") as f:
            while True:  # a record, then the wait; a stop during the wait gets one last record
                if indices is None:
                    everything = probe.read(())
                    indices = choose_gpus([g.index for g in everything.gpus], os.environ) \
                        if everything.available else ()
                view, seen = keep_signals(seen, probe.read(indices) if indices else probe.read(()))
                tree = process_tree(args.pid) if args.pid else frozenset()
                holders = {p.pid for g in view.gpus for p in g.processes}
                mine = frozenset(pid for pid in holders if belongs_to_job(pid, job_id, tree))
                h = read_host(args.pid)
                record = {"v": RECORD_VERSION, "ts": time.time(), "host": host, "job_id": job_id,
                          "gpu": gpu_record(view, mine),
                          "host_mem": {"available_ram_bytes": h.available_ram_bytes,
                                       "total_ram_bytes": h.total_ram_bytes, "run_rss_bytes": h.run_rss_bytes,
                                       "run_cpu_pct": h.run_cpu_pct, "run_pids": len(h.run_pids)}}
                f.write(json.dumps(record, separators=(",", ":")) + "\n")
                f.flush()
                written += 1
                if stop.is_set() or (args.count is not None and written >= args.count):
                    break
                next_at += args.interval
                while not stop.is_set() and time.monotonic() < next_at:
                    probe.sample()
                    stop.wait(min(0.5, max(0.0, next_at - time.monotonic())))
    finally:
        probe.close()
    return 0
