"""How soon a printed NaN stops the run: `babysit run` over a script that prints its loss in a shape no
preset knows (read by the general reader), the loss turning NaN at a step. The script times the stop signal
against the moment it printed its first `nan` line (babysit/demo/printed_shapes.py), so the figure is the
whole path: the line written, the reader thread seeing the file grow (a stat every 0.25 s), the read, the
guard checked at once, the stop signal delivered. Target (issue 40): within 1 s.

  python bench/nan_stop.py                  # 5 runs a shape, ~1 min here
  python bench/nan_stop.py --runs 10 --shapes pipes,epoch-batch,tqdm --json out.json

Each run is a fresh workspace and a fresh `babysit run` (its own daemon in the process), not --accelerated:
the guards' real intervals, as a user runs it.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STOPPED = re.compile(r"stopped, ([\d.]+) s after the first nan line")


def one(shape: str, sleep: float) -> float | None:
    """Seconds from the first nan line printed to the stop signal received, or None (not stopped on it)."""
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "babysit", "run", "--no-view", "--name", "nan", "--registry",
               str(Path(tmp) / "babysit.toml"), "--", sys.executable, "-m", "babysit.demo.printed_shapes",
               "--shape", shape, "--steps", "100000", "--every", "10", "--nan-at", "200", "--sleep", str(sleep)]
        env = {**os.environ, "BABYSIT_GPU_PROBE": "none", "PYTHONPATH": str(ROOT)}
        out = subprocess.run(cmd, cwd=tmp, env=env, capture_output=True, text=True, timeout=300).stdout
        found = STOPPED.search(out)
        return float(found.group(1)) if found else None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--shapes", default="pipes,epoch-batch,tqdm")
    p.add_argument("--sleep", type=float, default=0.01, help="the script's seconds a batch (a line every 10)")
    p.add_argument("--json", help="write the figures here too")
    a = p.parse_args(argv)
    rows = {}
    print(f"{'shape':12s} {'runs':>4s} {'min s':>7s} {'median s':>9s} {'max s':>7s}  (first nan line → stop signal)")
    for shape in a.shapes.split(","):
        got = [one(shape, a.sleep) for _ in range(a.runs)]
        seconds = [g for g in got if g is not None]
        missed = len(got) - len(seconds)
        rows[shape] = {"seconds": seconds, "missed": missed}
        if seconds:
            print(f"{shape:12s} {len(seconds):4d} {min(seconds):7.3f} {statistics.median(seconds):9.3f} "
                  f"{max(seconds):7.3f}" + (f"  ({missed} not stopped on the nan)" if missed else ""))
        else:
            print(f"{shape:12s} none stopped on the nan")
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
