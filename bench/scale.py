"""Scale: 10 -> 100 -> 1,000 registered runs on one daemon.

  python bench/scale.py                       # sizes 10,100,1000 (~5 min here, mostly launching 1,000 shims)
  python bench/scale.py --sizes 10,100        # quicker

For each size: N real runs launched through the real local executor (shim + `sleep 100000`; each
run's log is fed by ONE writer process appending a record per second to all logs), GPUs injected
with a FileGpuProbe (every run declares gpus = [0]). The daemon is the real `babysit.service.daemon.Daemon`
STARTED IN THIS PROCESS (`Daemon.start()`: its scheduler, worker pool, exit-watcher and delivery
threads run as under `babysit up`; its guard interval is set to an hour so no round of its own
overlaps a timed one, and its runs' first polls are 10 hours away for the same reason). Once the
launch posts are delivered, `--ticks` guard rounds and as many poll rounds (every run's poll falling due
together: the daemon's `PollCalendar.poll`, one round, one transaction; the median, wall and CPU) are
timed by calling them, and the same
polls one run at a time (`RunSupervisor.poll`, as code before the calendar took each); then every
run's poll is made due at once on the daemon's own scheduler and the round is timed to its last
recorded poll, after which the threads are counted (the worker pool at its largest). RSS and threads
are this process's (the daemon's, plus the bench's few MB). Store growth per run-day is extrapolated
from the row bytes one poll round added, at the default cadence (48 polls a run-day, each with its
poll + header outbox rows). Targets at 1,000 runs: guard round ≤ 0.5 s, poll round ≤ 0.5 s, ≤ 20 threads, RSS ≤ 150 MB.
The naive way, timed on the same logs: one `ps` + one whole-log re-parse per run. `--before DIR`
also runs DIR/bench/scale.py (an export of the code before, e.g. `bash bench/export_before.sh REV
DIR`) with DIR first on PYTHONPATH, and prints its rows beside these. `--pathological` measures each
size again with one more run beside the N healthy ones (issue 32): a `[source] kind = "stdout"` run
whose trainer has printed FLOOD_LINES lines at once and whose pattern is `^(?P<step>(a|aa)+)$`-style
over `aaaa…ab` lines too, so its reader is far behind while the rounds are timed.
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
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (
    emit,
    fmt_us,
    kill_runs,
    mem_available_gib,
    rss_bytes,
    run_before,
    threads,
    write_gpu_file,
    write_registry,
    write_run,
)

HERE = Path(__file__).resolve().parent
SHIM_MIB = 12  # a shim (python) + sleep, resident, measured here ~10 MiB
# No poll of the daemon's own falls due while a round is timed: a run's first poll comes 5 declared minutes
# after its launch, and launching 1,000 runs takes longer than that here, so the polls of the runs launched
# first fired on the scheduler's threads during the timed guard rounds (a poll round beside every guard
# round, only at the sizes whose launch outlasts 5 minutes). The bench makes the polls it times due itself.
POLL_LATER = "\n[poll]\nfirst_after_minutes = 600\n"
FLOOD_LINES = 2_000_000  # the pathological run's backlog when the rounds are timed
FLOOD = f"""
import sys, time
w = sys.stdout.write
for i in range(1, {FLOOD_LINES} + 1):
    w(f"iter {{i}}: loss 3.{{i % 1000:03d}}, time 1.00ms\\n")
    if i % 50 == 0:
        w("a" * 40 + "b\\n")  # what `(a|aa)+$` backtracks on in Python's re
sys.stdout.flush()
open(sys.argv[1], "w").close()
time.sleep(100000)
"""


def daemon_modules() -> tuple[Any, Any, Any]:
    """Daemon, ConsoleChannel, FileGpuProbe of whichever babysit is first on the path: this tree's, or an
    export's for bench/scale_together.py (the package layout moved after 43c3b3c: babysit.daemon became
    babysit.service.daemon)."""
    from babysit.probes.gpu import FileGpuProbe
    try:
        from babysit.channels.notify import ConsoleChannel
        from babysit.service.daemon import Daemon
    except ImportError:  # the code before the package move
        from babysit.daemon import Daemon  # type: ignore[no-redef]
        from babysit.notify import ConsoleChannel  # type: ignore[no-redef]
    return Daemon, ConsoleChannel, FileGpuProbe


def quiet_logs() -> None:
    """babysit's log off the console; the runs killed at teardown are not news."""
    try:
        from babysit.runtime import logs
    except ImportError:  # the code before the package move
        from babysit import logs  # type: ignore[no-redef]
    logs.configure(None, console=False)
    logging.getLogger().addHandler(logging.NullHandler())


@contextlib.contextmanager
def launched(n: int, pathological: bool = False) -> Iterator[tuple[Any, Path, list[str], float]]:
    """N runs (and the flood run, when `pathological`) launched on a daemon started in this process, their
    logs fed by one writer: (daemon, root, run names, launch seconds). At exit the daemon is shut down and
    the runs killed and removed."""
    daemon_cls, console_channel, file_probe = daemon_modules()
    root = Path(tempfile.mkdtemp(prefix=f"babysit-scale{n}-"))
    names = [f"r{i:04d}" for i in range(n)]
    gpu_file = root / "gpus.json"
    write_gpu_file(gpu_file)
    for name in names:
        write_run(root, name, ["sleep", "100000"], gpus="[0]", extra=f"gpu_hours_cap = 100000\n{POLL_LATER}")
    if pathological:  # one more run, beside the N healthy ones: its reader is far behind all along
        (root / "flood.toml").write_text(f"""[run]
name = "flood"
command = {json.dumps([sys.executable, "-c", FLOOD, str(root / "flooded")])}
gpus = [0]

[guards]
min_free_host_ram_gib = 0.1
gpu_hours_cap = 100000
stop_grace_seconds = 5

[source]
kind = "stdout"
[[source.patterns]]
regex = '^(?P<step>(a|aa)+)$'
[[source.patterns]]
regex = 'iter (?P<step>\\d+): loss (?P<loss>[-+.\\w]+)'
""")
    write_registry(root, [*names, "flood"] if pathological else names, guard_interval_seconds=3600.0)
    (root / "logs").mkdir()
    logs = [str(root / "logs" / f"{name}.jsonl") for name in names]
    writer = subprocess.Popen([sys.executable, str(HERE / "_logwriter.py"), "--interval", "1", *logs],
                              start_new_session=True)
    daemon = None
    try:
        daemon = daemon_cls(root / "babysit.toml", gpu_probe=file_probe(gpu_file),
                            channel=console_channel(root / ".babysit", open(os.devnull, "w")))  # noqa: SIM115
        t0 = time.perf_counter()
        daemon.start()  # launches every run through the real local executor
        yield daemon, root, names, time.perf_counter() - t0
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(writer.pid, signal.SIGKILL)
        writer.wait()
        if daemon is not None:
            daemon.shutdown()  # the runs keep running, as under `babysit up`; then they are killed
        kill_runs(root)
        shutil.rmtree(root, ignore_errors=True)


def one_size(n: int, args: argparse.Namespace, pathological: bool = False) -> dict[str, Any]:
    with launched(n, pathological) as (daemon, root, names, launch_s):
        flooded = root / "flooded"
        running = sum(1 for s in daemon.supervisors.values() if s.attempt and s.attempt.status == "running")
        t = time.perf_counter()
        drain(daemon)  # the launch posts delivered: the rounds below are timed in the steady state
        launch_posts_s = time.perf_counter() - t
        flood_behind = None
        if pathological:
            deadline = time.monotonic() + 300
            while not flooded.exists() and time.monotonic() < deadline:
                time.sleep(0.1)
            flood_behind = daemon.supervisors["flood"].runlog.reader.unread_bytes()
        time.sleep(2)
        guard_rounds = []
        guard_cpu = []  # the process's CPU in each round (its threads idle but for it): the figure noise spares
        for _ in range(args.ticks):
            time.sleep(1)  # a second of new records in every log
            t, c = time.perf_counter(), time.process_time()
            daemon.guards()
            guard_rounds.append(time.perf_counter() - t)
            guard_cpu.append(time.process_time() - c)
        db = root / ".babysit" / "state.db"
        size0 = size1 = _row_bytes(db)
        poll_rounds, poll_cpu = [], []  # `ticks` rounds, as the guard's: the median, not one round's luck
        for k in range(args.ticks):
            time.sleep(1)  # a second of new records in every log
            t, c = time.perf_counter(), time.process_time()
            daemon.ctx.polls.poll([s.polls for s in daemon.supervisors.values()])  # each run's PolledRun
            poll_rounds.append(time.perf_counter() - t)
            poll_cpu.append(time.process_time() - c)
            if k == 0:
                size1 = _row_bytes(db)  # one round's rows: the store's growth per poll
            drain(daemon)
        per_poll_bytes = (size1 - size0) / max(1, n)
        time.sleep(1)
        t = time.perf_counter()
        for s in list(daemon.supervisors.values()):
            s.poll()
        one_by_one_s = time.perf_counter() - t
        drain(daemon)
        # every run's poll due at once, on the daemon's own scheduler and workers
        t = time.perf_counter()
        for s in list(daemon.supervisors.values()):
            daemon.ctx.polls.due(s.polls, time.time())
        deadline = time.monotonic() + 600
        while _polls(db) < (args.ticks + 2) * n and time.monotonic() < deadline:  # our own query, not the daemon's lock
            time.sleep(0.01)
        scheduled_round_s = time.perf_counter() - t
        nthreads = threads(os.getpid())
        polls = _polls(db)
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
        guard_rounds.sort()
        flood_read = None
        if pathological:
            flood_read = daemon.supervisors["flood"].runlog.pump.state.get("lines")
        return {"runs": n, "pathological": pathological, "flood_unread_bytes_at_start": flood_behind,
                "flood_lines_read_by_the_end": flood_read, "guard_rounds_s": guard_rounds,
                "guard_round_cpu_s": sorted(guard_cpu)[len(guard_cpu) // 2],
                "running": running, "launch_s": launch_s, "launch_posts_delivered_s": launch_posts_s,
                "guard_round_s": guard_rounds[len(guard_rounds) // 2],
                "poll_rounds_s": poll_rounds, "poll_round_s": sorted(poll_rounds)[len(poll_rounds) // 2],
                "poll_round_cpu_s": sorted(poll_cpu)[len(poll_cpu) // 2],
                "poll_one_by_one_s": one_by_one_s,
                "scheduled_poll_round_s": scheduled_round_s, "polls_recorded": polls,
                "naive_poll_round_s": naive_per_run * n, "rss_bytes": rss_bytes(os.getpid()),
                "threads": nthreads, "store_bytes_per_poll": per_poll_bytes,
                "store_bytes_per_run_day": per_poll_bytes * 48, "store_bytes": size1, "code": "now"}


def drain(daemon: Any) -> None:
    """Wait until the daemon's delivery thread has sent everything queued (console channel, /dev/null)."""
    deadline = time.monotonic() + 600
    while daemon.store.pending_count() and time.monotonic() < deadline:
        time.sleep(0.1)


def _polls(db: Path) -> int:
    """Poll rows committed, read on a connection of the bench's own (the daemon's store is not touched)."""
    import sqlite3

    con = sqlite3.connect(db)
    try:
        return con.execute("SELECT COUNT(*) FROM polls").fetchone()[0]
    finally:
        con.close()


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


def said(r: dict) -> None:
    """One size's figures on stderr as soon as they are measured: a run cut by its time limit (a GPU
    machine's call) still shows the sizes it finished (the table comes only at the end)."""
    rounds = ", ".join(fmt_us(x * 1e6) for x in r.get("guard_rounds_s", []))
    print(f"  {r['runs']} runs measured: launch {r['launch_s']:.1f} s, guard round {fmt_us(r['guard_round_s'] * 1e6)} "
          f"(rounds {rounds}), poll round {fmt_us(r['poll_round_s'] * 1e6)}, threads {r['threads']}, "
          f"RSS {r['rss_bytes'] / 2**20:.0f} MiB", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", default="10,100,1000")
    p.add_argument("--ticks", type=int, default=3, help="guard rounds timed per size (default 3)")
    p.add_argument("--before", metavar="DIR", help="also measure the code exported in DIR (its own bench)")
    p.add_argument("--pathological", action="store_true",
                   help="also time each size with one more run whose reader is far behind (a flood of lines)")
    p.add_argument("--json", metavar="PATH")
    args = p.parse_args(argv)
    quiet_logs()
    results = []
    notes = []
    for n in (int(x) for x in args.sizes.split(",")):
        need = n * SHIM_MIB / 1024 + 2
        if mem_available_gib() < need:
            notes.append(f"{n} runs skipped: {mem_available_gib():.1f} GiB available, ~{need:.1f} GiB needed")
            continue
        print(f"  {n} runs…", file=sys.stderr, flush=True)
        results.append(one_size(n, args))
        said(results[-1])
        if args.pathological:
            print(f"  {n} runs + 1 pathological…", file=sys.stderr, flush=True)
            results.append(one_size(n, args, pathological=True))
            said(results[-1])
    if args.before:
        results += run_before(args.before, "scale.py", ["--sizes", args.sizes, "--ticks", str(args.ticks)])
    rows = [[r.get("code", "before") + (" + 1 pathological run" if r.get("pathological") else ""), r["runs"],
              f"{r['launch_s']:.1f} s",
             fmt_us(r["guard_round_s"] * 1e6), f"**{fmt_us(r['poll_round_s'] * 1e6)}**",
             fmt_us(r["poll_one_by_one_s"] * 1e6) if "poll_one_by_one_s" in r else "—",
             fmt_us(r["scheduled_poll_round_s"] * 1e6) if "scheduled_poll_round_s" in r else "—",
             fmt_us(r["naive_poll_round_s"] * 1e6), f"{r['naive_poll_round_s'] / r['poll_round_s']:.1f}x",
             f"{r['rss_bytes'] / 2**20:.0f} MiB", r["threads"], f"{r['store_bytes_per_run_day'] / 1e3:.0f} kB"]
            for r in results]
    for r in results:
        if r.get("code") == "now" and r["runs"] >= 1000:
            checks = {"guard round ≤ 0.5 s": r["guard_round_s"] <= 0.5, "poll round ≤ 0.5 s": r["poll_round_s"] <= 0.5,
                      "≤ 20 threads": r["threads"] <= 20, "RSS ≤ 150 MB": r["rss_bytes"] <= 150e6}
            notes.append(f"at {r['runs']} runs: " + "; ".join(f"{k}: {'met' if ok else 'MISSED'}"
                                                             for k, ok in checks.items()))
    for r in results:
        if "guard_round_cpu_s" in r:
            notes.append(f"{r['runs']} runs: guard round CPU {fmt_us(r['guard_round_cpu_s'] * 1e6)} (median, "
                         "time.process_time)")
        if "poll_round_cpu_s" in r:
            rounds = ", ".join(fmt_us(x * 1e6) for x in sorted(r["poll_rounds_s"]))
            notes.append(f"{r['runs']} runs: poll round median of {len(r['poll_rounds_s'])} ({rounds}), CPU "
                         f"{fmt_us(r['poll_round_cpu_s'] * 1e6)} (median, time.process_time: every thread's, the "
                         "delivery of the round's posts included)")
    for r in results:
        if r.get("pathological"):
            behind = r["flood_unread_bytes_at_start"] / 2**20
            notes.append(f"{r['runs']} runs + 1 pathological: its reader {behind:.0f} MiB "
                         f"behind when the rounds began, {r['flood_lines_read_by_the_end']:,} lines read by the end; "
                         f"guard rounds {', '.join(fmt_us(x * 1e6) for x in r['guard_rounds_s'])}")
    notes.append("threads (now): main, the scheduler, its worker pool (10 at most), the exit watcher, delivery; "
                 "before: one exit-watcher thread per run, and the in-process daemon had no scheduler threads")
    notes.append("poll round (now): every run's poll in one round (`PollCalendar.poll`); one by one: the same "
                 "polls a run at a time; before: one run at a time was the only way")
    emit("scale", ["code", "runs", "launch all", "guard round", "poll round", "polls one by one",
                   "poll round (scheduler)",
                   "naive poll round", "naive / ours", "RSS", "threads", "store / run-day"], rows,
         {"results": results}, args.json, notes)
    return 0


if __name__ == "__main__":
    sys.exit(main())
