"""One run's look as the daemon takes it, timed whole: the log delta, the host read of the run's tree and the
GPU read in ONE timed call, wall and CPU (issue 26's "poll snapshot"). bench/poll_cost.py times each part
alone and adds them up; this times what a guard check and a poll spend, in `RunObserver.observe`'s order
(log, host, GPU read).

  python bench/poll_snapshot.py                     # on the H200: real NVML, GPU 0
  python bench/poll_snapshot.py --before DIR        # and the code in DIR (bash bench/export_before.sh REV DIR)

Wall: the median of `--n` looks; CPU: every thread's (`time.process_time`) over the `--n` looks, a mean, so
NVML's timed worker and its handoff count in full. `--before DIR` runs this script in a child with DIR first on
PYTHONPATH (the same machine, minutes apart), alternated `--rounds` times with this code's. Keep `--log-records`
modest: each round writes the log and reads it up to date first (200,000 records: seconds a round).

Without NVML (no driver here) it says so and reads the tests' NVML stand-in (tests/nvml_standin.py): the
rows are then babysit's Python and the worker's handoff, not NVML's cost.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import code_args, emit, end_tree, fmt_us, measured_code, spawn_tree, summary, time_calls, write_log


def _imports() -> tuple[Any, Any, Any]:
    """read_host, the log tailer module and NvmlGpuProbe, wherever this code keeps them (43c3b3c:
    babysit.logtail)."""
    from babysit.probes.gpu import NvmlGpuProbe
    from babysit.probes.host import read_host
    try:
        from babysit.sources import logtail
    except ImportError:
        from babysit import logtail  # type: ignore[no-redef]
    return read_host, logtail, NvmlGpuProbe


def measure(n: int, gpu: int, records: int, append: int, children: int, library: Any) -> dict[str, Any]:
    import babysit

    read_host, logtail, NvmlGpuProbe = _imports()
    out: dict[str, Any] = {"code": str(Path(babysit.__file__).resolve().parents[1])}
    tmp = Path(tempfile.mkdtemp(prefix="babysit-look-"))
    tree = spawn_tree(children)
    probe = NvmlGpuProbe(**({} if library is None else {"library": library}))
    try:
        log = tmp / "train_log.jsonl"
        write_log(log, records)
        state = [logtail.read_new(log, logtail.TailState(), max_bytes=2**40).state]  # caught up, as the daemon is
        step = [records]

        def more() -> None:  # untimed: the trainer's records since the last look
            write_log(log, append, start=step[0])
            step[0] += append

        def log_read() -> None:
            got = logtail.read_new(log, state[0])
            assert len(got.records) == append, len(got.records)
            state[0] = got.state

        view = probe.read([gpu])  # initialise: handles, events, the counters' first values
        if not view.available:
            raise SystemExit(f"no GPU to read: {view.reason}")
        read_host(tree.pid)  # the first read primes the CPU counters

        def one_look() -> None:
            log_read()
            read_host(tree.pid)
            probe.read([gpu])

        looks: dict[str, Callable[[], None]] = {"look": one_look}
        for key, look in looks.items():
            for _ in range(20):  # warm
                more()
                look()
            wall = time_calls(look, n, setup=more)
            cpu = 0.0
            for _ in range(n):
                more()
                c0 = time.process_time()
                look()
                cpu += time.process_time() - c0
            out[key] = {**summary(wall), "cpu_us": cpu / n * 1e6}
    finally:
        probe.close()
        end_tree(tree)
    return out


def child(before: str, args: argparse.Namespace) -> dict[str, Any]:
    where = Path(tempfile.mkdtemp(prefix="babysit-look-")) / "out.json"
    cmd = [sys.executable, str(Path(__file__).resolve()), "--code", str(Path(before).resolve()), "--n", str(args.n),
           "--gpu", str(args.gpu), "--log-records", str(args.log_records), "--append", str(args.append),
           "--children", str(args.children), "--rounds", "1", "--json", str(where)]
    if args.stand_in:
        cmd.append("--stand-in")
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return json.loads(where.read_text())["now"][0]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n", type=int, default=300, help="timed looks a way (default 300)")
    p.add_argument("--gpu", type=int, default=0)
    p.add_argument("--log-records", type=int, default=20_000, help="records already in the log (default 20000)")
    p.add_argument("--append", type=int, default=20, help="records appended between two looks (default 20)")
    p.add_argument("--children", type=int, default=4, help="processes under the run's root (default 4)")
    p.add_argument("--rounds", type=int, default=2, help="this code and --before's, alternated (default 2)")
    code_args(p)
    args = p.parse_args(argv)
    why = measured_code(args)
    library = None
    if args.stand_in:
        from tests.nvml_standin import StandIn
        library = StandIn(gpus=1)

    now: list[dict[str, Any]] = []
    before: list[dict[str, Any]] = []
    for _ in range(max(1, args.rounds)):
        now.append(measure(args.n, args.gpu, args.log_records, args.append, args.children, library))
        if args.before and not args.code:
            before.append(child(args.before, args))
    if args.code:
        Path(args.json).write_text(json.dumps({"now": now}, default=str))
        return 0

    rows = []
    labels = {"look": "log delta, host read, GPU read"}
    for name, results in (("this code", now), ("before", before)):
        for key, label in labels.items():
            got = [r[key] for r in results if key in r]
            if got:
                rows.append([f"{name}: {label}", ", ".join(fmt_us(g["median_us"]) for g in got),
                             ", ".join(fmt_us(g["cpu_us"]) for g in got)])
    what = f"STAND-IN (tests/nvml_standin.py; no NVML: {why})" if args.stand_in else f"NVML, GPU {args.gpu}"
    notes = [f"{args.n} looks a way and round, {args.rounds} round(s) alternated; a log of {args.log_records:,} "
             f"records, {args.append} appended between looks; {args.children} processes under the run's root",
             f"code: {now[0]['code']}" + (f"; before: {before[0]['code']}" if before else "")]
    if args.stand_in:
        notes.insert(0, "**A stand-in, not NVML**: the GPU read's calls are Python functions of the tests' stand-in;"
                        " the rows are babysit's Python and the worker's handoff. Run on the GPU machine for NVML's.")
    emit(f"One run's look, whole ({what})", ["look", "wall, median (a round each)", "CPU, every thread (mean)"],
         rows, {"mode": "stand-in" if args.stand_in else "nvml", "n": args.n, "now": now, "before": before},
         args.json, notes)
    return 0


if __name__ == "__main__":
    sys.exit(main())
