"""Daemon overhead: CPU-seconds and RSS of the real `babysit up` per babysat run-hour, real time.

  python bench/daemon_overhead.py                      # 4 runs, 150 s real time, here (~3 min)
  python bench/daemon_overhead.py --runs 8 --seconds 300 --gpu   # on the H200: runs declare gpus=[0]
  python bench/daemon_overhead.py --accelerated        # the demo/test cadence, reported separately

The daemon runs at its DEFAULT cadence (tick 1 s, guards every 30 s, NVML sample every 5 s, first
poll after 5 min, then every 30) unless --accelerated. Each run is a real local-executor run (shim +
a cheap log writer that appends a record every --interval s, an eval every 100). CPU is utime+stime
from /proc/PID/stat between the end of a warm-up and the end; RSS is VmRSS at the end. The naive
way, measured alongside for the same time: one bash loop per run that, every guard interval, runs
`ps` on the run's group and re-parses the whole log with python (what babysitting scripts do),
its CPU counted with its children's. Target: ≤ 0.5 CPU-s per run-hour.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (
    CLK_TCK,
    Daemon,
    cpu_seconds,
    emit,
    kill_runs,
    rss_bytes,
    threads,
    wait_for,
    write_registry,
    write_run,
)

from babysit.store import Store

HERE = Path(__file__).resolve().parent


def cpu_with_children(pid: int) -> float:
    text = Path(f"/proc/{pid}/stat").read_text()
    f = text[text.rindex(")") + 2:].split()
    return sum(int(x) for x in f[11:15]) / CLK_TCK  # utime stime cutime cstime


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=4)
    p.add_argument("--seconds", type=float, default=150, help="measured real time after warm-up (default 150)")
    p.add_argument("--warmup", type=float, default=15, help="seconds before measuring (default 15)")
    p.add_argument("--interval", type=float, default=1.0, help="seconds between a run's log records (default 1)")
    p.add_argument("--accelerated", action="store_true", help="run the daemon --accelerated")
    p.add_argument("--gpu", action="store_true", help="runs declare gpus = [0] (NVML read by guards/polls)")
    p.add_argument("--profile", metavar="PATH", help="also write a py-spy profile of the daemon (if installed)")
    p.add_argument("--json", metavar="PATH")
    args = p.parse_args(argv)

    root = Path(tempfile.mkdtemp(prefix="babysit-overhead-"))
    names = [f"r{i:03d}" for i in range(args.runs)]
    for name in names:
        write_run(root, name, [sys.executable, str(HERE / "_logwriter.py"), "--interval", str(args.interval)],
                  gpus="[0]" if args.gpu else "[]",
                  extra="gpu_hours_cap = 1000\n" + ("[poll]\nfirst_after_minutes = 1\nevery_minutes = 3\n"
                                                   if args.accelerated else ""))
    write_registry(root, names)
    env = {} if args.gpu else {"BABYSIT_GPU_PROBE": "none"}
    if args.accelerated:
        # register --accelerated is only a cadence check; the daemon needs --accelerated too
        pass
    daemon = Daemon(root, *(["--accelerated"] if args.accelerated else []), env=env)
    naive: list[subprocess.Popen] = []
    spy = None
    try:
        store_path = root / ".babysit" / "state.db"
        wait_for(lambda: store_path.exists(), 60, "the daemon's store")
        store = Store(store_path)
        wait_for(lambda: len([a for a in store.live_attempts() if a.status == "running"]) == args.runs, 120,
                 "every run running")
        for a in store.live_attempts():
            log = root / "logs" / f"{a.run}.jsonl"
            guard = 30 if not args.accelerated else 0.5
            script = (f"while :; do ps -o pid=,rss=,pcpu= -g {a.pid} >/dev/null; "
                      f"{sys.executable} -c 'import json,sys; [json.loads(l) for l in open(sys.argv[1],\"rb\")]' "
                      f"{log} 2>/dev/null; sleep {guard}; done")
            naive.append(subprocess.Popen(["bash", "-c", script], start_new_session=True))
        time.sleep(args.warmup)
        c0, t0 = cpu_seconds(daemon.pid), time.monotonic()
        n0 = [cpu_with_children(x.pid) for x in naive]
        if args.profile and shutil.which("py-spy"):
            spy = subprocess.Popen(["py-spy", "record", "-o", args.profile, "-f", "speedscope", "--pid",
                                    str(daemon.pid), "--duration", str(int(args.seconds))],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(args.seconds)
        c1, t1 = cpu_seconds(daemon.pid), time.monotonic()
        n1 = [cpu_with_children(x.pid) for x in naive]
        rss, nthreads = rss_bytes(daemon.pid), threads(daemon.pid)
        polls = sum(len(store.polls(n, 10_000)) for n in names)
        store.close()
        wall = t1 - t0
        run_hours = args.runs * wall / 3600
        ours = (c1 - c0) / run_hours
        naive_cpu = (sum(n1) - sum(n0)) / run_hours
        mode = "accelerated" if args.accelerated else "real time (default cadence)"
        rows = [[mode, args.runs, f"{wall:.0f} s", f"{c1 - c0:.2f} s", f"**{ours:.2f}**",
                 f"{rss / 2**20:.0f} MiB", nthreads, f"{naive_cpu:.1f}", f"{naive_cpu / ours:.1f}x" if ours else "—"]]
        notes = [f"target ≤ 0.5 CPU-s per run-hour: {'met' if ours <= 0.5 else 'MISSED'}; "
                 f"log writer every {args.interval} s per run; {polls} polls posted in the window",
                 "naive: bash loop per run, every guard interval: ps + re-parse the whole log (CPU incl. children)"]
        if not args.gpu:
            notes.append("GPU reads not measured here (BABYSIT_GPU_PROBE=none, runs declare gpus = []); "
                         "on the H200: `python bench/daemon_overhead.py --gpu`")
        emit("daemon overhead", ["mode", "runs", "measured", "daemon CPU", "CPU-s / run-hour", "RSS",
                                 "threads", "naive CPU-s / run-hour", "naive / ours"], rows,
             {"mode": mode, "runs": args.runs, "wall_s": wall, "daemon_cpu_s": c1 - c0,
              "cpu_s_per_run_hour": ours, "rss_bytes": rss, "threads": nthreads,
              "naive_cpu_s_per_run_hour": naive_cpu, "polls": polls, "gpu": args.gpu}, args.json, notes)
    finally:
        for x in naive:
            with __import__("contextlib").suppress(ProcessLookupError):
                os.killpg(x.pid, signal.SIGKILL)
        if spy is not None:
            spy.wait(timeout=30)
        daemon.stop()
        kill_runs(root)
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
