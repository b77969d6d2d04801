"""The Slurm executor: an attempt is one batch job, submitted with `sbatch`, watched with `scontrol`
(`sacct`, the jobcomp file, the batch script's `exit.json` once slurmctld forgets it), stopped with
`scancel`. The daemon may run on a login node that cannot see the job's processes or GPUs: those are
seen through the probe sidecar the batch script starts beside the trainer (`babysit/probes/remote.py`).

Every Slurm command goes through `_slurm()` (argv list, never a shell, a timeout, a typed error). The
pure parts live in `slurm_script` (the batch script) and `slurm_state` (parsing and the state → exit
mapping), the nodes kept off runs in `slurm_nodes`.

Crash safety. `launch` writes `submit.json` (the submit token) before `sbatch`, and `job.json` (the
job id) atomically the instant `sbatch` returns — before the daemon's store hears of it. `find`
re-adopts from `job.json`, or, when the daemon died inside `sbatch`, by searching the queue, `sacct`
and the jobcomp file for the job name that carries the token. So a restart never submits twice.

GPU-seconds. `Launched.started_at` is the submit time; `start_time(attempt)` is the job's real
StartTime once it left PENDING (None before), and the supervisor keeps the store's `started_at` on it,
so a queued job costs nothing. `ExitInfo.ended_at` is the job's real EndTime. A job Slurm requeues
stays the same attempt; its earlier runs are kept in `requeues.json` and counted too.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal as signals
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import structlog

from babysit.core import retry
from babysit.core.errors import BabysitError
from babysit.core.nodes import NodeRow, hostnames, node_rows, stacks_by_rank, straggler
from babysit.core.spec.run_toml import RunSpec, load_spec
from babysit.core.spec.slurm import SlurmSpec
from babysit.db.store import Attempt
from babysit.executors import ExitInfo, Launched, slurm_nodes
from babysit.executors import slurm_script as script
from babysit.executors import slurm_state as st
from babysit.executors.local import tail_lines
from babysit.probes.gpu import GpuProbe
from babysit.probes.remote import SidecarGpuProbe, recent_records
from babysit.runtime.atomic import write_atomic

log = structlog.get_logger("babysit.slurm")

COMMAND_TIMEOUT_S = 30.0
POLL_ENV = "BABYSIT_SLURM_POLL_SECONDS"  # how often the state is asked (default 5 s; tests use 1)
PROBE_INTERVAL_ENV = "BABYSIT_PROBE_INTERVAL"  # the sidecar's sampling interval (default 10 s)
STACKS_TIMEOUT_S = 40.0  # srun + py-spy on every node, side by side
BEATS_READ = 20  # a rank's newest beats a node's pace is measured over
NODE_STACKS_DIR = "stacks"  # in the attempt directory: each node's stack line and flight records (node_stacks)
REQUEUES_FILE = "requeues.json"  # the job's runs before Slurm requeued it (same job id, Restarts up)


class SlurmError(BabysitError):
    """A Slurm command failed, timed out or is missing; `.transient` says whether asking again may help."""

    def __init__(self, message: str, hint: str | None = None, *, transient: bool = False,
                 stderr: str = "") -> None:
        super().__init__(message, hint)
        self.transient = transient
        self.stderr = stderr


@dataclass(frozen=True)
class Result:
    rc: int
    stdout: str
    stderr: str


def _slurm(argv: list[str], *, timeout: float = COMMAND_TIMEOUT_S, check: bool = True, cwd: str | None = None,
           env: dict[str, str] | None = None) -> Result:
    """Run one Slurm command. The only subprocess call of this executor.

    A missing binary, a timeout (slurmctld busy) and, when `check`, a non-zero exit raise SlurmError;
    the caller decides what a failure means from its stderr.
    """
    exe = shutil.which(argv[0], path=(env or os.environ).get("PATH"))
    if exe is None:
        raise SlurmError(f"{argv[0]}: not found on PATH",
                         hint="run babysit where the Slurm client commands work (a login node), or fix PATH")
    try:
        proc = subprocess.run([exe, *argv[1:]], capture_output=True, text=True, timeout=timeout, cwd=cwd, env=env,
                              stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as exc:
        raise SlurmError(f"{' '.join(argv)}: no answer in {timeout:g} s", transient=True,
                         hint="slurmctld may be busy; babysit asks again") from exc
    except OSError as exc:
        raise SlurmError(f"{' '.join(argv)}: {exc}") from exc
    result = Result(proc.returncode, proc.stdout, proc.stderr)
    if check and proc.returncode != 0:
        raise SlurmError(f"{' '.join(argv)} failed (exit {proc.returncode}): {proc.stderr.strip()[-500:]}",
                         stderr=proc.stderr)
    return result


class SlurmExecutor:
    name = "slurm"
    allocates_gpus = True  # Slurm picks the GPUs: the login node's view of GPUs is no launch check
    runs_here = False  # the job's processes live on compute nodes: the probe sidecar reads them

    def __init__(self, state_dir: object = None, *, poll_seconds: float | None = None) -> None:
        self.state_dir = Path(str(state_dir)) if state_dir is not None else None
        self.poll_seconds = poll_seconds or float(os.environ.get(POLL_ENV) or 5.0)
        self.exit_poll_seconds = self.poll_seconds  # no descriptor turns readable at a job's end: ask
        self._lock = threading.Lock()
        self._cache: dict[str, st.JobState] = {}
        self._jobcomp: tuple[str, str | None] | None = None  # (JobCompType, JobCompLoc), read once

    # -- launch -----------------------------------------------------------------------------------------
    def launch(self, attempt: Attempt, argv: list[str], env: dict[str, str], workdir: str) -> Launched:

        adir = Path(attempt.attempt_dir)
        adir.mkdir(parents=True, exist_ok=True, mode=0o700)
        for stale in ("job.json", "exit.json", "state.json", "stdout.log", "stderr.log", script.TIME_LIMIT_FILE,
                      REQUEUES_FILE):
            with contextlib.suppress(FileNotFoundError):
                (adir / stale).unlink()
        for old in (*adir.glob("probe-*.jsonl"), *adir.glob("rank-*.jsonl")):
            old.unlink()
        spec = load_spec(_spec_path(env))
        token = secrets.token_hex(4)
        run_env = {k: v for k, v in env.items() if os.environ.get(k) != v and not k.startswith("SLURM_")}
        request = script.BatchRequest(
            run=attempt.run, attempt=attempt.n, token=token, attempt_dir=str(adir), workdir=workdir,
            argv=tuple(argv), env=tuple(sorted(run_env.items())), slurm=spec.slurm or SlurmSpec(),
            exclude=slurm_nodes.excluded(self.state_dir, adir), stop_signal=spec.stop_signal,
            restart_argv=retry.rerun_argv(spec, argv, attempt.n),
            n_gpus=len(spec.gpus), probe_argv=(sys.executable, "-m", "babysit", "probe"),
            probe_interval=float(os.environ.get(PROBE_INTERVAL_ENV) or 10.0))
        try:
            text = script.render(request)
        except ValueError as exc:
            raise SlurmError(f"{attempt.run}: cannot write the batch script: {exc}",
                             hint="fix run.toml ([run].env or [slurm])") from exc
        path = adir / "job.sbatch"
        write_atomic(path, text)
        name = script.job_name(attempt.run, attempt.n, token)
        scope = script.stop_scope(request.slurm, request.n_gpus)  # how this script expects to be stopped
        _write_json(adir / "submit.json", {"token": token, "job_name": name, "at": time.time(), "stop_scope": scope})
        sub_env = {k: v for k, v in env.items() if not k.startswith("SLURM_")}  # a different job's, if any
        submitted = time.time()
        try:
            out = _slurm(["sbatch", "--parsable", str(path)], cwd=str(adir), env=sub_env, timeout=60)
            job_id = out.stdout.strip().splitlines()[-1].split(";")[0].strip()
        except SlurmError as exc:
            if not exc.transient:
                raise SlurmError(f"{attempt.run}: sbatch refused the job: {exc.message}",
                                 hint=f"check [slurm] in the run's spec; the script is {path}") from exc
            found = self._search(name, adir)  # sbatch timed out: it may have submitted all the same
            if found is None:
                raise
            job_id = found
        if not job_id.isdigit() and "_" not in job_id:
            raise SlurmError(f"sbatch --parsable printed {out.stdout!r}, not a job id")
        _write_json(adir / "job.json", {"job_id": job_id, "submitted_at": submitted, "token": token,
                                        "job_name": name, "stop_scope": scope})
        log.info("submitted", run=attempt.run, attempt=attempt.n, job=job_id)
        return Launched(started_at=submitted, job_id=job_id)

    def quarantine_nodes(self, attempt: Attempt, nodes: Sequence[str], reason: str) -> tuple[str, ...]:
        """A machine fault on these nodes' GPUs (an Xid the guards or the exit saw there): quarantined like a
        lost node, so every later submission leaves them out (`slurm_nodes.excluded`)."""
        if self.state_dir is None or not nodes:
            return ()
        return tuple(slurm_nodes.quarantine(self.state_dir, nodes, reason, time.time(), run=attempt.run,
                                            job_id=attempt.job_id))

    def find(self, attempt: Attempt) -> Launched | None:
        adir = Path(attempt.attempt_dir)
        job = _read_json(adir / "job.json")
        if job is not None and job.get("job_id"):
            return Launched(started_at=float(job.get("submitted_at") or time.time()), job_id=str(job["job_id"]))
        sub = _read_json(adir / "submit.json")
        if sub is None:
            return None  # the daemon died before it tried sbatch
        job_id = self._search(str(sub["job_name"]), adir)
        if job_id is None:
            return None
        submitted = float(sub.get("at") or time.time())
        _write_json(adir / "job.json", {"job_id": job_id, "submitted_at": submitted, "token": sub.get("token"),
                                        "job_name": sub["job_name"], "found_by": "token",
                                        "stop_scope": sub.get("stop_scope")})
        return Launched(started_at=submitted, job_id=job_id)

    def _search(self, name: str, adir: Path) -> str | None:
        """The job id of the job named `name` (it carries the submit token), wherever Slurm still lists it."""
        with contextlib.suppress(SlurmError):
            out = _slurm(["squeue", "-h", "-t", "all", f"--name={name}", "-o", "%i"])
            ids = [x.strip() for x in out.stdout.split() if x.strip()]
            if ids:
                return ids[-1]
        with contextlib.suppress(SlurmError):
            out = _slurm(["sacct", "-n", "-X", "-P", f"--name={name}", "-o", "JobID", "-S", "now-7days"])
            ids = [x.strip() for x in out.stdout.split() if x.strip()]
            if ids:
                return ids[-1]
        text = self._jobcomp_text()
        if text:
            for line in reversed(text.splitlines()):
                kv = st.parse_kv(line)
                if kv.get("Name") == name and kv.get("JobId"):
                    return kv["JobId"]
        exit_file = _read_json(adir / "exit.json")
        if exit_file and exit_file.get("job_id"):
            return str(exit_file["job_id"])
        return None

    # -- state ------------------------------------------------------------------------------------------
    def job_state(self, attempt: Attempt, *, fresh: bool = False) -> st.JobState | None:
        """The job's state, asked at most every `poll_seconds` (slurmctld is shared; babysit is polite)."""
        job_id = attempt.job_id or self._job_id_from_dir(attempt)
        if job_id is None:
            return None
        now = time.time()
        with self._lock:
            cached = self._cache.get(job_id)
            if cached is not None and (cached.terminal or (not fresh and now - (cached.seen_at or 0)
                                                          < self.poll_seconds)):
                return cached
        adir = Path(attempt.attempt_dir)
        last = cached or _last_seen(adir)
        try:
            state = self._ask(job_id, adir, last, now)
        except SlurmError as exc:
            if not exc.transient:
                log.warning("slurm state unavailable", job=job_id, error=exc.message)
            return cached or last
        with self._lock:
            self._cache[job_id] = state
            earlier = st.requeued_run(last, state)
            kept = self.requeues(attempt) if earlier is not None else ()  # a file read only on a requeue
            if earlier is not None and all(r.get("restart") != earlier["restart"] for r in kept):
                # the run before Slurm requeued the job, kept once (two threads may both have seen it)
                _write_json(adir / REQUEUES_FILE, {"job_id": job_id, "runs": [*kept, earlier]})
        seen = (last.state, last.reason, last.start, last.restarts) if last is not None else None
        if seen != (state.state, state.reason, state.start, state.restarts):
            _write_json(adir / "state.json", state.to_dict())  # what was last seen, for a vanished job
        return state

    def requeues(self, attempt: Attempt) -> tuple[dict[str, object], ...]:
        """The job's runs before Slurm requeued it (`slurm_state.requeued_run`), oldest first."""
        kept = _read_json(Path(attempt.attempt_dir) / REQUEUES_FILE) or {}
        return tuple(r for r in kept.get("runs") or () if isinstance(r, dict))

    def _ask(self, job_id: str, adir: Path, last: st.JobState | None, now: float) -> st.JobState:
        out = _slurm(["scontrol", "show", "job", "-o", job_id], check=False)
        if out.rc == 0:
            found = st.from_scontrol(job_id, out.stdout, now)
            if found is not None:
                return found
        elif "Invalid job id" not in out.stderr:
            raise SlurmError(f"scontrol show job {job_id}: {out.stderr.strip()}", transient=True)
        # slurmctld forgot it (MinJobAge): accounting, the jobcomp file, the script's exit.json, else vanished
        with contextlib.suppress(SlurmError):
            acct = _slurm(["sacct", "-X", "-j", job_id, "-n", "-P", "-o", st.SACCT_FIELDS], check=False)
            if acct.rc == 0:
                found = st.from_sacct(job_id, acct.stdout, now)
                if found is not None and found.terminal:
                    return found
        text = self._jobcomp_text()
        if text:
            found = st.from_jobcomp(job_id, text, now)
            if found is not None:
                return found
        exit_file = _read_json(adir / "exit.json")
        if exit_file is not None and str(exit_file.get("job_id") or job_id) == job_id:
            return st.from_exit_file(job_id, exit_file, last, now)
        return st.vanished(job_id, last, now)

    def _jobcomp_text(self) -> str | None:
        if self._jobcomp is None:
            kind, loc = "", None
            with contextlib.suppress(SlurmError):
                conf = _slurm(["scontrol", "show", "config"]).stdout
                for line in conf.splitlines():
                    key, _, value = line.partition("=")
                    if key.strip() == "JobCompType":
                        kind = value.strip()
                    elif key.strip() == "JobCompLoc":
                        loc = value.strip()
            self._jobcomp = (kind, loc)
        kind, loc = self._jobcomp
        if kind != "jobcomp/filetxt" or not loc:
            return None
        try:
            with open(loc, "rb") as f:  # the newest jobs are at the end: read the last 4 MiB
                f.seek(0, os.SEEK_END)
                f.seek(max(0, f.tell() - 4 * 2**20))
                return f.read().decode("utf-8", "replace")
        except OSError:
            return None

    def charged_gpus(self, spec: RunSpec) -> int:
        """Nodes × GPUs per node (`slurm_script.requested_gpus`): a 2-node × 8-GPU job holds 16."""
        return script.requested_gpus(spec.slurm or SlurmSpec(), len(spec.gpus))

    def node_rows(self, attempt: Attempt) -> tuple[NodeRow, ...]:
        """Each node's row from its sidecar's newest record and its ranks' recent beats (`rank-<r>.jsonl`,
        which the trainer writes where `$BABYSIT_RANK_LOG` says); one row for a job on one node."""
        adir = Path(attempt.attempt_dir)
        beats = {}
        for path in adir.glob("rank-*.jsonl"):
            rank = path.stem.removeprefix("rank-")
            if rank.isdigit():
                beats[int(rank)] = recent_records(path, BEATS_READ)
        return node_rows(SidecarGpuProbe(adir).records(), beats, time.time())

    def straggler(self, attempt: Attempt) -> str | None:
        """A node that holds the others back (`core.nodes.straggler`), from the ranks' recent beats."""
        beats = {int(p.stem.removeprefix("rank-")): recent_records(p, BEATS_READ)
                 for p in Path(attempt.attempt_dir).glob("rank-*.jsonl") if p.stem.removeprefix("rank-").isdigit()}
        rows = node_rows((), beats, time.time())
        return straggler(rows, min((len(b) for b in beats.values()), default=0))

    def remote_stacks(self, attempt: Attempt) -> dict[str, str] | None:
        """Every rank's stack from every node of the running job: `python -m babysit.run.node_stacks` on
        each node through `srun --overlap` (the daemon's host cannot see the job's processes), the stalled
        rank named (`core.nodes.stacks_by_rank`)."""
        job_id = attempt.job_id or self._job_id_from_dir(attempt)
        state = self.job_state(attempt, fresh=True) if job_id else None
        if job_id is None or state is None or state.state != "RUNNING" or not state.nodes:
            return {"note": f"no stack dump: Slurm job {job_id} is {state.state if state else 'unknown'}, "
                            "not running"}
        into = Path(attempt.attempt_dir) / NODE_STACKS_DIR
        for old in into.glob("node-*.json"):  # an earlier look's
            old.unlink(missing_ok=True)
        try:
            hosts = _slurm(["scontrol", "show", "hostnames", state.nodes]).stdout.split()
            out = _slurm(["srun", "--overlap", "--mem=0", f"--jobid={job_id}", f"--nodelist={state.nodes}",
                          f"--nodes={len(hosts)}", f"--ntasks={len(hosts)}", "--ntasks-per-node=1",
                          sys.executable, "-m", "babysit.run.node_stacks", "--job-id", job_id],
                         timeout=STACKS_TIMEOUT_S, check=False, cwd=attempt.attempt_dir)
        except SlurmError as exc:
            return {"note": f"no stack dump: {exc.message}"}
        dumps = node_dumps(out.stdout, into)
        if not dumps:
            return {"note": f"no stack dump: srun --overlap on job {job_id} printed nothing "
                            f"(exit {out.rc}): {out.stderr.strip()[-300:]}"}
        last_steps = {}
        for path in Path(attempt.attempt_dir).glob("rank-*.jsonl"):
            beat = recent_records(path, 1)
            if beat and path.stem.removeprefix("rank-").isdigit():
                last_steps[int(path.stem.removeprefix("rank-"))] = int(beat[-1].get("step", 0))
        return stacks_by_rank(dumps, last_steps)

    def launch_env(self, gpus: Sequence[int]) -> dict[str, str]:
        return {}  # Slurm sets CUDA_VISIBLE_DEVICES for the GPUs it allocates

    def exit_fd(self, attempt: Attempt) -> int | None:
        return None

    def start_time(self, attempt: Attempt) -> float | None:
        """The job's real StartTime once it left PENDING; None while it waits (it costs nothing yet)."""
        state = self.job_state(attempt)
        if state is None or not state.started:
            return None
        return state.start

    def allocated_gpus(self, attempt: Attempt) -> int | None:
        """GPUs Slurm allocated (AllocTRES gres/gpu); None until known."""
        state = self.job_state(attempt)
        return state.alloc_gpus if state is not None else None

    def exit_info(self, attempt: Attempt) -> ExitInfo | None:
        state = self.job_state(attempt)
        if state is None or not state.terminal:
            return None
        info = st.exit_info(state, tail_lines(Path(attempt.attempt_dir) / "stderr.log"))
        if state.state in st.MACHINE_LOST:
            info = replace(info, lost_nodes=self._lost_nodes(attempt, state))
        if (Path(attempt.attempt_dir) / script.TIME_LIMIT_FILE).exists():
            info = replace(info, time_limit=True)  # the batch shell's trap saw Slurm's warning
        return info

    def _lost_nodes(self, attempt: Attempt, state: st.JobState) -> tuple[str, ...]:
        """Which of the job's nodes Slurm lost, asked once (`sinfo`), kept in `lost_nodes.json` and
        quarantined: later submissions of every run leave them out (`slurm_nodes.excluded`)."""
        adir = Path(attempt.attempt_dir)
        kept = _read_json(adir / "lost_nodes.json")
        if kept is not None:
            return tuple(kept.get("nodes") or ())
        found: tuple[str, ...] = ()
        if state.nodes:
            with contextlib.suppress(SlurmError):
                found = st.lost_nodes(_slurm(["sinfo", "-h", "-N", "-n", state.nodes, "-o", "%N %T"]).stdout)
        _write_json(adir / "lost_nodes.json", {"nodes": list(found), "job_id": state.job_id, "state": state.state,
                                               "job_nodes": state.nodes})
        if found and self.state_dir is not None:
            slurm_nodes.quarantine(self.state_dir, found, f"lost under Slurm job {state.job_id} ({state.state}) "
                                   f"of run {attempt.run}", time.time(), run=attempt.run, job_id=state.job_id)
        return found

    def wait(self, attempt: Attempt, timeout: float | None) -> bool:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            state = self.job_state(attempt)
            if state is not None and state.terminal:
                return True
            if attempt.job_id is None and self._job_id_from_dir(attempt) is None:
                return True  # nothing was submitted: nothing to wait for
            if deadline is not None and time.monotonic() >= deadline:
                return False
            pause = self.poll_seconds if deadline is None else min(self.poll_seconds, deadline - time.monotonic())
            time.sleep(max(0.05, pause))

    # -- stop -------------------------------------------------------------------------------------------
    def stop(self, attempt: Attempt, sig: int) -> None:
        """Ask the trainer's leader to stop, as the batch script expects it (`slurm_script.stop_scope`).

        "batch": `scancel --batch --signal=SIG` reaches the batch shell alone, which passes it to the
        trainer alone — never to its DataLoader workers. "full" (the srun/torchrun launch, and jobs
        submitted before the scope was recorded): `scancel --full --signal=SIG`, every process of the
        job. A job still PENDING has no process to signal: it is cancelled outright.
        """
        job_id = attempt.job_id or self._job_id_from_dir(attempt)
        if job_id is None:
            return
        state = self.job_state(attempt, fresh=True)
        if state is not None and state.terminal:
            return
        if state is not None and state.state == "PENDING":
            self._scancel([job_id])
            return
        name = signals.Signals(sig).name.removeprefix("SIG")
        job = _read_json(Path(attempt.attempt_dir) / "job.json") or {}
        scope = "--batch" if job.get("stop_scope") == "batch" else "--full"
        self._scancel([f"--signal={name}", scope, job_id])

    def kill(self, attempt: Attempt) -> None:
        """After the grace period: cancel the job (state CANCELLED), and SIGKILL whatever still runs."""
        job_id = attempt.job_id or self._job_id_from_dir(attempt)
        if job_id is None:
            return
        self._scancel([job_id])
        self._scancel(["--signal=KILL", "--full", job_id])

    def _scancel(self, args: list[str]) -> None:
        try:
            _slurm(["scancel", *args])
        except SlurmError as exc:
            # "Job/step already completing or completed" and "Invalid job id": nothing left to stop
            text = exc.stderr.lower()
            if "already completing" in text or "invalid job id" in text or "completed" in text:
                return
            log.warning("scancel failed", args=args, error=exc.message)

    # -- probes and notes -------------------------------------------------------------------------------
    def root_pid(self, attempt: Attempt) -> int | None:
        return None  # the job's processes live on compute nodes; the sidecar sees them

    def root(self, attempt: Attempt) -> tuple[int, float | None] | None:
        return None

    def gpu_probe(self, attempt: Attempt, default: GpuProbe) -> GpuProbe:
        """The job's GPUs as the probe sidecars saw them: the daemon's node cannot see them. Each of the
        job's nodes is expected to speak: a sidecar still silent `stale_after` past the job's start is
        "not measured", a queued job's none is waited for."""
        state = self.job_state(attempt)
        return SidecarGpuProbe(Path(attempt.attempt_dir), stale_after=max(60.0, 6 * _probe_interval()),
                               nodes=hostnames(state.nodes) if state is not None else (),
                               started_at=state.start if state is not None and state.started else None)

    def own_pids(self, attempt: Attempt) -> frozenset[int]:
        return frozenset()  # the job's processes live on another node: its probe sidecar marks them

    def status_note(self, attempt: Attempt) -> str | None:
        return st.status_note(self.job_state(attempt))

    def _job_id_from_dir(self, attempt: Attempt) -> str | None:
        job = _read_json(Path(attempt.attempt_dir) / "job.json")
        return str(job["job_id"]) if job and job.get("job_id") else None


def node_dumps(stdout: str, into: Path) -> list[dict]:
    """Each node's `node_stacks` line, one a node: the file it wrote on the shared disk, else its line in
    srun's output (srun interleaves two nodes' long lines printed at once, so a line may not parse)."""
    dumps: dict[str, dict] = {}
    for line in stdout.splitlines():
        with contextlib.suppress(ValueError):
            found = json.loads(line)
            if isinstance(found, dict):
                dumps[str(found.get("node"))] = found
    for path in sorted(into.glob("node-*.json")):
        found = _read_json(path)
        if found is not None:
            dumps[str(found.get("node"))] = found
    return list(dumps.values())


def _probe_interval() -> float:
    return float(os.environ.get(PROBE_INTERVAL_ENV) or 10.0)


def _spec_path(env: dict[str, str]) -> str:
    path = env.get("BABYSIT_SPEC_FILE")
    if not path:
        raise SlurmError("the Slurm executor needs the run's spec file (BABYSIT_SPEC_FILE in the launch env)",
                         hint="a supervisor bug: it must pass BABYSIT_SPEC_FILE for executor = \"slurm\"")
    return path


def _last_seen(adir: Path) -> st.JobState | None:
    data = _read_json(adir / "state.json")
    if data is None:
        return None
    try:
        return st.JobState.from_dict(data)
    except TypeError:
        return None


def _write_json(path: Path, data: dict) -> None:
    write_atomic(path, json.dumps(data, sort_keys=True) + "\n")


def _read_json(path: Path) -> dict | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None
