"""Helpers for the Slurm tests: is a cluster here, and a temp registry whose runs use `executor = "slurm"`.

The end-to-end tests run the real daemon (`babysit up --accelerated`) as a subprocess against a real
Slurm of 3 nodes on this one host (`.ci/slurm-up.sh`), and read what happened from its state database.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support import wait_for

REPO = Path(__file__).resolve().parents[2]
JOBSCRIPT = Path(__file__).resolve().parent / "jobscript.py"


class NoSlurm(Exception):
    """No Slurm to ask here: the message says how to start one."""


def node_states() -> tuple[list[str], str]:
    """The Slurm nodes' states (`sinfo -h -o %T`, without the `*` of a node not responding) and sinfo's
    stderr; NoSlurm where its tools are missing or it does not answer."""
    for tool in ("sinfo", "sbatch", "scontrol", "scancel", "squeue"):
        if shutil.which(tool) is None:
            raise NoSlurm(f"{tool} not on PATH: start a Slurm with `sudo .ci/slurm-up.sh`")
    try:
        out = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True, timeout=15)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise NoSlurm(f"sinfo did not answer ({exc}): is slurmctld running? (`.ci/slurm-up.sh`)") from exc
    return [s.rstrip("*") for s in out.stdout.split()], out.stderr.strip()


def slurm_unavailable() -> str | None:
    """Why the Slurm tests cannot run here, or None when a node is idle and takes jobs."""
    try:
        states, stderr = node_states()
    except NoSlurm as exc:
        return str(exc)
    if any(s in ("idle", "mixed") for s in states):
        return None
    return f"no idle Slurm node (sinfo: {states or stderr or 'nothing'}): run `.ci/slurm-up.sh`"


def _busy() -> bool:
    try:
        return any(s in BUSY for s in node_states()[0])
    except NoSlurm:
        return False


BUSY = ("allocated", "completing")  # a node still given to an earlier job (another session's, a killed test's)
BUSY_WAIT_S = 120.0


@pytest.fixture(scope="session")
def cluster() -> None:
    """Skips where no Slurm is up; a node that is up but still busy with an earlier job is waited for
    (BUSY_WAIT_S), not skipped at once: the suite's jobs would queue behind that job anyway."""
    deadline = time.monotonic() + BUSY_WAIT_S
    while (reason := slurm_unavailable()) and _busy() and time.monotonic() < deadline:
        time.sleep(2.0)
    if reason:
        pytest.skip(reason)


def toml_value(value: Any) -> str:
    """JSON strings, numbers, booleans and lists are TOML too; tables are written by `Bench.run_toml`."""
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{k} = {toml_value(v)}" for k, v in value.items()) + " }"
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    return json.dumps(value)


class Bench:
    """A temp directory holding a registry, run specs and the daemon's state."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.registry = root / "babysit.toml"
        self.state_dir = root / ".babysit"
        self.runs: list[str] = []
        (root / "gpus.json").write_text(json.dumps({"gpus": [{"index": 0, "name": "Simulated H200",
                                                              "util_pct": 95, "processes": []}]}))
        self.env = dict(os.environ)
        self.env.update({
            "BABYSIT_SLURM_POLL_SECONDS": "0.5",  # ask slurmctld often: the jobs here last seconds
            "BABYSIT_PROBE_INTERVAL": "1",
            "BABYSIT_GPU_PROBE": f"file:{root / 'gpus.json'}",  # the daemon's and the sidecar's GPUs
            "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""),
        })
        for secret in ("SLACK_BOT_TOKEN", "SLACK_APP_TOKEN", "SLACK_SIGNING_SECRET"):
            self.env.pop(secret, None)

    def run_toml(self, name: str, command: list[str], *, gpus: list[int] | None = None,
                 env: dict[str, str] | None = None, **tables: dict[str, Any] | list[dict[str, Any]]) -> Path:
        lines = ["[run]", f"name = {toml_value(name)}", f"command = {toml_value(command)}",
                 f'log = "outputs/{name}/train_log.jsonl"', f"gpus = {toml_value(gpus or [])}",
                 'executor = "slurm"']
        if env:
            lines.append(f"env = {toml_value(env)}")
        tables.setdefault("poll", {"first_after_minutes": 1, "every_minutes": 2})
        tables.setdefault("retry", {"max_attempts": 1})
        tables.setdefault("slurm", {"time_limit": "00:05:00"})
        for table, values in tables.items():
            for one in values if isinstance(values, list) else [values]:  # a list: an array of tables
                lines.append(f"[[{table}]]" if isinstance(values, list) else f"[{table}]")
                lines += [f"{k} = {toml_value(v)}" for k, v in one.items()]
        self.runs.append(name)
        path = self.root / f"{name}.toml"
        path.write_text("\n".join(lines) + "\n")
        self.babysit("register", "--accelerated", str(path))
        return path

    def babysit(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
        res = subprocess.run([sys.executable, "-m", "babysit", *args, "--registry", str(self.registry)],
                             cwd=self.root, env=self.env, capture_output=True, text=True, timeout=timeout)
        assert res.returncode == 0, f"babysit {' '.join(args)} failed:\n{res.stdout}\n{res.stderr}"
        return res

    def up(self, timeout: float = 90) -> subprocess.CompletedProcess:
        """`babysit up --accelerated --exit-when-idle` to the end."""
        return self.babysit("up", "--accelerated", "--exit-when-idle", timeout=timeout)

    def start_up(self) -> subprocess.Popen:
        """The daemon in the background (its output goes to a file, so a full pipe never blocks it)."""
        log = open(self.root / f"daemon-{time.monotonic_ns()}.log", "w")  # noqa: SIM115 - the child owns it
        return subprocess.Popen([sys.executable, "-m", "babysit", "up", "--accelerated", "--exit-when-idle",
                                 "--registry", str(self.registry)], cwd=self.root, env=self.env,
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def store(self) -> Any:
        from babysit.db.store import Store

        return Store.in_dir(self.state_dir)

    def until(self, what: str, check: Callable[[], Any], timeout: float = 60) -> Any:
        """tests.support.wait_for, asked every 0.25 s: some checks run scontrol or read the store."""
        return wait_for(what, check, timeout, every=0.25)

    def daemon_logs(self) -> str:
        return "\n".join(p.read_text(errors="replace") for p in sorted(self.root.glob("daemon-*.log")))


@pytest.fixture
def bench(cluster: None, tmp_path: Path) -> Iterator[Bench]:
    b = Bench(tmp_path)
    yield b
    # Leave no job behind whatever the test did.
    for name in b.runs:
        for job_id in jobs_named(f"babysit-{name}-"):
            subprocess.run(["scancel", job_id], capture_output=True, timeout=15)


def jobscript(*args: str) -> list[str]:
    return [sys.executable, str(JOBSCRIPT), *args]


def slurm_job(job_id: str) -> dict[str, str]:
    """What Slurm says of a job: `scontrol show job`, else the jobcomp file's line."""
    from babysit.executors.slurm_state import parse_kv

    out = subprocess.run(["scontrol", "show", "job", "-o", job_id], capture_output=True, text=True, timeout=15)
    if out.returncode == 0 and out.stdout.strip():
        return parse_kv(out.stdout.splitlines()[0])
    comp = Path("/var/log/slurm/jobcomp.txt")
    if comp.exists():
        for line in reversed(comp.read_text(errors="replace").splitlines()):
            if line.startswith(f"JobId={job_id} "):
                return parse_kv(line)
    return {}


def jobs_named(prefix: str) -> set[str]:
    """Ids of every job whose name starts with `prefix`, queued, running or ended (squeue + jobcomp)."""
    ids = set()
    out = subprocess.run(["squeue", "-h", "-t", "all", "-o", "%i %j"], capture_output=True, text=True, timeout=15)
    for line in out.stdout.splitlines():
        job_id, _, name = line.partition(" ")
        if name.startswith(prefix):
            ids.add(job_id)
    comp = Path("/var/log/slurm/jobcomp.txt")
    if comp.exists():
        from babysit.executors.slurm_state import parse_kv

        for line in comp.read_text(errors="replace").splitlines():
            kv = parse_kv(line)
            if kv.get("Name", "").startswith(prefix):
                ids.add(kv["JobId"])
    return ids
