"""Daemon overhead: CPU-seconds and RSS of the real `babysit up` per babysat run-hour, real time.

  python bench/daemon_overhead.py                      # 4 runs, 150 s real time, here (~3 min)
  python bench/daemon_overhead.py --runs 8 --seconds 300 --gpu   # on the H200: runs declare gpus=[0]
  python bench/daemon_overhead.py --accelerated        # the demo/test cadence, reported separately

The daemon runs at its DEFAULT cadence (guard round every 30 s, GPU sampling every second while a
run has GPUs, first poll after 5 min, then every 30; nothing else on a timer) unless --accelerated.
Each run is a real local-executor run (shim + a cheap log writer that appends a record every
--interval s, an eval every 100). CPU is the daemon's threads' time on the CPU in ns
(/proc/PID/task/*/schedstat) between the end of a warm-up and the end; RSS is VmRSS at the end;
wake-ups are the threads' voluntary context switches (each return from a sleep is one). Then the same
daemon with no run at all, for --idle seconds: its wake-ups a minute (target: the guard round's 2 and
the few a round costs, nothing else). The naive way, measured alongside: one bash loop per run that,
every guard interval, runs `ps` on the run's group and re-parses the whole log with python (what
babysitting scripts do), its CPU counted with its children's. Target: ≤ 0.3 CPU-s per run-hour.
`--before DIR` measures the code exported in DIR (bench/export_before.sh) the same way, in the same run.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (
    CLK_TCK,
    Daemon,
    cpu_seconds_precise,
    emit,
    kill_runs,
    rss_bytes,
    threads,
    wait_for,
    write_gpu_file,
    write_registry,
    write_run,
)

HERE = Path(__file__).resolve().parent


def cpu_with_children(pid: int) -> float:
    text = Path(f"/proc/{pid}/stat").read_text()
    f = text[text.rindex(")") + 2:].split()
    return sum(int(x) for x in f[11:15]) / CLK_TCK  # utime stime cutime cstime


def sql(db: Path, query: str) -> list[tuple]:
    """A read of the daemon's database without babysit's Store (which would migrate an older one)."""
    con = sqlite3.connect(db, timeout=30)
    try:
        return con.execute(query).fetchall()
    except sqlite3.OperationalError as exc:  # the daemon has not made its tables yet
        if "no such table" in str(exc):
            return []
        raise
    finally:
        con.close()


def wakeups(pid: int) -> int:
    """Voluntary context switches of every living thread of the process (a sleep that ends is one)."""
    total = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            for line in Path(f"/proc/{pid}/task/{tid}/status").read_text().splitlines():
                if line.startswith("voluntary_ctxt_switches:"):
                    total += int(line.split()[1])
        except FileNotFoundError:
            continue
    return total


def idle_daemon(seconds: float, env: dict[str, str], code_env: dict[str, str]) -> dict[str, float]:
    """A daemon with no run: its CPU and wake-ups a minute over `seconds`."""
    root = Path(tempfile.mkdtemp(prefix="babysit-idle-"))
    write_registry(root, [])
    daemon = Daemon(root, env={**env, **code_env})
    try:
        wait_for(lambda: (root / ".babysit" / "daemon.log").exists() and "daemon up" in
                 (root / ".babysit" / "daemon.log").read_text(), 60, "the idle daemon")
        time.sleep(3)
        c0, w0, t0 = cpu_seconds_precise(daemon.pid), wakeups(daemon.pid), time.monotonic()
        time.sleep(seconds)
        c1, w1, t1 = cpu_seconds_precise(daemon.pid), wakeups(daemon.pid), time.monotonic()
        return {"idle_cpu_s_per_hour": (c1 - c0) / (t1 - t0) * 3600,
                "idle_wakeups_per_min": (w1 - w0) / (t1 - t0) * 60, "idle_threads": threads(daemon.pid)}
    finally:
        daemon.stop()
        shutil.rmtree(root, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=4)
    p.add_argument("--seconds", type=float, default=150, help="measured real time after warm-up (default 150)")
    p.add_argument("--warmup", type=float, default=15, help="seconds before measuring (default 15)")
    p.add_argument("--interval", type=float, default=1.0, help="seconds between a run's log records (default 1)")
    p.add_argument("--accelerated", action="store_true", help="run the daemon --accelerated")
    p.add_argument("--gpu", action="store_true", help="runs declare gpus = [0] (NVML read by guards/polls)")
    p.add_argument("--sim-gpu", action="store_true",
                   help="runs declare gpus = [0], read from a FileGpuProbe (the GPU machinery without NVML)")
    p.add_argument("--profile", metavar="PATH", help="also write a py-spy profile of the daemon (if installed)")
    p.add_argument("--idle", type=float, default=30, help="seconds an idle daemon is watched (default 30; 0: not)")
    p.add_argument("--before", metavar="DIR", help="also measure the code exported in DIR (bench/export_before.sh)")
    p.add_argument("--json", metavar="PATH")
    args = p.parse_args(argv)
    results = [measure(args, {}, "now")]
    if args.before:
        results.append(measure(args, {"PYTHONPATH": os.pathsep.join(
            x for x in (args.before, os.environ.get("PYTHONPATH")) if x)}, "before"))
    rows = [[r["code"], r["mode"], r["runs"], f"{r['wall_s']:.0f} s", f"{r['daemon_cpu_s']:.3f} s",
             f"**{r['cpu_s_per_run_hour']:.3f}**", f"{r['wakeups_per_min']:.0f}", f"{r['rss_bytes'] / 2**20:.0f} MiB",
             r["threads"], "—" if r.get("idle_wakeups_per_min") is None else f"{r['idle_wakeups_per_min']:.1f}",
             f"{r['naive_cpu_s_per_run_hour']:.1f}",
             f"{r['naive_cpu_s_per_run_hour'] / r['cpu_s_per_run_hour']:.0f}x" if r["cpu_s_per_run_hour"] else "—"]
            for r in results]
    now = results[0]
    notes = [f"target ≤ 0.3 CPU-s per run-hour: {'met' if now['cpu_s_per_run_hour'] <= 0.3 else 'MISSED'}; "
             f"log writer every {args.interval} s per run; {now['polls']} polls posted in the window",
             "naive: bash loop per run, every guard interval: ps + re-parse the whole log (CPU incl. children)",
             "wake-ups: voluntary context switches of the daemon's threads, a minute; idle: the same daemon, no run"]
    if args.sim_gpu:
        notes.append("GPUs simulated (FileGpuProbe): the sampling, guard and poll machinery runs, NVML does not")
    elif not args.gpu:
        notes.append("GPU reads not measured here (BABYSIT_GPU_PROBE=none, runs declare gpus = []); "
                     "on the H200: `python bench/daemon_overhead.py --gpu`")
    emit("daemon overhead", ["code", "mode", "runs", "measured", "daemon CPU", "CPU-s / run-hour", "wake-ups / min",
                             "RSS", "threads", "idle wake-ups / min", "naive CPU-s / run-hour", "naive / ours"], rows,
         {"results": results}, args.json, notes)
    return 0


def profile_path(path: str, code: str) -> str:
    """One profile a measured code: PATH for the code now, PATH with `-before` ahead of its suffix for --before."""
    if code == "now":
        return path
    stem, dot, suffix = path.rpartition(".")
    return f"{stem}-{code}.{suffix}" if dot else f"{path}-{code}"


def measure(args: argparse.Namespace, code_env: dict[str, str], code: str) -> dict[str, object]:
    """One daemon (the code on code_env's PYTHONPATH) babysitting --runs runs for --seconds."""

    root = Path(tempfile.mkdtemp(prefix="babysit-overhead-"))
    names = [f"r{i:03d}" for i in range(args.runs)]
    for name in names:
        write_run(root, name, [sys.executable, str(HERE / "_logwriter.py"), "--interval", str(args.interval)],
                  gpus="[0]" if args.gpu or args.sim_gpu else "[]",
                  extra="gpu_hours_cap = 1000\n" + ("[poll]\nfirst_after_minutes = 1\nevery_minutes = 3\n"
                                                   if args.accelerated else ""))
    write_registry(root, names)
    env = {} if args.gpu else {"BABYSIT_GPU_PROBE": "none"}
    if args.sim_gpu:
        write_gpu_file(root / "gpus.json")
        env = {"BABYSIT_GPU_PROBE": f"file:{root / 'gpus.json'}"}
    daemon = Daemon(root, *(["--accelerated"] if args.accelerated else []), env={**env, **code_env})
    naive: list[subprocess.Popen] = []
    spy = None
    try:
        store_path = root / ".babysit" / "state.db"
        wait_for(lambda: store_path.exists(), 60, "the daemon's store")
        running = "SELECT run, pid FROM attempts WHERE status='running'"  # raw SQL: the store of any version
        wait_for(lambda: len(sql(store_path, running)) == args.runs, 120,
                 "every run running")
        for run, pid in sql(store_path, running):
            log = root / "logs" / f"{run}.jsonl"
            guard = 30 if not args.accelerated else 0.5
            script = (f"while :; do ps -o pid=,rss=,pcpu= -g {pid} >/dev/null; "
                      f"{sys.executable} -c 'import json,sys; [json.loads(l) for l in open(sys.argv[1],\"rb\")]' "
                      f"{log} 2>/dev/null; sleep {guard}; done")
            naive.append(subprocess.Popen(["bash", "-c", script], start_new_session=True))
        time.sleep(args.warmup)
        c0, w0, t0 = cpu_seconds_precise(daemon.pid), wakeups(daemon.pid), time.monotonic()
        n0 = [cpu_with_children(x.pid) for x in naive]
        if args.profile and shutil.which("py-spy"):
            spy = subprocess.Popen(["py-spy", "record", "-o", profile_path(args.profile, code), "-f", "speedscope",
                                    "--nonblocking", "--pid", str(daemon.pid), "--duration", str(int(args.seconds))],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(args.seconds)
        c1, w1, t1 = cpu_seconds_precise(daemon.pid), wakeups(daemon.pid), time.monotonic()
        n1 = [cpu_with_children(x.pid) for x in naive]
        rss, nthreads = rss_bytes(daemon.pid), threads(daemon.pid)
        polls = sql(store_path, "SELECT COUNT(*) FROM polls")[0][0]
        wall = t1 - t0
        run_hours = args.runs * wall / 3600
        ours = (c1 - c0) / run_hours
        naive_cpu = (sum(n1) - sum(n0)) / run_hours
        mode = "accelerated" if args.accelerated else "real time (default cadence)"
        result: dict[str, object] = {
            "code": code, "mode": mode, "runs": args.runs, "wall_s": wall, "daemon_cpu_s": c1 - c0,
            "cpu_s_per_run_hour": ours, "wakeups_per_min": (w1 - w0) / wall * 60, "rss_bytes": rss,
            "threads": nthreads, "naive_cpu_s_per_run_hour": naive_cpu, "polls": polls, "gpu": args.gpu}
    finally:
        for x in naive:
            with __import__("contextlib").suppress(ProcessLookupError):
                os.killpg(x.pid, signal.SIGKILL)
        if spy is not None:
            spy.wait(timeout=30)
        daemon.stop()
        kill_runs(root)
        shutil.rmtree(root, ignore_errors=True)
    if args.idle > 0 and not args.accelerated:
        result.update(idle_daemon(args.idle, env, code_env))
    return result


if __name__ == "__main__":
    sys.exit(main())
