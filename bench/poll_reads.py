"""Every run's latest poll, read typed: what the web page, `status --watch` and the fleet's status pay a
refresh for the runs' polls (the snapshot column parsed into the frozen `Snapshot`, its GPU rows used).

  python bench/poll_reads.py                 # 1,000 runs, 15 refreshes
  python bench/poll_reads.py --runs 4000 --n 5

A real SQLite store holds one poll a run (a two-GPU snapshot as the daemon writes it:
tests/fixtures/store/snapshots_2026-12-02.json). Timed: `Store.latest_polls()` and each run's step and
GPU utilizations read from the typed snapshot — the first refresh of a fresh store (every snapshot parsed)
and later ones (each poll parsed once: `Store._poll`). The naive way beside it: the same query with each
snapshot's JSON loaded as a dict at every refresh (what the surfaces did before the snapshot was typed).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import REPO, emit, fmt_us, summary, time_calls

sys.path.insert(0, str(REPO))
from babysit.db.store import Store

SNAPSHOT = REPO / "tests" / "fixtures" / "store" / "snapshots_2026-12-02.json"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=1000)
    p.add_argument("--n", type=int, default=15, help="refreshes timed (default 15)")
    p.add_argument("--json", metavar="PATH")
    args = p.parse_args()
    text = json.dumps(json.loads(SNAPSHOT.read_text())[0])
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "state.db"
        seed = Store(path)
        with seed.tx() as db:
            db.executemany("INSERT INTO polls (run, attempt, at, kind, snapshot) VALUES (?, 1, 1.0, 'periodic', ?)",
                           [(f"run{i:04d}", text) for i in range(args.runs)])
        seed.close()
        store = Store(path)

        def typed() -> int:
            return sum((p.snapshot.step or 0) + len(p.snapshot.measured) for p in store.latest_polls().values())

        def naive() -> int:
            rows = store._query("SELECT * FROM polls WHERE id IN (SELECT MAX(id) FROM polls GROUP BY run)")
            total = 0
            for r in rows:
                body = json.loads(r["snapshot"])
                measured = [g for g in body.get("gpus") or () if g.get("util_pct") is not None]
                total += (body.get("step") or 0) + len(measured)
            return total

        assert typed() == naive()  # the same figures either way (and the database's pages warm)
        first = time_calls(lambda: (store._polls_read.clear(), typed()), args.n)  # a fresh store's first refresh
        warm = time_calls(typed, args.n)
        dicts = time_calls(naive, args.n)
        store.close()
    f, w, d = summary(first), summary(warm), summary(dicts)
    emit(f"every run's latest poll read, {args.runs} runs",
         ["refresh", "median", "p90", "naive (dicts, every refresh)"],
         [["first (each snapshot parsed)", fmt_us(f["median_us"]), fmt_us(f["p90_us"]), fmt_us(d["median_us"])],
          ["**later (each poll parsed once)**", f"**{fmt_us(w['median_us'])}**", fmt_us(w["p90_us"]),
           fmt_us(d["median_us"])]],
         {"runs": args.runs, "first": f, "warm": w, "naive": d}, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
