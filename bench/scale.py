"""Scale: 10 -> 100 -> 1,000 registered runs on one daemon.

  python bench/scale.py                       # sizes 10,100,1000 (~5 min here, mostly launching 1,000 shims)
  python bench/scale.py --sizes 10,100        # quicker

For each size: N real runs launched through the real local executor (shim + `sleep 100000`; each
run's log is fed by ONE writer process appending a record per second to all logs), GPUs injected
with a FileGpuProbe (every run declares gpus = [0]). The daemon is the real `babysit.daemon.Daemon`
driven IN THIS PROCESS (its jobs called directly, no scheduler thread), so the time of a full tick,
a full guard round and a full poll round (all runs polled) is measured exactly; RSS and threads are
this process's (= the daemon's, plus the bench's few MB). Store growth per run-day is extrapolated
from the row bytes (poll snapshot + outbox payloads) one poll round added, at the default
cadence (first poll at 5 min, then every 30: 48 polls a run-day, each with its poll + header
outbox rows). Targets: poll round ≤ 1 s, RSS ≤ 200 MB at 1,000. The naive way, timed on the same
logs: one `ps` + one whole-log re-parse per run.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (
    emit,
    fmt_us,
    kill_runs,
    mem_available_gib,
    rss_bytes,
    threads,
    write_gpu_file,
    write_registry,
    write_run,
)

HERE = Path(__file__).resolve().parent
SHIM_MIB = 12  # a shim (python) + sleep, resident, measured here ~10 MiB


def one_size(n: int, args: argparse.Namespace) -> dict[str, Any]:
    from babysit.daemon import Daemon
    from babysit.notify import open_channel
    from babysit.probes.gpu import FileGpuProbe

    root = Path(tempfile.mkdtemp(prefix=f"babysit-scale{n}-"))
    names = [f"r{i:04d}" for i in range(n)]
    gpu_file = root / "gpus.json"
    write_gpu_file(gpu_file)
    for name in names:
        write_run(root, name, ["sleep", "100000"], gpus="[0]", extra="gpu_hours_cap = 100000\n")
    write_registry(root, names)
    (root / "logs").mkdir()
    logs = [str(root / "logs" / f"{name}.jsonl") for name in names]
    writer = subprocess.Popen([sys.executable, str(HERE / "_logwriter.py"), "--interval", "1", *logs],
                              start_new_session=True)
    daemon = None
    try:
        daemon = Daemon(root / "babysit.toml", gpu_probe=FileGpuProbe(gpu_file),
                        channel=open_channel(root / ".babysit"))
        t0 = time.perf_counter()
        daemon.reconcile_registry()  # launches every run through the real local executor
        launch_s = time.perf_counter() - t0
        running = sum(1 for s in daemon.supervisors.values() if s.attempt and s.attempt.status == "running")
        time.sleep(2)
        ticks = []
        for _ in range(args.ticks):
            t = time.perf_counter()
            daemon.tick()
            ticks.append(time.perf_counter() - t)
            time.sleep(1)
        light = []
        for _ in range(args.ticks):
            t = time.perf_counter()
            daemon.tick()  # right after another: no new records, the exit backstop and an empty read
            light.append(time.perf_counter() - t)
        t = time.perf_counter()
        daemon.guards()
        guard_s = time.perf_counter() - t
        db = root / ".babysit" / "state.db"
        size0 = _row_bytes(db)
        t = time.perf_counter()
        for s in list(daemon.supervisors.values()):
            s.poll()
        poll_round_s = time.perf_counter() - t
        size1 = _row_bytes(db)
        polls = sum(len(daemon.store.polls(name, 5)) for name in names)
        per_poll_bytes = (size1 - size0) / max(1, n)
        # the naive way on the same runs: ps per run + whole-log re-parse per run (capped sample)
        sample = names[: min(n, 20)]
        t = time.perf_counter()
        for name in sample:
            a = daemon.supervisors[name].attempt
            subprocess.run(["ps", "-o", "pid=,rss=", "-g", str(a.pid)], capture_output=True)
            with open(root / "logs" / f"{name}.jsonl", "rb") as f:
                for line in f:
                    json.loads(line)
        naive_per_run = (time.perf_counter() - t) / len(sample)
        ticks.sort()
        light.sort()
        return {"runs": n, "running": running, "launch_s": launch_s,
                "tick_reading_logs_s": ticks[len(ticks) // 2], "tick_light_s": light[len(light) // 2],
                "guard_round_s": guard_s, "poll_round_s": poll_round_s, "polls_recorded": polls,
                "naive_poll_round_s": naive_per_run * n, "rss_bytes": rss_bytes(os.getpid()),
                "threads": threads(os.getpid()), "store_bytes_per_poll": per_poll_bytes,
                "store_bytes_per_run_day": per_poll_bytes * 48, "store_bytes": size1}
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(writer.pid, signal.SIGKILL)
        writer.wait()
        if daemon is not None:
            kill_runs(root)
            for sup in daemon.supervisors.values():  # let each watcher record its exit before the store closes
                if sup.watcher is not None:
                    sup.watcher.join(timeout=10)
            daemon.store.close()
        else:
            kill_runs(root)
        shutil.rmtree(root, ignore_errors=True)


def _row_bytes(db: Path) -> int:
    """JSON bytes held in polls, incidents and outbox rows (file sizes jump with WAL and page reuse)."""
    import sqlite3

    con = sqlite3.connect(db)
    try:
        return sum(con.execute(q).fetchone()[0] or 0 for q in (
            "SELECT SUM(LENGTH(snapshot)) FROM polls", "SELECT SUM(LENGTH(detail)) FROM incidents",
            "SELECT SUM(LENGTH(payload)) FROM outbox"))
    finally:
        con.close()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", default="10,100,1000")
    p.add_argument("--ticks", type=int, default=3, help="ticks timed per size (default 3)")
    p.add_argument("--json", metavar="PATH")
    args = p.parse_args(argv)
    from babysit import logs

    logs.configure(None, console=False)
    logging.getLogger().addHandler(logging.NullHandler())  # the runs killed at teardown are not news
    results = []
    notes = []
    for n in (int(x) for x in args.sizes.split(",")):
        need = n * SHIM_MIB / 1024 + 2
        if mem_available_gib() < need:
            notes.append(f"{n} runs skipped: {mem_available_gib():.1f} GiB available, ~{need:.1f} GiB needed")
            continue
        print(f"  {n} runs…", file=sys.stderr, flush=True)
        results.append(one_size(n, args))
    rows = [[r["runs"], f"{r['launch_s']:.1f} s", fmt_us(r["tick_reading_logs_s"] * 1e6),
             fmt_us(r["tick_light_s"] * 1e6), fmt_us(r["guard_round_s"] * 1e6),
             f"**{fmt_us(r['poll_round_s'] * 1e6)}**", fmt_us(r["naive_poll_round_s"] * 1e6),
             f"{r['naive_poll_round_s'] / r['poll_round_s']:.1f}x", f"{r['rss_bytes'] / 2**20:.0f} MiB", r["threads"],
             f"{r['store_bytes_per_run_day'] / 1e3:.0f} kB"] for r in results]
    big = results[-1] if results else None
    if big:
        notes.append(f"at {big['runs']} runs: poll round {big['poll_round_s']:.2f} s (target ≤ 1 s: "
                     f"{'met' if big['poll_round_s'] <= 1 else 'MISSED'}), RSS {big['rss_bytes'] / 2**20:.0f} MiB "
                     f"(target ≤ 200 MB: {'met' if big['rss_bytes'] <= 200e6 else 'MISSED'})")
    notes.append("threads: one exit-watcher thread per run (blocked in flock, no CPU); "
                 "the daemon here is in-process without its scheduler's 10 worker threads")
    emit("scale", ["runs", "launch all", "tick (reads logs)", "tick (light)", "guard round", "poll round",
                   "naive poll round", "naive / ours", "RSS", "threads", "store / run-day"], rows,
         {"results": results}, args.json, notes)
    return 0


if __name__ == "__main__":
    sys.exit(main())
