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

  python bench/fleet.py --outage-s 300       # the database down for 5 minutes (~8 min)

With --outage-s the bench measures the outage instead (docs/fleet.md, "The database down"): the three
daemons post to the local Slack server (tests/slack/fake_slack.py); each box also has --ending runs
(bench/_gated_trainer.py, with a [prereg]) that end --end-after-s into the outage, so their ends, FINAL
verdicts and posts happen while PostgreSQL is stopped (`pg_ctl stop -m fast`, then start). Counted: the
posts Slack received while down, each outbox row's deliveries (by the outbox id in the message metadata:
0 lost, 0 twice), every FINAL verdict in the database, and the replay: each daemon's own figure (its log:
from PostgreSQL answering to connected again) and the time from the server's start to every box caught up
(verdicts in, journals empty, every post recorded sent).
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
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from babysit.db.localserver import LocalPostgres  # noqa: E402
from babysit.db.migrate import upgrade_postgres  # noqa: E402
from babysit.runtime import registry  # noqa: E402
from tests import support  # noqa: E402  (the suites' wait)
from tests.fleet import helpers  # noqa: E402  (the fleet tests' helpers: a box's run.toml, env)

PY = sys.executable
BOXES = ("box-a", "box-b", "box-c")
TRAINER = ROOT / "bench" / "_term_trainer.py"
GATED = helpers.GATED
CHANNEL = "C0RUNS"
SLACK_TOKEN = "xoxb-bench-token"
PREREG = helpers.PREREG


def spec(box: Path, run: str, cmd: list[str] | None = None, **tables: Any) -> Path:
    """A CPU run (the trainer records every 5 s until SIGTERM), no poll due for ten hours."""
    return helpers.run_toml(box, run, cmd or [PY, str(TRAINER), f"outputs/{run}/train_log.jsonl", "5"], gpus=[],
                            min_free_gib=0.01, grace_s=30, poll_min=(600, 600), **tables)


def make_box(root: Path, name: str, url: str, runs: int, head: str = "") -> Path:
    box = root / name
    box.mkdir(parents=True)
    (box / "babysit.toml").write_text(f'{head}[store]\nurl = "{url}"\n[host]\nname = "{name}"\n')
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
    return helpers.box_env(gpu_probe="none")


def wait_for(check, timeout: float, every: float = 0.2):  # type: ignore[no-untyped-def]
    try:
        return support.wait_for("the bench's condition", check, timeout, every)
    except AssertionError as exc:
        raise SystemExit(str(exc)) from None


def stop_daemons(procs: dict[str, subprocess.Popen]) -> None:
    """Every box's daemon asked to stop (SIGTERM), and one that has not within 30 s killed with its group."""
    for proc in procs.values():
        proc.send_signal(signal.SIGTERM)
    for proc in procs.values():
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)


def kill_trainers(url: str) -> None:
    """Every attempt this bench's daemons left running (SIGTERM did not stop the runs: it never does)."""
    helpers.kill_trainers(url, "bench")


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
    p.add_argument("--outage-s", type=float, default=0.0, help="measure a PostgreSQL outage this long instead")
    p.add_argument("--ending", type=int, default=5, help="with --outage-s: runs a box that end during it")
    p.add_argument("--end-after-s", type=float, default=20.0, help="with --outage-s: when in it they end")
    args = p.parse_args()
    if args.outage_s and not 0 <= args.end_after_s < args.outage_s:
        p.error(f"--end-after-s {args.end_after_s:g} must fall inside the outage: 0 <= it < --outage-s "
                f"{args.outage_s:g} (the ending runs end while PostgreSQL is down)")
    if args.outage_s:
        return outage(args)

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
            wait_for(lambda term=term: term.exists() and term.read_text(), 30, 0.002)  # written, not just created
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
        renewed = next(h for h in gateway.hosts() if h.name == "box-c").renewed_at
        out["dead_box_alert_s_after_kill"] = round(sent[0].sent_at - killed, 1)
        out["dead_box_alert_s_after_last_lease"] = round(sent[0].sent_at - renewed, 1)
        out["dead_box_alerts"] = len([m for m in gateway.messages("") if "box box-c lost" in m.payload.get("text", "")])
        gateway.close()
    finally:
        stop_daemons(procs)
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


def outage(args: argparse.Namespace) -> int:
    """Three daemons on the local Slack server through a PostgreSQL outage of --outage-s seconds."""
    from babysit.db.postgres import PostgresStore
    from tests.slack.fake_slack import FakeSlack

    root = Path(tempfile.mkdtemp(prefix="babysit-fleet-outage-"))
    os.chmod(root, 0o755)
    server = LocalPostgres(root / "pg")
    fake = FakeSlack(SLACK_TOKEN).start()
    procs: dict[str, subprocess.Popen[bytes]] = {}
    url = ""
    out: dict[str, object] = {"boxes": len(BOXES), "runs_per_box": args.runs, "ending_per_box": args.ending,
                              "outage_s": args.outage_s}
    daemon_env = {**env(), "SLACK_BOT_TOKEN": SLACK_TOKEN, "BABYSIT_SLACK_API_URL": fake.api_url}
    daemon_env.pop("BABYSIT_SLACK_CHANNEL", None)
    ending = [f"{name[-1]}end{i}" for name in BOXES for i in range(args.ending)]
    try:
        server.start()
        url = server.create_database("fleet")
        upgrade_postgres(url)
        head = f'[daemon]\nchannel = "{CHANNEL}"\n'
        boxes = {name: make_box(root, name, url, args.runs, head) for name in BOXES}
        for run in ending:
            box = boxes[f"box-{run[0]}"]
            path = spec(box, run, [PY, str(GATED), f"outputs/{run}/train_log.jsonl", str(root / "gate")], prereg=PREREG)
            res = subprocess.run([PY, "-m", "babysit", "register", str(path), "--registry", str(box / "babysit.toml")],
                                 cwd=box, env=env(), capture_output=True, text=True, timeout=120)
            if res.returncode != 0:
                raise SystemExit(res.stderr)
        for name, box in boxes.items():
            log = open(box / "daemon-out.txt", "ab")  # noqa: SIM115
            procs[name] = subprocess.Popen([PY, "-m", "babysit", "up", "--registry", str(box / "babysit.toml")],
                                           cwd=box, env=daemon_env, stdout=log, stderr=subprocess.STDOUT,
                                           start_new_session=True)
        watch = PostgresStore(url, host="bench")
        total = len(BOXES) * args.runs + len(ending)

        def settled() -> bool:
            running = len([a for a in watch.live_attempts() if a.status == "running"])
            pending = watch._query("SELECT COUNT(*) FROM outbox WHERE status='pending'")[0][0]
            return running == total and pending == 0

        t0 = time.monotonic()
        wait_for(settled, 900, 1.0)
        out["all_running_after_s"] = round(time.monotonic() - t0, 1)
        watch.close()
        posts_before = len(fake.messages)

        server.stop("fast")
        down_at = time.monotonic()
        time.sleep(args.end_after_s)
        (root / "gate").touch()  # every gated run ends now, PostgreSQL down
        time.sleep(max(0.0, args.outage_s - (time.monotonic() - down_at)))
        out["posts_while_down"] = len(fake.messages) - posts_before
        out["daemons_alive_after_outage"] = sum(p.poll() is None for p in procs.values())
        server.start()
        up_at = time.monotonic()
        watch = PostgresStore(url, host="bench")

        def caught_up() -> bool:
            finals = watch._query("SELECT COUNT(*) FROM verdicts WHERE final = 1")[0][0]
            pending = watch._query("SELECT COUNT(*) FROM outbox WHERE status='pending'")[0][0]
            logged = all("PostgreSQL back: journal replayed" in (b / ".babysit" / "daemon.log").read_text()
                         for b in boxes.values())
            return finals == len(ending) and pending == 0 and logged

        wait_for(caught_up, 300, 0.1)
        out["caught_up_after_start_s"] = round(time.monotonic() - up_at, 2)
        replays = {}
        for name, box in boxes.items():
            lines = [json.loads(x) for x in (box / ".babysit" / "daemon.log").read_text().splitlines()
                     if "PostgreSQL back: journal replayed" in x]
            replays[name] = {"transactions": lines[-1]["transactions"], "replay_s": lines[-1]["replay_s"]}
        out["replay"] = replays
        out["final_verdicts"] = watch._query("SELECT COUNT(*) FROM verdicts WHERE final = 1")[0][0]
        out["ended_attempts"] = watch._query("SELECT COUNT(*) FROM attempts WHERE status = 'ended'")[0][0]
        posted = Counter(m["metadata"]["event_payload"]["id"] for m in fake.messages
                         if (m.get("metadata") or {}).get("event_type") == "babysit_outbox")
        rows = watch._query("SELECT id, status FROM outbox WHERE kind != 'header'")
        sent = {r[0] for r in rows if r[1] == "sent"}
        out["outbox_rows"] = len(rows)
        out["posts_twice"] = sum(1 for n in posted.values() if n > 1)
        out["posts_lost"] = len([r for r in rows if r[1] != "sent"]) + len(sent - set(posted))
        out["posts_unrecorded"] = len(set(posted) - sent)
        watch.close()
    finally:
        stop_daemons(procs)
        if url:
            if not server.running():
                server.start()
            kill_trainers(url)
        server.stop("immediate")
        fake.stop()
        shutil.rmtree(root, ignore_errors=True)
    worst = max(r["replay_s"] for r in replays.values())
    print("| what | figure | target |\n| --- | --- | --- |")
    print(f"| posts, {out['outbox_rows']} outbox rows ({out['posts_while_down']} sent while down) | "
          f"{out['posts_lost']} lost, {out['posts_twice']} twice, {out['posts_unrecorded']} unrecorded | 0 and 0 |")
    print(f"| FINAL verdicts in the database | {out['final_verdicts']} of {len(ending)} | all |")
    journaled = ", ".join(f"{k}: {v['transactions']} tx" for k, v in replays.items())
    print(f"| replay | worst {worst} s a box ({journaled}); every box caught up "
          f"{out['caught_up_after_start_s']} s after the server's start | ≤ 10 s |")
    if args.json:
        args.json.write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
