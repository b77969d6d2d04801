"""Fleet: three daemons (`babysit up`, real processes, host names box-a/b/c) on one real PostgreSQL, N runs
each (default 50), on this machine; the issue-27 targets measured side by side in one run.

  python bench/fleet.py                      # 3 boxes x 50 runs (~3 min: mostly the dead-box wait)
  python bench/fleet.py --runs 10 --aborts 5 --idle-s 30

What is timed:
- `/babysit status` over every box's runs: what the bot's handler computes (bot/handlers.py `status`:
  the registry read, `bot.reads.fleet_rows` — every box's rows from the database through the reader the
  bot keeps across commands, each box's staleness — and the rendered table), in this process acting as
  box-a's gateway: median and worst of 10 after the first (the first, which opens the connection and
  reads every run.toml of box-a, is reported on its own).
- abort: `store.request(RUN, "abort")` written by box-a's gateway for a run of box-b, to the SIGTERM
  arriving in the trainer on box-b (the trainer writes the time it got it): median and worst of --aborts.
  The daemons' guard rounds are 30 s apart, so only the NOTIFY can make this fast.
- idle database load, at rest (after --settle-s: one guard round): every statement the server logged
  (log_statement=all, log_line_prefix with the application name, which is `babysit:HOST` for a box's
  store and `babysit-fleet:HOST` for its lease connection) over --idle-s seconds with every run running
  and nothing due, per box.
- a dead box: box-c's daemon SIGKILLed; the time to the host-lost alert being SENT by a live box, from
  the kill and from box-c's last lease renewal (lease 30 s, the default).
The trainers are bench/_term_trainer.py: a record every 5 s, nothing else.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from babysit import registry  # noqa: E402
from babysit.db.localserver import LocalPostgres  # noqa: E402
from babysit.db.migrate import upgrade_postgres  # noqa: E402

PY = sys.executable
BOXES = ("box-a", "box-b", "box-c")
TRAINER = ROOT / "bench" / "_term_trainer.py"


def spec(box: Path, run: str) -> Path:
    path = box / f"{run}.toml"  # the command runs in its spec's directory: outputs/ is under the box
    cmd = [PY, str(TRAINER), f"outputs/{run}/train_log.jsonl", "5"]
    path.write_text(f"""[run]
name = "{run}"
command = {json.dumps(cmd)}
log = "outputs/{{name}}/train_log.jsonl"
gpus = []

[guards]
min_free_host_ram_gib = 0.01
stop_grace_seconds = 30
stall_minutes = 120

[poll]
first_after_minutes = 600
every_minutes = 600
""")
    return path


def make_box(root: Path, name: str, url: str, runs: int) -> Path:
    box = root / name
    box.mkdir(parents=True)
    (box / "babysit.toml").write_text(f'[store]\nurl = "{url}"\n[host]\nname = "{name}"\n')
    stamp = registry.utc_timestamp(datetime.now(timezone.utc))
    entries = [registry.RunEntry(f"{name[-1]}{i:03d}", str(spec(box, f"{name[-1]}{i:03d}").relative_to(box)), stamp)
               for i in range(runs)]

    def add_all(reg: registry.Registry) -> tuple[registry.Registry, None]:
        for e in entries:
            reg, _ = registry.with_run(reg, e)
        return reg, None

    registry.update(box / "babysit.toml", add_all)
    return box


def env() -> dict[str, str]:
    out = {**os.environ, "PYTHONPATH": str(ROOT), "BABYSIT_GPU_PROBE": "none"}
    for key in ("SLACK_BOT_TOKEN", "BABYSIT_STORE_URL", "BABYSIT_HOST"):
        out.pop(key, None)
    return out


def wait_for(check, timeout: float, every: float = 0.2):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(every)
    raise SystemExit(f"timed out after {timeout}s")


def kill_trainers(url: str) -> None:
    """Every attempt this bench's daemons left running (SIGTERM did not stop the runs: it never does)."""
    from babysit.db.postgres import PostgresStore

    store = PostgresStore(url, host="bench")
    try:
        for a in store.live_attempts():
            if a.pid:
                try:
                    os.killpg(a.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
    finally:
        store.close()


def statements(log: Path, since: int, texts: Counter[str] | None = None) -> tuple[Counter[str], int]:
    """Statements per application name in the server log after byte `since`; and the new end. `texts`
    (when given) counts each statement's first 60 characters, to say what the load is made of."""
    data = log.read_bytes()
    counts: Counter[str] = Counter()
    for line in data[since:].decode("utf-8", "replace").splitlines():
        m = re.match(r"(\S*)\|LOG:\s+(?:statement|execute [^:]*):\s*(.*)", line)
        if m:
            counts[m.group(1)] += 1
            if texts is not None:
                texts[m.group(2)[:60]] += 1
    return counts, len(data)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--runs", type=int, default=50)
    p.add_argument("--aborts", type=int, default=20)
    p.add_argument("--idle-s", type=float, default=60.0)
    p.add_argument("--settle-s", type=float, default=35.0, help="wait this long (a guard round) before the idle window")
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args()

    root = Path(tempfile.mkdtemp(prefix="babysit-fleet-bench-"))
    os.chmod(root, 0o755)
    server = LocalPostgres(root / "pg", settings="-c log_statement=all -c log_line_prefix='%a|'")
    procs: dict[str, subprocess.Popen[bytes]] = {}
    url = ""
    out: dict[str, object] = {"boxes": len(BOXES), "runs_per_box": args.runs}
    try:
        server.start()
        url = server.create_database("fleet")
        upgrade_postgres(url)
        boxes = {name: make_box(root, name, url, args.runs) for name in BOXES}
        for name, box in boxes.items():
            log = open(box / "daemon-out.txt", "ab")  # noqa: SIM115
            procs[name] = subprocess.Popen([PY, "-m", "babysit", "up", "--registry", str(box / "babysit.toml")],
                                           cwd=box, env=env(), stdout=log, stderr=subprocess.STDOUT,
                                           start_new_session=True)
        from babysit.db.postgres import PostgresStore

        gateway = PostgresStore(url, host="box-a")
        total = len(BOXES) * args.runs
        t0 = time.monotonic()
        wait_for(lambda: len([a for a in gateway.live_attempts() if a.status == "running"]) == total, 600, 1.0)
        out["all_running_after_s"] = round(time.monotonic() - t0, 1)
        time.sleep(5)

        # /babysit status over every box's runs, as the bot's handler computes it
        from bot import messages as msg
        from bot.reads import fleet_rows

        times = []
        for _ in range(11):
            started = time.perf_counter()
            reg_a = registry.load(boxes["box-a"] / "babysit.toml")
            rows, lines = fleet_rows(reg_a)
            rendered = msg.status_message(rows, time.time(), lines)
            times.append(time.perf_counter() - started)
            time.sleep(0.5)  # commands apart, as people type them (the trainers write meanwhile)
        assert len(rows) == total, len(rows)
        out["status_rows"] = len(rows)
        out["status_ms_first"] = round(times[0] * 1000, 1)
        out["status_ms_median"] = round(statistics.median(times[1:]) * 1000, 1)
        out["status_ms_worst"] = round(max(times[1:]) * 1000, 1)
        out["status_chars"] = len(rendered.text)

        # idle load, per box: at rest, after every run's first guard round (which reads each run's ended
        # attempts once, for its GPU-hours: a one-off a run, not load)
        time.sleep(args.settle_s)
        log = server.data / "server.log"
        _, mark = statements(log, 0)
        time.sleep(args.idle_s)
        texts: Counter[str] = Counter()
        counts, _ = statements(log, mark, texts)
        out["idle_statements"] = dict(texts.most_common(12))
        per_box = {}
        for name in BOXES:
            n = counts.get(f"babysit:{name}", 0) + counts.get(f"babysit-fleet:{name}", 0)
            per_box[name] = round(n / args.idle_s, 3)
        out["idle_queries_per_s"] = per_box

        # abort: box-a's gateway -> SIGTERM in a trainer on box-b
        lat = []
        for i in range(args.aborts):
            run = f"b{i:03d}"
            term = boxes["box-b"] / "outputs" / run / "train_log.jsonl.term"
            asked = time.time()
            gateway.request(run, "abort", "bench", asked)
            wait_for(term.exists, 30, 0.002)
            lat.append(json.loads(term.read_text())["ts"] - asked)
            time.sleep(0.2)
        out["abort_ms_median"] = round(statistics.median(lat) * 1000, 1)
        out["abort_ms_worst"] = round(max(lat) * 1000, 1)

        # a dead box
        os.killpg(procs["box-c"].pid, signal.SIGKILL)
        killed = time.time()
        procs.pop("box-c").wait(10)

        def alert():  # type: ignore[no-untyped-def]
            return [m for m in gateway.messages("") if "box box-c lost" in m.payload.get("text", "")
                    and m.status == "sent"]

        sent = wait_for(alert, 180, 0.2)
        renewed = next(h for h in gateway.hosts() if h["name"] == "box-c")["renewed_at"]
        out["dead_box_alert_s_after_kill"] = round(sent[0].sent_at - killed, 1)
        out["dead_box_alert_s_after_last_lease"] = round(sent[0].sent_at - renewed, 1)
        out["dead_box_alerts"] = len([m for m in gateway.messages("") if "box box-c lost" in m.payload.get("text", "")])
        gateway.close()
    finally:
        for proc in procs.values():
            proc.send_signal(signal.SIGTERM)
        for proc in procs.values():
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
        if url:
            kill_trainers(url)
        server.stop("immediate")
        shutil.rmtree(root, ignore_errors=True)
    print("| what | figure | target |\n| --- | --- | --- |")
    print(f"| `/babysit status`, {out['status_rows']} runs on 3 boxes | median {out['status_ms_median']} ms, "
          f"worst {out['status_ms_worst']} ms (the bot's first: {out['status_ms_first']} ms) | ≤ 300 ms |")
    print(f"| abort, box-a's gateway → SIGTERM on box-b ({args.aborts}) | median {out['abort_ms_median']} ms, "
          f"worst {out['abort_ms_worst']} ms | ≤ 1 s |")
    print(f"| idle database load | {', '.join(f'{k} {v}/s' for k, v in per_box.items())} | ≤ 1 query/s a box |")
    print(f"| dead box alerted | {out['dead_box_alert_s_after_last_lease']} s after its last lease "
          f"({out['dead_box_alert_s_after_kill']} s after the kill), {out['dead_box_alerts']} alert | ≤ 60 s |")
    if args.json:
        args.json.write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
