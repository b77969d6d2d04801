"""The guard round of two codes at N runs, timed IN THE SAME MINUTES: this tree's and an export's, side by side.

  python bench/scale_together.py --before DIR --runs 300 --ticks 11     # DIR: bash bench/export_before.sh REV DIR

Why: on the shared dev box one code's bench and then the other's (`scale.py --before`) land minutes apart,
and the box's speed moves by a third between them (two such runs of the same two codes here: this tree's
round 20 % and then 38 % above 43c3b3c's in CPU). Here both codes' `scale.py` `one_size` run at once, each
in its own process (its code first on PYTHONPATH), and each waits for the other to be ready before its
first timed round, so their rounds fall in the same seconds of the box's load; both compete alike.

Each process times `Daemon.guards` itself (wall, and `time.process_time`: its threads idle but for the round),
whatever its code's own bench measures, so an export whose scale.py has no CPU figure is measured the same
way. The first round reads the launch's backlog and is left out of the medians. Memory: two sizes' shims at
once (~12 MiB a run each), so 2 x 300 runs need ~7 GiB; 1,000 runs: use `scale.py --sizes 1000 --before DIR`.
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

HERE = Path(__file__).resolve().parent


def worker(code: str, n: int, ticks: int, name: str, peer: str, sync: str) -> None:
    """In a process with `code` first on PYTHONPATH: its scale.py's one_size, its guard rounds timed here."""
    sys.path.insert(0, str(Path(code) / "bench"))
    import logging

    import scale  # the code's own bench module (its one_size launches N runs on its daemon)
    try:
        from babysit.runtime import logs
        from babysit.service.daemon import Daemon
    except ImportError:  # code before the package move (43c3b3c)
        from babysit.daemon import Daemon  # type: ignore[no-redef]

        from babysit import logs  # type: ignore[no-redef]
    timed = Daemon.guards
    cpu: list[float] = []
    wall: list[float] = []

    def guards(self: object) -> None:
        if not cpu:  # before the first timed round: both processes ready, then both go
            Path(sync, f"{name}.ready").touch()
            while not Path(sync, f"{peer}.ready").exists():
                time.sleep(0.2)
        t, c = time.perf_counter(), time.process_time()
        try:
            timed(self)
        finally:
            cpu.append(time.process_time() - c)
            wall.append(time.perf_counter() - t)

    Daemon.guards = guards  # type: ignore[method-assign]
    logs.configure(None, console=False)
    logging.getLogger().addHandler(logging.NullHandler())
    r = scale.one_size(n, argparse.Namespace(ticks=ticks, pathological=False))

    def median(xs: list[float]) -> float:
        rest = sorted(xs[1:])  # the first round reads the launch's backlog
        return rest[len(rest) // 2]

    Path(sync, f"{name}.json").write_text(json.dumps({
        "code": name, "runs": n, "launch_s": r["launch_s"], "cpu_s": cpu, "wall_s": wall,
        "cpu_median_s": median(cpu), "wall_median_s": median(wall)}))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--before", metavar="DIR", required=True, help="the export of the code to compare with")
    p.add_argument("--runs", type=int, default=300)
    p.add_argument("--ticks", type=int, default=11, help="guard rounds timed (the first left out of the medians)")
    p.add_argument("--json", metavar="PATH")
    p.add_argument("--worker", nargs=5, metavar=("CODE", "NAME", "PEER", "SYNC", "N"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        code, name, peer, sync, n = args.worker
        worker(code, int(n), args.ticks, name, peer, sync)
        return 0
    sync = tempfile.mkdtemp(prefix="babysit-together-")
    now = str(HERE.parent)
    procs = []
    for code, name, peer in ((now, "now", "before"), (str(Path(args.before).resolve()), "before", "now")):
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([code, os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))
        procs.append(subprocess.Popen([sys.executable, str(HERE / "scale_together.py"), "--ticks", str(args.ticks),
                                       "--before", args.before, "--worker", code, name, peer, sync, str(args.runs)],
                                      env=env, cwd=tempfile.gettempdir()))
    codes = [p.wait() for p in procs]
    if any(codes):
        print(f"a worker failed (exit codes {codes})", file=sys.stderr)
        return 1
    results = [json.loads(Path(sync, f"{name}.json").read_text()) for name in ("now", "before")]
    shutil.rmtree(sync, ignore_errors=True)
    print(f"\n### guard round, {args.runs} runs, both codes at once\n")
    print("| code | launch | guard round CPU (median) | wall (median) | CPU per round |")
    print("| --- | --- | --- | --- | --- |")
    for r in results:
        rounds = ", ".join(f"{x * 1e3:.0f}" for x in r["cpu_s"][1:])
        print(f"| {r['code']} | {r['launch_s']:.0f} s | {r['cpu_median_s'] * 1e3:.1f} ms | "
              f"{r['wall_median_s'] * 1e3:.0f} ms | {rounds} ms |")
    ratio = results[0]["cpu_median_s"] / results[1]["cpu_median_s"]
    print(f"\nnow / before, CPU: {ratio:.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps({"results": results, "cpu_ratio": ratio}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
