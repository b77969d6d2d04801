"""What one `babysit.log` call costs the training loop, beside `wandb.log` in offline mode.

  python bench/writer_cost.py                      # ~30 s here, most of it wandb's start and finish
  python bench/writer_cost.py --calls 20000 --json out.json
  python bench/writer_cost.py --before DIR         # also DIR's client (bench/export_before.sh), same rounds

Both loggers get the same records (a step and three floats, as a trainer logs every step). Each call's
wall time is taken with `time.perf_counter`; the CPU a call is `time.process_time` over a round. babysit's
calls (and --before's) run in interleaved rounds, so a noisy box's load falls on each alike. wandb's call
is what the loop sees: the record handed to wandb's own process, which writes it; `wandb.init` and
`run.finish` are timed apart. Target: `babysit.log` many times cheaper than `wandb.log`.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import emit, fmt_us, summary
from _log_calls import load_client, records, time_babysit, time_wandb

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--calls", type=int, default=5000, help="records each logger writes")
    p.add_argument("--before", metavar="DIR", help="also time DIR's client (bench/export_before.sh)")
    p.add_argument("--json", default=None, help="write the figures as JSON here")
    a = p.parse_args()
    recs = records(a.calls)
    clients = {"now": load_client(None), **({"before": load_client(a.before)} if a.before else {})}
    with tempfile.TemporaryDirectory() as d:
        ours = time_babysit(Path(d) / "train_log.jsonl", recs, clients)
        walls, init_s, finish_s = time_wandb(Path(d), recs)
    theirs = summary(walls)
    rows = []
    for name, got in ours.items():
        ratio = theirs["median_us"] / got["median_us"]
        rows.append([f"`babysit.log`{' (before)' if name == 'before' else ''}", fmt_us(got["median_us"]),
                     fmt_us(got["p90_us"]), fmt_us(got["cpu_us"]), f"{ratio:,.0f}× cheaper"])
    rows.append(["`wandb.log` (offline)", fmt_us(theirs["median_us"]), fmt_us(theirs["p90_us"]), "—", "—"])
    emit("One log call (bench/writer_cost.py)", ["call", "median", "p90", "CPU a call", "than wandb.log"], rows,
         {"babysit": ours, "wandb": theirs, "wandb_init_s": init_s, "wandb_finish_s": finish_s, "calls": a.calls},
         a.json, notes=[f"{a.calls} calls each, the same records (a step, 3 floats); wandb.init {init_s:.2f} s and "
                        f"run.finish {finish_s:.2f} s are not in its per-call figure"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
