"""The crash campaign's harness: a workspace of real runs, real daemons killed with SIGKILL, and the
invariants checked after each trial (docs/reliability.md lists them).

A trial: start `babysit up --accelerated` (optionally with BABYSIT_CRASH_AT naming a crash point),
SIGKILL it at a random instant (or let the crash point kill it), repeat, then let a last daemon run
with --exit-when-idle and check everything the store, the attempt directories, the train logs and
channel.jsonl say against each other.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from babysit.db.store import Store
from babysit.runtime import registry
from tests.support import TRAIN_LOG, register, run_toml

PY = sys.executable
RUNS = ("r_retry", "r_prereg")
GPUS = {"r_retry": 0, "r_prereg": 1}


def _spec(name: str, gpu: int, steps: int, **tables: Any) -> str:
    cmd = [PY, "-m", "trainer", "--recipe", "tiny", "--log", f"outputs/{name}/train_log.jsonl",
           "--checkpoints", f"outputs/{name}/checkpoints", "--steps", str(steps)]
    return run_toml(name, cmd, log=TRAIN_LOG, gpus=[gpu], poll=(1, 2), **tables,
                    guards={"min_free_host_ram_gib": 0.1, "stop_grace_seconds": 20, "stall_minutes": 120})


RETRY = {"retry": {"max_attempts": 3, "on": ["diverged"]},
         "attempts": {"hot": ["--inject-nan-at-step", "60"], "cool": ["--lr-scale", "0.5"]}}

PREREG = {"question": "Does the tiny recipe's eval error move between steps 50 and 100?", "metric": "eval_chunk_mae",
          "baseline_step": 50, "read_step": 100, "precision": 4, "train_metric": "train_chunk_mae",
          "references": {"ref": 0.01}, "bands": [{"label": "HEALTHY", "max": 0.0},
                                                 {"label": "SAME-DRIFT", "min": "0.5 * ref"}],
          "otherwise": {"label": "AMBIGUOUS"}}


def gpu_file(path: Path) -> None:
    path.write_text(json.dumps({"gpus": [
        {"index": i, "name": f"Simulated H200 #{i}", "uuid": f"GPU-sim-{i}", "util_pct": 90,
         "memory_used_bytes": 2**30, "memory_total_bytes": 141 * 2**30, "processes": [], "faults": []}
        for i in (0, 1)]}))


def make_workspace(root: Path, runs: tuple[str, ...] = RUNS) -> None:
    """Two runs on simulated GPUs 0 and 1: one diverges then is retried, one reads a FINAL verdict."""
    root.mkdir(parents=True, exist_ok=True)
    gpu_file(root / "gpus.json")
    specs = {"r_retry": _spec("r_retry", 0, 200, **RETRY), "r_prereg": _spec("r_prereg", 1, 150, prereg=PREREG)}
    for name in runs:
        register(root, specs[name])


def daemon_env(root: Path, crash_at: str | None = None) -> dict[str, str]:
    env = {**os.environ, "BABYSIT_GPU_PROBE": f"file:{root / 'gpus.json'}"}
    env.pop("SLACK_BOT_TOKEN", None)
    env.pop("BABYSIT_CRASH_AT", None)
    if crash_at:
        env["BABYSIT_CRASH_AT"] = crash_at
    return env


class Daemons:
    """Every daemon a test starts, so teardown can kill what is left (and every attempt's group)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.procs: list[subprocess.Popen] = []

    def start(self, *args: str, crash_at: str | None = None) -> subprocess.Popen:
        out = open(self.root / "daemon-out.txt", "ab")  # noqa: SIM115 - closed with the process
        proc = subprocess.Popen([PY, "-m", "babysit", "up", "--accelerated", "--registry",
                                 str(self.root / "babysit.toml"), *args], cwd=self.root,
                                env=daemon_env(self.root, crash_at), stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
        out.close()
        self.procs.append(proc)
        return proc

    def cleanup(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                with _quiet():
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)
        kill_attempts(self.root)


class _quiet:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> bool:
        return exc[0] is not None and issubclass(exc[0], (ProcessLookupError, PermissionError))  # type: ignore[arg-type]


def kill_attempts(root: Path) -> None:
    db = root / ".babysit" / "state.db"
    if not db.exists():
        return
    store = Store(db)
    try:
        for attempt in store.all_attempts():
            if attempt.pid:
                with _quiet():
                    os.killpg(attempt.pid, signal.SIGKILL)
    finally:
        store.close()
    for pid in group_members(root):
        with _quiet():
            os.kill(pid, signal.SIGKILL)


def group_members(root: Path) -> list[int]:
    """Live (non-zombie) processes whose command line names this workspace's attempt directories."""
    marker = str(root / ".babysit" / "runs")
    out = []
    for proc in psutil.process_iter(["pid", "cmdline", "status"]):
        try:
            if proc.info["status"] == psutil.STATUS_ZOMBIE:
                continue
            if any(marker in part for part in proc.info["cmdline"] or ()):
                out.append(proc.info["pid"])
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return out


@dataclass
class Trial:
    seed: int
    kills: list[float] = field(default_factory=list)  # seconds after start of each SIGKILL
    crash_at: str | None = None
    violations: list[str] = field(default_factory=list)
    seconds: float = 0.0


def run_trial(root: Path, daemons: Daemons, rng: random.Random, *, crash_at: str | tuple[str, ...] | None = None,
              kills: int = 1, window: tuple[float, float] = (0.3, 9.0), final_timeout: float = 240) -> Trial:
    """Crash the daemon at each crash point in turn (one daemon per point), then `kills` times at random
    instants, then run a last daemon to idle."""
    points = (crash_at,) if isinstance(crash_at, str) else tuple(crash_at or ())
    trial = Trial(seed=rng.randrange(2**31), crash_at=",".join(points) or None)
    t0 = time.monotonic()
    for crash_at in points:
        proc = daemons.start(crash_at=crash_at)
        try:
            proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            trial.violations.append(f"crash point {crash_at} was never hit")
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
        else:
            if proc.returncode != -signal.SIGKILL:
                trial.violations.append(f"crash point {crash_at}: daemon exited {proc.returncode}, not SIGKILL")
        trial.kills.append(round(time.monotonic() - t0, 2))
    for _ in range(kills):
        proc = daemons.start()
        delay = rng.uniform(*window)
        try:
            proc.wait(timeout=delay)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGKILL)  # the daemon only: its runs live in their own sessions
            proc.wait(10)
        trial.kills.append(round(delay, 2))
    final = daemons.start("--exit-when-idle")
    try:
        rc = final.wait(timeout=final_timeout)
        if rc != 0:
            trial.violations.append(f"final daemon exited {rc}")
    except subprocess.TimeoutExpired:
        trial.violations.append(f"final daemon not idle after {final_timeout}s")
        dump = subprocess.run(["py-spy", "dump", "--pid", str(final.pid)], capture_output=True, text=True, timeout=60)
        (root / "final-daemon-stacks.txt").write_text(dump.stdout + dump.stderr)  # where it hung, for the report
        trial.violations.append(f"its threads: {root / 'final-daemon-stacks.txt'}")
        final.send_signal(signal.SIGKILL)
        final.wait(10)
    trial.seconds = round(time.monotonic() - t0, 1)
    return trial


def _read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def check_invariants(root: Path, baseline_verdict: dict | None, runs: tuple[str, ...] = RUNS) -> list[str]:
    """Everything that must hold after any crash history; returns the violations (empty: all hold)."""
    bad: list[str] = []
    state = root / ".babysit"
    # the registry parses, and names both runs
    try:
        reg = registry.load(root / "babysit.toml")
        if set(reg.names) != set(runs):
            bad.append(f"registry names {reg.names}")
    except Exception as exc:  # any failure to parse is the violation
        bad.append(f"registry unparseable: {exc!r}")
    store = Store.in_dir(state)
    try:
        # no orphan: nothing of any attempt is alive once the last daemon is gone
        alive = group_members(root)
        for a in store.all_attempts():
            if a.pid:
                try:
                    members = [p for p in psutil.process_iter(["pid", "status"])
                               if p.info["status"] != psutil.STATUS_ZOMBIE and os.getpgid(p.info["pid"]) == a.pid]
                except (ProcessLookupError, psutil.NoSuchProcess):
                    members = []
                if members:
                    alive.extend(p.info["pid"] for p in members)
        if alive:
            bad.append(f"orphaned processes alive: {sorted(set(alive))}")
        now = time.time()
        for run in runs:
            attempts = store.attempts(run)
            ns = [a.n for a in attempts]
            if ns != list(range(1, len(ns) + 1)):
                bad.append(f"{run}: attempt numbers {ns}")
            status = store.run_state(run)[0]
            if status != "finished":
                bad.append(f"{run}: ended {status}, not finished")
            if any(a.status != "ended" for a in attempts):
                bad.append(f"{run}: attempts not ended: {[(a.n, a.status) for a in attempts]}")
            # each attempt's trainer started exactly once: the trainer logs one "start" per process
            log = root / "outputs" / run / "train_log.jsonl"
            starts = log.read_text().count('"event": "start"') if log.exists() else 0
            started = [a for a in attempts if a.started_at is not None]
            if starts != len(started):
                bad.append(f"{run}: {starts} trainer starts for {len(started)} started attempts")
            expected = 2 if run == "r_retry" else 1
            if len(attempts) != expected:
                bad.append(f"{run}: {len(attempts)} attempts, expected {expected}")
            # GPU-seconds exact to the second: the store's vs the shim's own start and exit records
            truth = 0.0
            for a in attempts:
                shim = _read_json(Path(a.attempt_dir) / "shim.json")
                ended = _read_json(Path(a.attempt_dir) / "exit.json")
                if shim is None or ended is None:
                    bad.append(f"{run}: attempt {a.n} has no shim.json/exit.json")
                    continue
                truth += (float(ended["ended_at"]) - float(shim["started_at"])) * a.gpus
            got = store.gpu_seconds(run, now)
            if abs(got - truth) >= 1.0 or got <= 0:
                bad.append(f"{run}: gpu_seconds {got:.3f} vs {truth:.3f} from the attempts' records")
        # every message delivered exactly once, in per-run order
        if store.pending_count():
            bad.append(f"{store.pending_count()} messages still pending")
        lines = (state / "channel.jsonl").read_text().splitlines() if (state / "channel.jsonl").exists() else []
        records = []
        for i, line in enumerate(lines):
            try:
                records.append(json.loads(line))
            except ValueError:
                bad.append(f"channel.jsonl line {i + 1} is not JSON: {line[:80]!r}")
        ids = [r["id"] for r in records]
        dupes = sorted({i for i in ids if ids.count(i) > 1})
        if dupes:
            bad.append(f"messages delivered more than once: {dupes}")
        sent = {m.id for m in store.messages() if m.status == "sent"}
        if set(ids) != sent:
            bad.append(f"channel ids vs outbox sent differ: missing {sorted(sent - set(ids))}, "
                       f"extra {sorted(set(ids) - sent)}")
        for run in runs:
            own = [r["id"] for r in records if r["run"] == run]
            if own != sorted(own):
                bad.append(f"{run}: messages out of order: {own}")
            kinds = [r["kind"] for r in records if r["run"] == run]
            if kinds.count("launch") != len(store.attempts(run)):
                bad.append(f"{run}: {kinds.count('launch')} launch posts for {len(store.attempts(run))} attempts")
        # the verdict: identical to an uninterrupted run's
        verdict = _read_json(state / "verdicts" / "r_prereg.json")
        if verdict is None or verdict.get("status") != "FINAL":
            bad.append(f"no FINAL verdict: {verdict}")
        elif baseline_verdict is not None and verdict != baseline_verdict:
            bad.append(f"verdict differs from the uninterrupted run's: {verdict} vs {baseline_verdict}")
        final = store.final_verdict("r_prereg")
        if final is None or (verdict is not None and final.body != verdict):
            bad.append("the store's FINAL verdict differs from verdicts/r_prereg.json")
        if [m.kind for m in store.messages("r_prereg")].count("verdict") != 1:
            bad.append("the FINAL verdict was not queued exactly once")
    finally:
        store.close()
    return bad
