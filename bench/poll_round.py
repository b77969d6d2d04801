"""Poll round, side by side: N runs on one in-process daemon, the same poll round timed K times (wall and
CPU), for this code and, with `--before DIR`, for the code exported in DIR, the two codes' rounds taken
in turn under the same load.

  python bench/poll_round.py --runs 300 --rounds 5 --before DIR      # both codes at once (2 x 300 shims)
  python bench/poll_round.py --runs 1000 --rounds 5 --before DIR --one-at-a-time   # 1,000: ~12 GB each

Why beside bench/scale.py: scale.py times one code's round among many other figures, and its `--before`
runs DIR's own scale.py after it, minutes later, on a shared box whose load swings from 1 to 20. Here
each code runs in a child process of this script (with DIR first on PYTHONPATH for the code before; the
child is this same file, so both are timed by the same lines), both set up as scale.py does (real shims
and `sleep`, one log writer appending a record a second to every log, GPUs from a FileGpuProbe, guard
interval an hour, first polls 10 hours away), and the parent lets them take round 1, 2, ... in turn:
before's round k, then now's round k. A round is `PollCalendar.poll` over every run (one round, one
transaction), a second after the last (a second of new records), its posts delivered before the next.
CPU is `time.process_time` of the child: the daemon's every thread (the delivery of the round's own
posts overlaps its end, in both codes). `--profile PATH` writes a cProfile (thread CPU time) of this
code's rounds. `--one-at-a-time` runs the children one after the other (memory), rounds not interleaved.
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
from _common import emit, fmt_us, kill_runs, mem_available_gib, write_gpu_file, write_registry, write_run

HERE = Path(__file__).resolve().parent
SHIM_MIB = 12  # a shim (python) + sleep, resident (bench/scale.py)
POLL_LATER = "\n[poll]\nfirst_after_minutes = 600\n"  # no poll of the daemon's own during the timed rounds


def _daemon_modules() -> tuple[Any, Any, Any]:
    """Daemon, ConsoleChannel, FileGpuProbe of whichever babysit is first on the path (the package layout
    moved after 43c3b3c: babysit.daemon became babysit.service.daemon)."""
    from babysit.probes.gpu import FileGpuProbe
    try:
        from babysit.channels.notify import ConsoleChannel
        from babysit.service.daemon import Daemon
    except ImportError:  # the code before the package move
        from babysit.daemon import Daemon  # type: ignore[no-redef]
        from babysit.notify import ConsoleChannel  # type: ignore[no-redef]
    return Daemon, ConsoleChannel, FileGpuProbe


def child(args: argparse.Namespace) -> int:
    """One code's daemon: set up, then each round when the parent says so (control files)."""
    try:
        from babysit.runtime import logs
    except ImportError:
        from babysit import logs  # type: ignore[no-redef]
    logs.configure(None, console=False)
    logging.getLogger().addHandler(logging.NullHandler())  # the runs killed at teardown are not news
    daemon_cls, console, file_probe = _daemon_modules()
    control = Path(args.control)
    n = args.runs
    root = Path(tempfile.mkdtemp(prefix=f"babysit-pollround{n}-"))
    names = [f"r{i:04d}" for i in range(n)]
    gpu_file = root / "gpus.json"
    write_gpu_file(gpu_file)
    for name in names:
        write_run(root, name, ["sleep", "100000"], gpus="[0]", extra=f"gpu_hours_cap = 100000\n{POLL_LATER}")
    write_registry(root, names, guard_interval_seconds=3600.0)
    (root / "logs").mkdir()
    logs_ = [str(root / "logs" / f"{name}.jsonl") for name in names]
    writer = subprocess.Popen([sys.executable, str(HERE / "_logwriter.py"), "--interval", "1", *logs_],
                              start_new_session=True)
    daemon = None
    try:
        daemon = daemon_cls(root / "babysit.toml", gpu_probe=file_probe(gpu_file),
                            channel=console(root / ".babysit", open(os.devnull, "w")))  # noqa: SIM115
        t0 = time.perf_counter()
        daemon.start()
        launch_s = time.perf_counter() - t0
        drain(daemon)
        for _ in range(2):  # two guard rounds: every log read up to now, as before a poll in the daemon
            time.sleep(1)
            daemon.guards()
        sups = list(daemon.supervisors.values())
        moved = hasattr(daemon.ctx.polls, "due") and not hasattr(sups[0], "take_poll")  # the calendar calls RunPolls
        polled = [s.polls for s in sups] if moved else sups  # before the state machine: the supervisor itself
        prof = None
        if args.profile:
            import cProfile

            prof = cProfile.Profile(time.thread_time)
        walls, cpus = [], []
        (control / f"{args.code}.ready").write_text(json.dumps({"launch_s": launch_s}))
        for k in range(args.rounds):
            go = control / f"{args.code}.go{k}"
            while not go.exists():
                time.sleep(0.02)
            time.sleep(1)  # a second of new records in every log
            t, c = time.perf_counter(), time.process_time()
            if prof is not None:
                prof.enable()
            daemon.ctx.polls.poll(polled)
            if prof is not None:
                prof.disable()
            walls.append(time.perf_counter() - t)
            cpus.append(time.process_time() - c)
            drain(daemon)
            (control / f"{args.code}.done{k}").write_text("")
        if prof is not None:
            prof.dump_stats(args.profile)
        Path(args.out).write_text(json.dumps({"code": args.code, "runs": n, "launch_s": launch_s,
                                              "walls_s": walls, "cpus_s": cpus}))
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(writer.pid, signal.SIGKILL)
        writer.wait()
        if daemon is not None:
            daemon.shutdown()
        kill_runs(root)
        shutil.rmtree(root, ignore_errors=True)
    return 0


def drain(daemon: Any) -> None:
    """Until the daemon's delivery thread has sent everything queued (console channel, /dev/null)."""
    deadline = time.monotonic() + 600
    while daemon.store.pending_count() and time.monotonic() < deadline:
        time.sleep(0.1)


def _spawn(code: str, path: str, args: argparse.Namespace, control: Path, profile: str | None) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(x for x in (path, os.environ.get("PYTHONPATH")) if x)}
    argv = [sys.executable, str(Path(__file__).resolve()), "--child", "--code", code, "--runs", str(args.runs),
            "--rounds", str(args.rounds), "--control", str(control), "--out", str(control / f"{code}.json")]
    if profile:
        argv += ["--profile", profile]
    return subprocess.Popen(argv, env=env, cwd=path)


def _wait(path: Path, procs: list[subprocess.Popen], timeout: float = 3600) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if any(p.poll() not in (None, 0) for p in procs):
            raise SystemExit(f"a child failed before {path.name}: see its output above")
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {path.name}")
        time.sleep(0.05)


def parent(args: argparse.Namespace) -> int:
    codes = [("now", str(HERE.parent))]
    if args.before:
        codes.insert(0, ("before", str(Path(args.before).resolve())))
    need = len(codes if not args.one_at_a_time else codes[:1]) * args.runs * SHIM_MIB / 1024 + 2
    if mem_available_gib() < need:
        raise SystemExit(f"{mem_available_gib():.1f} GiB available, ~{need:.1f} GiB needed for {args.runs} runs "
                         f"x {len(codes)} codes: fewer --runs, or --one-at-a-time")
    control = Path(tempfile.mkdtemp(prefix="babysit-pollround-ctl-"))
    results = []
    try:
        groups = [[c] for c in codes] if args.one_at_a_time else [codes]
        for group in groups:
            procs = [_spawn(code, path, args, control, args.profile if code == "now" else None)
                     for code, path in group]
            try:
                for code, _ in group:
                    _wait(control / f"{code}.ready", procs)
                for k in range(args.rounds):  # in turn: before's round k, then now's
                    for code, _ in group:
                        (control / f"{code}.go{k}").write_text("")
                        _wait(control / f"{code}.done{k}", procs)
                for p in procs:
                    p.wait(timeout=600)
            finally:
                for p in procs:
                    if p.poll() is None:
                        p.kill()
            results += [json.loads((control / f"{code}.json").read_text()) for code, _ in group]
    finally:
        shutil.rmtree(control, ignore_errors=True)

    def med(xs: list[float]) -> float:
        return sorted(xs)[len(xs) // 2]

    rows = []
    for r in results:
        rows.append([r["code"], r["runs"], f"{r['launch_s']:.0f} s", f"**{fmt_us(med(r['cpus_s']) * 1e6)}**",
                     fmt_us(med(r["walls_s"]) * 1e6), ", ".join(fmt_us(x * 1e6) for x in r["cpus_s"]),
                     fmt_us(med(r["cpus_s"]) / r["runs"] * 1e6)])
    notes = [f"{args.rounds} rounds a code, {'one code after the other' if args.one_at_a_time else 'the codes in turn'}"
             "; CPU: time.process_time of the code's process (every thread)"]
    by = {r["code"]: r for r in results}
    if "before" in by and "now" in by:
        ratio = med(by["now"]["cpus_s"]) / med(by["before"]["cpus_s"])
        notes.append(f"now / before, median CPU: {ratio:.2f} ({(1 - ratio) * 100:+.0f} % below before)")
    emit("poll round, side by side", ["code", "runs", "launch", "CPU (median)", "wall (median)", "CPU each round",
                                      "CPU a poll"], rows, {"results": results}, args.json, notes)
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=300)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--before", metavar="DIR", help="also the code exported in DIR (bench/export_before.sh)")
    p.add_argument("--one-at-a-time", action="store_true", help="the codes one after the other (memory)")
    p.add_argument("--profile", metavar="PATH", help="cProfile (thread CPU) of this code's rounds")
    p.add_argument("--json", metavar="PATH")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--code", default="now", help=argparse.SUPPRESS)
    p.add_argument("--control", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    return child(args) if args.child else parent(args)


if __name__ == "__main__":
    sys.exit(main())
