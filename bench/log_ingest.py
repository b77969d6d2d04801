"""Log ingestion: the incremental reader (`logtail.read_new`) vs re-parsing the whole log each poll.

  python bench/log_ingest.py                 # 1 GB log in /tmp (deleted after); ~2 min here
  python bench/log_ingest.py --gb 0.2        # quicker

Reports (1) throughput of the incremental reader over the whole file, MB/s, vs a `json.loads` per
line loop and pandas `read_json(lines=True)`; (2) the cost of ONE poll (a fixed append of records,
then read) as the log grows: it must stay flat (O(new bytes)) while the naive ways grow with the log.
pandas is measured up to --pandas-max-mb (it needs ~10x the file in RAM) and says so.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import emit, fmt_us, log_line, naive_parse, summary, time_calls, write_log

from babysit.sources import logtail

MB = 1e6


def grow(path: Path, target: int, block: bytes) -> None:
    """Append copies of `block` until the file is at least `target` bytes (fast: no per-line work)."""
    size = path.stat().st_size if path.exists() else 0
    with open(path, "ab") as f:
        while size < target:
            f.write(block)
            size += len(block)


def naive_pandas(path: Path) -> int:
    import pandas as pd

    return len(pd.read_json(path, lines=True))


def incremental_pass(path: Path) -> tuple[float, int]:
    """Seconds and records for read_new from offset 0 to the end, in its default 64 MiB windows."""
    state = logtail.TailState()
    size = path.stat().st_size
    records = 0
    t0 = time.perf_counter()
    while state.offset < size:
        got = logtail.read_new(path, state)
        records += len(got.records)
        if got.state.offset == state.offset:
            break
        state = got.state
    return time.perf_counter() - t0, records


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--gb", type=float, default=1.0, help="final log size in GB (default 1.0)")
    p.add_argument("--append", type=int, default=20, help="records appended per poll (default 20)")
    p.add_argument("--polls", type=int, default=200, help="timed polls per size (default 200)")
    p.add_argument("--naive-max-mb", type=float, default=1100, help="largest size the json loop re-reads")
    p.add_argument("--pandas-max-mb", type=float, default=200, help="largest size pandas reads (RAM: ~10x)")
    p.add_argument("--dir", default=tempfile.gettempdir(), help="where the log is written (default /tmp)")
    p.add_argument("--json", metavar="PATH")
    args = p.parse_args(argv)
    try:
        import pandas  # noqa: F401
        have_pandas = True
    except ImportError:
        have_pandas = False

    path = Path(args.dir) / f"babysit-ingest-{os.getpid()}.jsonl"
    block = b"".join(log_line(s, 1.7e9 + s, eval_every=100) for s in range(8000))  # ~1 MB of records
    target = int(args.gb * 1e9)
    sizes = [s for s in (1e6, 10e6, 100e6, 1e9, 10e9) if s < target] + [target]
    rows: list[list[Any]] = []
    per_size: list[dict[str, Any]] = []
    notes: list[str] = []
    step = [10**9]
    try:
        for size in sizes:
            grow(path, int(size), block)
            real = path.stat().st_size
            head = logtail.read_new(path, logtail.TailState(), max_bytes=1, max_line_bytes=4096).state
            state = replace(head, offset=real)  # caught up at `real` bytes, as a daemon that has read it all

            def append() -> None:
                write_log(path, args.append, start=step[0])
                step[0] += args.append

            def poll() -> None:
                nonlocal state
                got = logtail.read_new(path, state)
                assert len(got.records) == args.append, (len(got.records), got.garbage)
                state = got.state

            ours = summary(time_calls(poll, args.polls, setup=append))
            entry: dict[str, Any] = {"log_mb": real / MB, "read_new_per_poll": ours}
            if real <= args.naive_max_mb * MB:
                t = time_calls(lambda: naive_parse(path), 1 if real > 50 * MB else 3)
                entry["naive_json_per_poll"] = summary(t)
            if have_pandas and real <= args.pandas_max_mb * MB:
                t = time_calls(lambda: naive_pandas(path), 1 if real > 50 * MB else 3)
                entry["pandas_per_poll"] = summary(t)
            per_size.append(entry)
            nj = entry.get("naive_json_per_poll", {}).get("median_us")
            pdv = entry.get("pandas_per_poll", {}).get("median_us")
            rows.append([f"{real / MB:,.0f} MB", fmt_us(ours["median_us"]), fmt_us(ours["p90_us"]),
                         fmt_us(nj) if nj else "not measured", fmt_us(pdv) if pdv else "not measured",
                         f"{nj / ours['median_us']:,.0f}x" if nj else "—"])
            print(f"  {real / MB:,.0f} MB: per poll {fmt_us(ours['median_us'])}", file=sys.stderr, flush=True)
        # throughput over the whole (largest) file
        real = path.stat().st_size
        secs, records = incremental_pass(path)
        tput = {"incremental_read_new_mb_s": real / MB / secs, "records": records, "seconds": secs}
        last = per_size[-1]
        if "naive_json_per_poll" in last:
            tput["json_loop_mb_s"] = real / MB / (last["naive_json_per_poll"]["median_us"] / 1e6)
        pandas_entry = next((e for e in reversed(per_size) if "pandas_per_poll" in e), None)
        if pandas_entry:
            tput["pandas_mb_s"] = pandas_entry["log_mb"] / (pandas_entry["pandas_per_poll"]["median_us"] / 1e6)
            tput["pandas_measured_at_mb"] = pandas_entry["log_mb"]
        rows.append(["**throughput, whole file**", f"read_new {tput['incremental_read_new_mb_s']:.1f} MB/s", "",
                     f"json loop {tput.get('json_loop_mb_s', float('nan')):.1f} MB/s",
                     f"pandas {tput.get('pandas_mb_s', float('nan')):.1f} MB/s"
                     + (f" (at {tput['pandas_measured_at_mb']:.0f} MB)" if pandas_entry else ""), ""])
        if not have_pandas:
            notes.append("pandas not installed: its column says not measured")
        notes.append(f"per poll: {args.append} records (~{args.append * len(block) // 8000} B) appended, then read; "
                     f"pandas only up to {args.pandas_max_mb:.0f} MB (RAM), the json loop up to "
                     f"{args.naive_max_mb:.0f} MB. Log deleted after.")
        flat = per_size[-1]["read_new_per_poll"]["median_us"] / per_size[0]["read_new_per_poll"]["median_us"]
        notes.append(f"read_new per poll at the largest size / at the smallest: {flat:.2f} (1.0 = O(new bytes))")
        emit("log ingestion", ["log size", "read_new / poll (median)", "p90", "naive json re-parse / poll",
                               "pandas read_json / poll", "ratio json / ours"], rows,
             {"per_size": per_size, "throughput": tput, "append": args.append, "flatness": flat}, args.json, notes)
    finally:
        path.unlink(missing_ok=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
