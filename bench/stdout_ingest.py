"""A stdout source under a flood: a trainer printing 100,000 lines a second (tqdm-style bar lines and a
nanoGPT metric line every 1,000) babysat by the real `babysit up` at its default cadence, with
`[source] kind = "stdout"`, `preset = "auto"`; beside the same trainer with no babysit, in the same run.

  python bench/stdout_ingest.py                 # 100,000 lines/s for 20 s, here (~1 min)
  python bench/stdout_ingest.py --rate 200000 --seconds 30 --json out.json
  python bench/stdout_ingest.py --before DIR    # and the same under the code in DIR (bench/export_before.sh)

Targets (issue 28): the trainer is not slowed (its stdout goes to a file the executor opened, never a
pipe babysit drains, so it cannot block on babysit: its achieved rate and its slowest burst of prints,
with and without babysit, side by side), and the daemon uses ≤ 5 % of a core meanwhile (its threads' CPU
time over the trainer's run, /proc/PID/task/*/schedstat). Also: every metric line became a record.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import Daemon, cpu_seconds_precise, emit, kill_runs, wait_for, write_registry

HERE = Path(__file__).resolve().parent


def alone(root: Path, rate: float, seconds: float) -> dict:
    report = root / "alone.json"
    with open(root / "alone.out", "wb") as out:
        subprocess.run([sys.executable, str(HERE / "spam_trainer.py"), "--rate", str(rate), "--seconds",
                        str(seconds), "--report", str(report)], stdout=out, check=True)
    return json.loads(report.read_text())


def babysat(root: Path, rate: float, seconds: float, code: str | None = None) -> dict:
    """The trainer under `babysit up`: this tree's, or (`code`) the daemon of the code in that directory."""
    root.mkdir(parents=True, exist_ok=True)
    report = root / "babysat.json"
    (root / "spam.toml").write_text(f"""[run]
name = "spam"
command = {json.dumps([sys.executable, str(HERE / "spam_trainer.py"), "--rate", str(rate), "--seconds",
                       str(seconds), "--report", str(report)])}

[source]
kind = "stdout"
preset = "auto"

[guards]
min_free_host_ram_gib = 0.1

[retry]
max_attempts = 1
""")
    write_registry(root, ["spam"])
    env = {"BABYSIT_GPU_PROBE": "none"}
    if code is not None:
        env["PYTHONPATH"] = os.pathsep.join(x for x in (code, os.environ.get("PYTHONPATH")) if x)
    daemon = Daemon(root, "--no-view", env=env)
    try:
        wait_for(lambda: (root / ".babysit" / "runs" / "spam" / "attempt-1" / "stdout.log").exists(), 60,
                 "the run launched")
        cpu0, t0 = cpu_seconds_precise(daemon.pid), time.monotonic()
        wait_for(report.exists, seconds * 4 + 60, "the trainer done")
        cpu1, t1 = cpu_seconds_precise(daemon.pid), time.monotonic()
        records = root / ".babysit" / "runs" / "spam" / "records.jsonl"
        wanted = int(rate * seconds) // 1000

        def caught_up() -> bool:
            try:
                return sum(1 for line in records.open() if '"train_loss"' in line) >= wanted
            except FileNotFoundError:
                return False

        waited = time.monotonic()
        wait_for(caught_up, 120, "the records caught up")
        catch_up_s = time.monotonic() - waited
        got = json.loads(report.read_text())
        got.update(daemon_cpu_s=cpu1 - cpu0, wall_s=t1 - t0, core_pct=(cpu1 - cpu0) / (t1 - t0) * 100,
                   records=wanted, catch_up_s=catch_up_s)
        return got
    finally:
        daemon.stop()
        kill_runs(root)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rate", type=float, default=100_000)
    p.add_argument("--seconds", type=float, default=20)
    p.add_argument("--json", default=None)
    p.add_argument("--before", metavar="DIR", help="also babysit it with the code exported in DIR, in the same run")
    a = p.parse_args()
    with tempfile.TemporaryDirectory() as d:
        root = Path(d)
        base = alone(root, a.rate, a.seconds)
        under = babysat(root / "now", a.rate, a.seconds)
        before = babysat(root / "before", a.rate, a.seconds, a.before) if a.before else None

    def row(label: str, got: dict) -> list[str]:
        return [label, f"{got['rate']:,.0f}", f"{got['worst_burst_s'] * 1e3:.1f} ms",
                f"{got['core_pct']:.2f} % ({got['daemon_cpu_s']:.2f} CPU-s in {got['wall_s']:.0f} s)",
                f"{got['records']:,} metric records, the last {got['catch_up_s']:.1f} s after the trainer ended"]

    rows = [["trainer alone", f"{base['rate']:,.0f}", f"{base['worst_burst_s'] * 1e3:.1f} ms", "—", "—"],
            row("trainer under `babysit up`", under)]
    if before is not None:
        rows.append(row(f"under the code in {a.before}", before))
    slowed = (base["rate"] - under["rate"]) / base["rate"] * 100
    emit("A stdout source under 100,000 printed lines a second (bench/stdout_ingest.py)",
         ["", "lines/s achieved", "slowest burst of prints", "daemon's share of a core", "records"], rows,
         {"alone": base, "babysat": under, "before": before, "rate": a.rate, "seconds": a.seconds}, a.json,
         notes=[f"target {a.rate:,.0f} lines/s for {a.seconds:g} s, in 100 bursts a second; the trainer's rate "
                f"under babysit is {slowed:+.1f} % below its rate alone (negative: faster)",
                "daemon ≤ 5 % of a core: " + ("met" if under["core_pct"] <= 5 else "missed")])
    return 0


if __name__ == "__main__":
    sys.exit(main())
