"""`/babysit status` over 3 boxes x N runs with logs of real size, the gateway's two ways side by side:

  python bench/fleet_status.py                 # 3 boxes x 50 runs, 400 records in each log
  python bench/fleet_status.py --runs 50 --records 400 --repeat 10

No daemons: a throwaway PostgreSQL of the machine's server binaries holds every run's rows as daemons
write them (claimed by its box, an attempt running, the step its daemon stored); box-a's 50 logs are
real JSONL files of `--records` records, and every log grows by a record between two commands (minutes
apart, as people type them, every log has grown). bench/fleet.py measures the same command among real
daemons, whose trainers' logs stay small.

- `collect` — the path before: `runview.collect` (a fresh reader: two connections, box-a's run.toml
  files parsed, the last 32 KiB of each of its logs read and parsed) and `fleet_boxes`;
- `gateway` — the bot's path now: `bot.reads.fleet_rows` (every row from the database, through the
  reader the bot keeps across commands) after the registry's read.
Both render the same table (bot.messages.status_message). Median and worst of --repeat after the first.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import fleet as bench  # noqa: E402 - bench/fleet.py's boxes and run.toml files

from babysit.db.localserver import LocalPostgres  # noqa: E402
from babysit.db.migrate import upgrade_postgres  # noqa: E402
from babysit.db.postgres import PostgresStore  # noqa: E402
from babysit.runtime import registry  # noqa: E402
from babysit.view import runview  # noqa: E402
from bot import messages as msg  # noqa: E402
from bot.reads import fleet_rows  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--runs", type=int, default=50)
    p.add_argument("--records", type=int, default=400)
    p.add_argument("--repeat", type=int, default=10)
    args = p.parse_args()
    root = Path(tempfile.mkdtemp(prefix="babysit-status-bench-"))
    os.chmod(root, 0o755)
    server = LocalPostgres(root / "pg")
    try:
        server.start()
        url = server.create_database("fleet")
        upgrade_postgres(url)
        boxes = {name: bench.make_box(root, name, url, args.runs) for name in bench.BOXES}
        now = time.time()
        logs = []
        for name, box in boxes.items():
            store = PostgresStore(url, host=name)
            for entry in registry.load(box / "babysit.toml").runs:
                store.claim_run(entry.name, now)
                attempt = store.begin_attempt(entry.name, 1, "default", ["python"], "local", 0, str(box), now - 100)
                store.mark_running(attempt.id, started_at=now - 100, pid=None)
                store.set_run_state(entry.name, "running", now, step=args.records, last_record_at=now - 3)
                if name == "box-a":  # the gateway's box: its logs are here
                    log = box / "outputs" / entry.name / "train_log.jsonl"
                    log.parent.mkdir(parents=True, exist_ok=True)
                    log.write_text("".join(json.dumps({"step": s, "ts": now - 100 + s * 0.25, "train_loss": 1 / s})
                                           + "\n" for s in range(1, args.records + 1)))
                    logs.append(log)
            store.close()
        path = boxes["box-a"] / "babysit.toml"

        def collect() -> int:
            reg = registry.load(path)
            rows = runview.collect(reg.path, None)
            return len(msg.status_message(rows, time.time(), runview.fleet_boxes(reg)).text)

        def gateway() -> int:
            rows, lines = fleet_rows(registry.load(path))
            return len(msg.status_message(rows, time.time(), lines).text)

        print(f"| path | `/babysit status`, {3 * args.runs} runs, {args.records}-record logs: median / worst of "
              f"{args.repeat} (the first) |\n| --- | --- |")
        for label, once in (("collect (before)", collect), ("gateway (now)", gateway)):
            times = []
            for i in range(args.repeat + 1):
                for log in logs:  # every log grown since the last command
                    with open(log, "a") as f:
                        f.write(json.dumps({"step": args.records + i + 1, "ts": time.time(), "train_loss": 0.001})
                                + "\n")
                started = time.perf_counter()
                once()
                times.append(time.perf_counter() - started)
            print(f"| {label} | {statistics.median(times[1:]) * 1000:.1f} / {max(times[1:]) * 1000:.1f} ms "
                  f"({times[0] * 1000:.1f} ms) |")
    finally:
        server.stop("immediate")
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
