"""`babysit demo --fleet` (and `python examples/fleet_demo.py`): two boxes on one PostgreSQL, on this
machine, in about a minute (docs/fleet.md).

A throwaway PostgreSQL is started from the machine's own server binaries (`apt-get install postgresql`)
on a Unix socket in a temporary directory; two projects, `box-a` and `box-b`, each with one small run and
its own `babysit up` (host names box-a and box-b, the same `[store] url`, one console channel each: the
same Slack channel when SLACK_BOT_TOKEN is set). Then, as a user would: `babysit status` on box-a lists
both boxes' runs; `babysit abort` asked on box-b stops box-a's run (box-a carries it out, woken by
NOTIFY); box-b's daemon is killed and box-a posts that box-b is lost, once; its run shows `host-lost`, and
an abort of it asked on box-a is told at once that it waits for box-b. Everything is removed at the
end (the server stopped, the runs killed). Without the server binaries it stops at once, saying what to
install (`require_server`).
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from babysit.core.errors import BadInput
from babysit.db.localserver import LocalPostgres, PostgresUnavailable, find_bin_dir

ROOT = Path(__file__).resolve().parents[2]  # the directory babysit is imported from: the boxes' daemons too

PY = sys.executable
TRAINER = ("import json, sys, time\n"
           "f = open(sys.argv[1], 'a')\n"
           "for step in range(1, 100000):\n"
           "    f.write(json.dumps({'step': step, 'ts': time.time(), 'train_loss': 1 / step}) + '\\n'); f.flush()\n"
           "    time.sleep(0.5)\n")
SPEC = """[run]
name = "{run}"
command = {command}
log = "outputs/{{name}}/train_log.jsonl"
gpus = []

[guards]
min_free_host_ram_gib = 0.01
stall_minutes = 120

[poll]
first_after_minutes = 30
every_minutes = 60
"""


def env() -> dict[str, str]:
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    out = {**os.environ, "PYTHONPATH": path, "BABYSIT_GPU_PROBE": "none"}
    for key in ("SLACK_BOT_TOKEN", "BABYSIT_STORE_URL", "BABYSIT_HOST"):
        out.pop(key, None)
    return out


def babysit(box: Path, *args: str) -> str:
    out = subprocess.run([PY, "-m", "babysit", *args], cwd=box, env=env(), capture_output=True, text=True,
                         timeout=120)
    if out.returncode != 0:
        raise SystemExit(f"babysit {' '.join(args)} failed:\n{out.stderr}")
    return out.stdout


def channel_posts(root: Path) -> list[tuple[str, str]]:
    """(box, text) of every message both boxes posted, in outbox order (one id sequence in PostgreSQL)."""
    posts = []
    for box in sorted(root.glob("box-*")):
        path = box / ".babysit" / "channel.jsonl"
        for line in path.read_text().splitlines() if path.exists() else ():
            with contextlib.suppress(ValueError, KeyError):
                record = json.loads(line)
                posts.append((int(record["id"]), box.name, str(record.get("text") or "")))
    return [(box, text) for _, box, text in sorted(posts)]


def say(text: str) -> None:
    print(f"\n== {text}", flush=True)


def require_server() -> Path:
    """The PostgreSQL server binaries' directory, or a BadInput (exit 2) that says what to install."""
    try:
        return find_bin_dir()
    except PostgresUnavailable as exc:
        raise BadInput(f"babysit demo --fleet needs PostgreSQL's server programs on this machine ({exc}); "
                       "none were found in /usr/lib/postgresql/*/bin or on PATH",
                       hint="install them — Debian/Ubuntu: `apt-get install postgresql` (no service needs to run: "
                            "the demo starts its own server on a Unix socket and removes it); Fedora: `dnf install "
                            "postgresql-server`; macOS: `brew install postgresql` — then run `babysit demo "
                            "--fleet` again") from None


def require_driver() -> None:
    """The fleet's Python libraries (the `postgres` extra), or a BadInput (exit 2) that says what to install:
    README command 1 installs `.[trainer]` only, and a single box needs none of them."""
    missing = [name for name in ("psycopg", "psycopg_pool", "sqlalchemy", "alembic")
               if importlib.util.find_spec(name) is None]
    if missing:
        raise BadInput(f"babysit demo --fleet needs the PostgreSQL libraries, missing here: {', '.join(missing)}",
                       hint='install them with `pip install -e ".[postgres]"` (from the checkout; '
                            '`pip install "babysit[postgres]"` from an index), then run `babysit demo --fleet` again')


def main() -> int:
    try:
        require_driver()
        require_server()
        root = Path(tempfile.mkdtemp(prefix="babysit-fleet-demo-"))
        os.chmod(root, 0o755)  # the postgres user runs the server under it when this runs as root
        server = LocalPostgres(root / "pg")
    except PostgresUnavailable as exc:  # root without a `postgres` user to run initdb as
        raise BadInput(f"babysit demo --fleet cannot start a PostgreSQL here: {exc}",
                       hint="create the user (`useradd --system postgres`), or run the demo as another user")
    return _demo(root, server)


def _demo(root: Path, server: LocalPostgres) -> int:
    daemons: dict[str, subprocess.Popen[bytes]] = {}
    try:
        say("a PostgreSQL for the fleet, and its schema (`babysit db upgrade` would do the same)")
        server.start()
        url = server.create_database("babysit")
        from babysit.db.migrate import upgrade_postgres  # SQLAlchemy + Alembic: only the fleet demo's

        upgrade_postgres(url)
        print(f"   {url}")
        for name in ("box-a", "box-b"):
            box = root / name
            box.mkdir()
            (box / "babysit.toml").write_text(f'[store]\nurl = "{url}"\n\n[host]\nname = "{name}"\n'
                                              "lease_seconds = 6\n")
            (box / "trainer.py").write_text(TRAINER)
            run = f"train-{name[-1]}"
            command = json.dumps([PY, "trainer.py", f"outputs/{run}/train_log.jsonl"])
            (box / f"{run}.toml").write_text(SPEC.format(run=run, command=command))
            babysit(box, "register", f"{run}.toml")
            log = open(box / "daemon.txt", "ab")  # noqa: SIM115 - closed with the process
            daemons[name] = subprocess.Popen([PY, "-m", "babysit", "up"], cwd=box, env=env(), stdout=log,
                                             stderr=subprocess.STDOUT, start_new_session=True)
            log.close()
            say(f"{name}: `babysit register {run}.toml` and `babysit up` (host {name})")
        time.sleep(8)

        say("`babysit status` on box-a: both boxes' runs, and each box's lease")
        print(babysit(root / "box-a", "status"))

        say("`babysit abort train-a` asked on box-b: box-a's daemon stops it (woken by NOTIFY)")
        started = time.monotonic()
        answer = babysit(root / "box-b", "abort", "train-a").strip()
        print(answer, f"({time.monotonic() - started:.1f} s, the CLI's start included)")

        say("box-b's daemon is killed (SIGKILL): box-a notices its lease lapse and posts it, once")
        os.killpg(daemons.pop("box-b").pid, signal.SIGKILL)
        channel = root / "box-a" / ".babysit" / "channel.jsonl"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            lines = channel.read_text().splitlines() if channel.exists() else []
            lost = [json.loads(line)["text"] for line in lines if "lost" in json.loads(line)["text"]]
            if lost:
                print("   box-a's channel:", lost[0])
                break
            time.sleep(0.5)
        say("`babysit status` on box-a: box-b LOST, its run host-lost (it may well still train)")
        print(babysit(root / "box-a", "status"))

        say("`babysit abort train-b` asked on box-a: queued for box-b, and said so at once")
        print(babysit(root / "box-a", "abort", "train-b").strip())

        say("the channel: both boxes' posts, in the order the fleet's outbox wrote them (with SLACK_BOT_TOKEN "
            "and one [daemon].channel they land in one Slack channel)")
        for box, text in channel_posts(root):
            print(f"   [{box}] {text.splitlines()[0] if text else ''}")
        return 0
    finally:
        for proc in daemons.values():
            proc.send_signal(signal.SIGTERM)
            proc.wait(30)
        for box in root.glob("box-*"):
            for shim in (box / ".babysit" / "runs").glob("*/attempt-*/shim.json"):
                try:
                    pid = json.loads(shim.read_text()).get("pid")
                    if pid:
                        os.killpg(pid, signal.SIGKILL)
                except (OSError, ValueError, ProcessLookupError):
                    pass
        server.stop("immediate")
        shutil.rmtree(root, ignore_errors=True)
