"""Verdict and chart on a 1,000,000-record log.

  python bench/verdict_chart.py               # ~1 min here
  python bench/verdict_chart.py --records 200000

Times, on one log: `read_all` + `verdict.evaluate` (what `read_registered_verdict` did on EVERY new
eval: the naive way), the daemon's way now (`read_registered_verdict` with a `SeriesCache`: the
first read parses the log once, each later eval parses only the appended bytes), and rendering the
final chart (`write_verdict_files`).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import emit, fmt_us, write_log

from babysit.core.reading.log_records import metric_series
from babysit.core.spec.run_toml import load_spec
from babysit.core.verdict import evaluate
from babysit.db.store import Store
from babysit.sources import logtail
from babysit.verdict import reading


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--records", type=int, default=1_000_000, help="log records (default 1000000)")
    p.add_argument("--eval-every", type=int, default=100, help="an eval record every N steps (default 100)")
    p.add_argument("--evals", type=int, default=20, help="new evals timed on the cached path (default 20)")
    p.add_argument("--json", metavar="PATH")
    args = p.parse_args(argv)

    tmp = Path(tempfile.mkdtemp(prefix="babysit-verdict-"))
    try:
        n = args.records
        read_step = n - n % args.eval_every + 10 * args.eval_every  # beyond the log: PROVISIONAL until then
        log = tmp / "train_log.jsonl"
        size = write_log(log, n, eval_every=args.eval_every)
        (tmp / "run.toml").write_text(f"""[run]
name = "bench"
command = ["true"]
log = "train_log.jsonl"
gpus = []

[prereg]
question = "does it drift?"
metric = "eval_loss"
train_metric = "train_loss"
baseline_step = {args.eval_every}
read_step = {read_step}
bands = [{{label = "SAME", max = 0.05}}, {{label = "DRIFT", min = 0.05}}]
""")
        spec = load_spec(tmp / "run.toml")
        store = Store(tmp / "state.db")
        sha = spec.prereg.sha256

        t0 = time.perf_counter()
        records, _ = logtail.read_all(log)
        t_read = time.perf_counter() - t0
        t0 = time.perf_counter()
        series = metric_series(records, "eval_loss")
        train = metric_series(records, "train_loss")
        verdict = evaluate(spec.prereg, (), series, train_series=train)
        t_eval = time.perf_counter() - t0
        del records
        t0 = time.perf_counter()
        naive = reading.read_registered_verdict(spec, sha, store)
        t_naive = time.perf_counter() - t0

        cache = reading.SeriesCache(spec.prereg)
        t0 = time.perf_counter()
        first = reading.read_registered_verdict(spec, sha, store, cache=cache)
        t_first = time.perf_counter() - t0
        assert first.to_json("b", sha) == naive.to_json("b", sha)
        per_eval = []
        step = n
        for _ in range(args.evals):  # a new eval arrives after eval_every more train records
            write_log(log, args.eval_every, eval_every=args.eval_every, start=step)
            step += args.eval_every
            t0 = time.perf_counter()
            got = reading.read_registered_verdict(spec, sha, store, cache=cache)
            per_eval.append(time.perf_counter() - t0)
        check = reading.read_registered_verdict(spec, sha, store)  # the whole-log way agrees at the end
        assert got.to_json("b", sha) == check.to_json("b", sha)
        per_eval.sort()
        t_cached = per_eval[len(per_eval) // 2]

        out = tmp / "verdicts"
        t0 = time.perf_counter()
        body = verdict.to_json("bench", sha)
        _, png = reading.write_verdict_files(spec, body, store, out)
        t_chart = time.perf_counter() - t0
        store.close()

        rows: list[list[Any]] = [
            ["read_all (whole log → LogRecords)", fmt_us(t_read * 1e6), ""],
            ["metric_series + verdict.evaluate", fmt_us(t_eval * 1e6), ""],
            ["**naive: read_registered_verdict, whole log, per new eval**", f"**{fmt_us(t_naive * 1e6)}**", "1x"],
            ["daemon now: first read (SeriesCache fills)", fmt_us(t_first * 1e6), f"{t_naive / t_first:.1f}x"],
            [f"**daemon now: per new eval ({args.eval_every} new records), median of {args.evals}**",
             f"**{fmt_us(t_cached * 1e6)}**", f"**{t_naive / t_cached:,.0f}x**"],
            ["final: write_verdict_files (JSON + chart PNG, re-reads the log)", fmt_us(t_chart * 1e6), ""],
        ]
        notes = [f"log: {n:,} records ({size / 1e6:.0f} MB), an eval every {args.eval_every} steps "
                 f"({len(series):,} eval points, {len(train):,} train points); verdict {body['status']} "
                 f"({body.get('reason') or body.get('label')}); chart {png.stat().st_size / 1e3:.0f} kB",
                 "the final verdict (once per run) still reads the whole log as a finished file, by design"]
        emit("verdict and chart (1M-record log)", ["step", "time", "ratio vs naive"], rows,
             {"records": n, "log_bytes": size, "read_all_s": t_read, "evaluate_s": t_eval,
              "naive_per_eval_s": t_naive, "cached_first_s": t_first, "cached_per_eval_s": t_cached,
              "cached_per_eval_all_s": per_eval, "chart_s": t_chart, "ratio": t_naive / t_cached}, args.json, notes)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
