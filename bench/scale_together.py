"""Guard and poll rounds of two codes at N runs, timed in the same minutes: this tree's and an export's.

  python bench/scale_together.py --runs 300 --before DIR                  # DIR: bash bench/export_before.sh REV DIR
  python bench/scale_together.py --runs 300 --before DIR --order same-time --guard-rounds 11
  python bench/scale_together.py --runs 1000 --before DIR --order one-at-a-time      # 1,000: ~12 GB each

Why beside bench/scale.py: scale.py times one code's rounds among many other figures, and its `--before`
runs DIR's own scale.py after it, minutes later, on a shared box whose load swings from 1 to 20 (two such
runs of the same two codes here: this tree's guard round 20 % and then 38 % above 43c3b3c's in CPU).

Here each code runs in a child process: this same file, with DIR first on PYTHONPATH for the code before,
so both codes are set up and timed by the same lines, scale.py's `launched` (real shims and `sleep`, one
log writer appending a record a second to every log, GPUs from a FileGpuProbe, guard interval an hour,
first polls 10 hours away). The parent hands out the rounds: `--guard-rounds` `Daemon.guards` rounds, then
`--poll-rounds` poll rounds (`PollCalendar.poll` over every run: one round, one transaction, its posts
delivered before the next), each a second after the last (a second of new records). `--order turn` (the
default): before's round k, then now's, so both meet the same load and neither meets the other's round;
`same-time`: both codes' round k started together, competing alike; `one-at-a-time`: one code's child
after the other's (memory; not interleaved). CPU is `time.process_time` of the child: the daemon's every
thread (the delivery of a poll round's own posts overlaps its end, in both codes). The first guard round
reads the launch's backlog and is left out of its median (so at least 2); every poll round counts.
`--profile PREFIX` writes cProfiles (thread CPU time) of this code's rounds: PREFIX.guard, PREFIX.poll.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import emit, fmt_us, mem_available_gib
from scale import SHIM_MIB, drain, launched, quiet_logs

HERE = Path(__file__).resolve().parent
ORDERS = ("turn", "same-time", "one-at-a-time")


def child(args: argparse.Namespace) -> int:
    """One code's daemon: launched, then each round when the parent says so (control files)."""
    quiet_logs()
    control = Path(args.control)
    out: dict[str, Any] = {"code": args.code, "runs": args.runs}
    with launched(args.runs) as (daemon, _root, _names, launch_s):
        out["launch_s"] = launch_s
        drain(daemon)
        sups = list(daemon.supervisors.values())
        moved = hasattr(daemon.ctx.polls, "due") and not hasattr(sups[0], "take_poll")  # the calendar calls RunPolls
        polled = [s.polls for s in sups] if moved else sups  # before the state machine: the supervisor itself
        kinds = (("guard", args.guard_rounds, daemon.guards), ("poll", args.poll_rounds,
                                                             lambda: daemon.ctx.polls.poll(polled)))
        (control / f"{args.code}.ready").write_text("")
        for kind, rounds, fn in kinds:
            prof = None
            if args.profile:
                import cProfile

                prof = cProfile.Profile(time.thread_time)
            walls, cpus = [], []
            for k in range(rounds):
                go = control / f"{args.code}.{kind}.go{k}"
                while not go.exists():
                    time.sleep(0.02)
                time.sleep(1)  # a second of new records in every log
                t, c = time.perf_counter(), time.process_time()
                if prof is not None:
                    prof.enable()
                fn()
                if prof is not None:
                    prof.disable()
                walls.append(time.perf_counter() - t)
                cpus.append(time.process_time() - c)
                if kind == "poll":
                    drain(daemon)
                (control / f"{args.code}.{kind}.done{k}").write_text("")
            if prof is not None:
                prof.dump_stats(f"{args.profile}.{kind}")
            out[f"{kind}_walls_s"], out[f"{kind}_cpus_s"] = walls, cpus
    Path(args.out).write_text(json.dumps(out))
    return 0


def _spawn(code: str, path: str, args: argparse.Namespace, control: Path, profile: str | None) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(x for x in (path, os.environ.get("PYTHONPATH")) if x)}
    argv = [sys.executable, str(Path(__file__).resolve()), "--child", "--code", code, "--runs", str(args.runs),
            "--guard-rounds", str(args.guard_rounds), "--poll-rounds", str(args.poll_rounds),
            "--control", str(control), "--out", str(control / f"{code}.json")]
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


def _round(group: list[tuple[str, str]], kind: str, k: int, order: str, control: Path,
           procs: list[subprocess.Popen]) -> None:
    """Round k of `kind` for every code of the group: in turn, or started together (same-time)."""
    for code, _ in group:
        (control / f"{code}.{kind}.go{k}").write_text("")
        if order != "same-time":
            _wait(control / f"{code}.{kind}.done{k}", procs)
    for code, _ in group:
        _wait(control / f"{code}.{kind}.done{k}", procs)


def med(xs: list[float]) -> float:
    return sorted(xs)[len(xs) // 2]


def parent(args: argparse.Namespace) -> int:
    codes = [("now", str(HERE.parent))]
    if args.before:
        codes.insert(0, ("before", str(Path(args.before).resolve())))
    groups = [[c] for c in codes] if args.order == "one-at-a-time" else [codes]
    need = len(groups[0]) * args.runs * SHIM_MIB / 1024 + 2
    if mem_available_gib() < need:
        raise SystemExit(f"{mem_available_gib():.1f} GiB available, ~{need:.1f} GiB needed for {args.runs} runs "
                         f"x {len(groups[0])} codes at once: fewer --runs, or --order one-at-a-time")
    control = Path(tempfile.mkdtemp(prefix="babysit-together-"))
    results = []
    try:
        for group in groups:
            procs = [_spawn(code, path, args, control, args.profile if code == "now" else None)
                     for code, path in group]
            try:
                for code, _ in group:
                    _wait(control / f"{code}.ready", procs)
                for kind, rounds in (("guard", args.guard_rounds), ("poll", args.poll_rounds)):
                    for k in range(rounds):
                        _round(group, kind, k, args.order, control, procs)
                for p in procs:
                    p.wait(timeout=600)
            finally:
                for p in procs:
                    if p.poll() is None:
                        p.kill()
            results += [json.loads((control / f"{code}.json").read_text()) for code, _ in group]
    finally:
        shutil.rmtree(control, ignore_errors=True)
    for r in results:  # the first guard round reads the launch's backlog
        r["guard_cpu_median_s"], r["guard_wall_median_s"] = med(r["guard_cpus_s"][1:]), med(r["guard_walls_s"][1:])
        if r["poll_cpus_s"]:
            r["poll_cpu_median_s"], r["poll_wall_median_s"] = med(r["poll_cpus_s"]), med(r["poll_walls_s"])
    report(args, results)
    return 0


def report(args: argparse.Namespace, results: list[dict[str, Any]]) -> None:
    def us(r: dict[str, Any], key: str, bold: bool = False) -> str:
        return "—" if key not in r else f"**{fmt_us(r[key] * 1e6)}**" if bold else fmt_us(r[key] * 1e6)

    rows = [[r["code"], r["runs"], f"{r['launch_s']:.0f} s", us(r, "guard_cpu_median_s", True),
             us(r, "guard_wall_median_s"), us(r, "poll_cpu_median_s", True), us(r, "poll_wall_median_s"),
             fmt_us(r["poll_cpu_median_s"] / r["runs"] * 1e6) if "poll_cpu_median_s" in r else "—"]
            for r in results]
    notes = [f"{args.guard_rounds} guard rounds (the first left out of the medians) and {args.poll_rounds} poll "
             f"rounds a code, order: {args.order}; CPU: time.process_time of the code's process (every thread)"]
    for r in results:
        for kind, rounds in (("guard", r["guard_cpus_s"][1:]), ("poll", r["poll_cpus_s"])):
            if rounds:
                notes.append(f"{r['code']}: {kind} rounds' CPU {', '.join(fmt_us(x * 1e6) for x in rounds)}")
    by = {r["code"]: r for r in results}
    ratios = {}
    if "before" in by and "now" in by:
        for kind in ("guard", "poll"):
            key = f"{kind}_cpu_median_s"
            if key in by["now"]:
                ratios[kind] = by["now"][key] / by["before"][key]
                notes.append(f"now / before, {kind} round CPU (median): {ratios[kind]:.2f} "
                             f"({(1 - ratios[kind]) * 100:+.0f} % below before)")
    emit(f"guard and poll rounds, {args.runs} runs, two codes in the same minutes",
         ["code", "runs", "launch", "guard round CPU", "guard wall", "poll round CPU", "poll wall", "CPU a poll"],
         rows, {"results": results, "cpu_ratios": ratios}, args.json, notes)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=300)
    p.add_argument("--guard-rounds", type=int, default=11, help="guard rounds timed, the first left out (≥ 2)")
    p.add_argument("--poll-rounds", type=int, default=5, help="poll rounds timed after them (0: none)")
    p.add_argument("--before", metavar="DIR", help="also the code exported in DIR (bench/export_before.sh)")
    p.add_argument("--order", choices=ORDERS, default="turn", help="how the codes' rounds meet (default: turn)")
    p.add_argument("--profile", metavar="PREFIX", help="cProfiles (thread CPU) of this code's rounds")
    p.add_argument("--json", metavar="PATH")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--code", default="now", help=argparse.SUPPRESS)
    p.add_argument("--control", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.guard_rounds < 2 or args.poll_rounds < 0:
        p.error(f"--guard-rounds: at least 2 (the first reads the launch's backlog), got {args.guard_rounds}; "
                f"--poll-rounds: 0 or more, got {args.poll_rounds}")
    return child(args) if args.child else parent(args)


if __name__ == "__main__":
    sys.exit(main())
