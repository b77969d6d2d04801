"""The Slurm backend against a real Slurm (`.ci/slurm-up.sh`: 6 nodes on one host), driven by the real daemon (`babysit up`).

Each test registers a run with `executor = "slurm"` in a temp registry, runs `babysit up --accelerated
--exit-when-idle` as a subprocess and reads what happened from the state database and from Slurm.
Run names carry a random suffix: the jobcomp file outlives test sessions.
"""

from __future__ import annotations

import json
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from babysit.core.snapshot import Snapshot
from babysit.db.store import Attempt
from babysit.executors.slurm_state import parse_time
from tests.slurm.conftest import REPO, Bench, jobs_named, jobscript, slurm_job

pytestmark = pytest.mark.slurm


def unique(prefix: str) -> str:
    return f"{prefix}-{secrets.token_hex(3)}"


def only_attempt(bench: Bench, name: str) -> Attempt:
    attempts = bench.store().attempts(name)
    assert len(attempts) == 1, [(a.n, a.status, a.job_id) for a in attempts]
    return attempts[0]


def test_a_completing_job_is_completed_with_slurms_own_start_and_end(bench: Bench, tmp_path: Path) -> None:
    name = unique("tdone")
    if (REPO / "trainer" / "recipes" / "tiny.toml").exists():
        # this interpreter: torch and the trainer are installed in it
        command = [sys.executable, "-m", "trainer", "--recipe", "tiny", "--steps", "15", "--eval-every", "0",
                   "--save-every", "0", "--log", f"outputs/{name}/train_log.jsonl",
                   "--checkpoints", f"outputs/{name}/ckpt"]
        env = {"BABYSIT_TRAINER_CACHE": str(tmp_path / "cache"), "PYTHONPATH": str(REPO)}
    else:
        command, env = jobscript("ok", "4"), {}
    bench.run_toml(name, command, env=env)
    bench.up(timeout=150)

    attempt = only_attempt(bench, name)
    assert attempt.outcome == "completed", attempt.detail
    assert attempt.job_id and attempt.job_id.isdigit()
    assert attempt.detail.get("state") == "COMPLETED"
    assert bench.store().run_state(name)[0] == "finished"
    job = slurm_job(attempt.job_id)
    assert job.get("JobState") == "COMPLETED"
    assert attempt.started_at == parse_time(job["StartTime"])  # the job's start, not its submission
    assert attempt.ended_at == parse_time(job["EndTime"])
    log = (tmp_path / "outputs" / name / "train_log.jsonl").read_text().splitlines()
    assert log and all("step" in json.loads(line) for line in log)
    adir = Path(attempt.attempt_dir)
    assert json.loads((adir / "job.json").read_text())["job_id"] == attempt.job_id
    assert json.loads((adir / "exit.json").read_text())["exit_code"] == 0
    assert "#SBATCH --job-name=babysit-" + name in (adir / "job.sbatch").read_text()


@pytest.mark.parametrize(("mode", "outcome", "evidence"), [
    ("fail", "crashed", "boom: the data loader fell over"),
    ("oom", "oom", "MemoryError"),
])
def test_a_failing_job_is_classified_from_its_exit_and_stderr(bench: Bench, mode: str, outcome: str,
                                                             evidence: str) -> None:
    name = unique(f"t{mode}")
    bench.run_toml(name, jobscript(mode))
    bench.up()
    attempt = only_attempt(bench, name)
    assert attempt.outcome == outcome, attempt.detail
    assert attempt.detail.get("state") == "FAILED"
    assert evidence in attempt.detail.get("stderr_tail", "")
    assert bench.store().run_state(name)[0] == "failed"
    assert [i.kind for i in bench.store().incidents(name)].count(outcome) == 1


def test_the_gpu_hour_guard_stops_the_job_with_term_first(bench: Bench, tmp_path: Path) -> None:
    name = unique("tcap")
    signals_file = tmp_path / "signals.txt"
    bench.run_toml(name, jobscript("term", str(signals_file)), gpus=[0],
                   guards={"gpu_hours_cap": 0.002, "stop_grace_seconds": 30, "exclusive_gpu": False},
                   slurm={"time_limit": "00:05:00"})  # --gres=gpu:1: the CI's nodes have stand-in GPUs
    bench.up(timeout=120)

    attempt = only_attempt(bench, name)
    facts = bench.store().run_state(name)[1]
    assert attempt.outcome == "stopped", attempt.detail
    assert facts.get("stop", {}).get("reason") == "gpu-hours-cap"
    assert "gpu-hours-cap" in [i.kind for i in bench.store().incidents(name)]
    # TERM came first: the job's handler ran (a SIGKILL cannot be handled) and it exited 10 on its own.
    assert signals_file.read_text().startswith("TERM ")
    assert (attempt.exit_code, attempt.exit_signal) == (10, None)
    records = [json.loads(x) for x in (tmp_path / "outputs" / name / "train_log.jsonl").read_text().splitlines()]
    assert records[-1].get("event") == "sigterm"
    # GPU-seconds from the job's real start (Slurm counts whole seconds): about the 7.2 s cap, not more than the run
    used = attempt.gpu_seconds(time.time())
    assert 6 <= used < 60, used
    assert list((Path(attempt.attempt_dir)).glob("probe-*.jsonl")), "the probe sidecar wrote nothing"


def test_the_gpu_hour_cap_counts_every_node_of_a_two_node_job(bench: Bench, tmp_path: Path) -> None:
    """2 nodes × 1 GPU: the attempt is charged 2 GPUs, so the 0.002 GPU-hour cap (7.2 GPU-seconds) stops
    the job after about 3.6 s of wall time, and its GPU-seconds are twice Slurm's run time."""
    name = unique("tcap2")
    signals_file = tmp_path / "signals.txt"
    bench.run_toml(name, jobscript("term", str(signals_file)), gpus=[0],
                   guards={"gpu_hours_cap": 0.002, "stop_grace_seconds": 30, "exclusive_gpu": False},
                   slurm={"nodes": 2, "torchrun": False, "time_limit": "00:05:00"})
    bench.up(timeout=120)

    attempt = only_attempt(bench, name)
    assert attempt.outcome == "stopped", attempt.detail
    assert bench.store().run_state(name)[1].get("stop", {}).get("reason") == "gpu-hours-cap"
    assert attempt.gpus == 2
    job = slurm_job(attempt.job_id or "")
    assert job.get("NumNodes") == "2", job
    wall = parse_time(job["EndTime"]) - parse_time(job["StartTime"])
    assert attempt.gpu_seconds(time.time()) == pytest.approx(2 * wall)
    assert 6 <= attempt.gpu_seconds(time.time()) < 60  # Slurm counts whole seconds: 3 s × 2 GPUs at least


def test_a_pending_job_is_shown_pending_with_its_reason_and_costs_nothing(bench: Bench) -> None:
    name = unique("tpend")
    bench.run_toml(name, jobscript("ok", "2"), gpus=[0], poll={"first_after_minutes": 1, "every_minutes": 1},
                   slurm={"gpus_per_node": 0, "sbatch_options": ["--begin=now+1hour"]})
    daemon = bench.start_up()
    try:
        def pending_poll() -> Snapshot | None:
            for poll in bench.store().polls(name):
                if "PENDING" in (poll.snapshot.note or ""):
                    return poll.snapshot
            return None

        snap = bench.until("a poll saying PENDING", pending_poll, timeout=60)
        assert "BeginTime" in (snap.note or ""), snap.note
        bench.babysit("abort", name)
        assert daemon.wait(timeout=60) == 0, bench.daemon_logs()
    finally:
        if daemon.poll() is None:
            daemon.kill()
            daemon.wait()
    attempt = only_attempt(bench, name)
    assert attempt.outcome == "stopped", attempt.detail
    assert attempt.detail.get("state") == "CANCELLED"
    assert attempt.gpu_seconds(time.time()) < 1.0  # a queued job holds no GPU
    assert bench.store().run_state(name)[0] == "stopped"


def test_a_restarted_daemon_adopts_the_same_job_and_never_resubmits(bench: Bench) -> None:
    name = unique("tadopt")
    bench.run_toml(name, jobscript("sleep", "10"))
    first = bench.start_up()
    try:
        attempt = bench.until("the job id in the store",
                              lambda: next((a for a in bench.store().attempts(name) if a.job_id), None), timeout=60)
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=10)
    finally:
        if first.poll() is None:
            first.kill()
    job_id = attempt.job_id
    bench.up(timeout=90)

    again = only_attempt(bench, name)
    assert again.job_id == job_id
    assert again.outcome == "completed", again.detail
    assert jobs_named(f"babysit-{name}-") == {job_id}


def test_find_recovers_a_job_by_its_submit_token_when_job_json_is_lost(bench: Bench, tmp_path: Path) -> None:
    """A daemon killed between sbatch and writing job.json: the name's token finds the job."""
    from dataclasses import replace

    from babysit.db.store import Attempt
    from babysit.executors.slurm import SlurmExecutor

    name = unique("ttoken")
    spec = bench.run_toml(name, jobscript("sleep", "30"))
    adir = tmp_path / "attempt"
    attempt = Attempt(1, name, 1, "default", (), "slurm", 0, str(adir), "launching", None, None, None, time.time(),
                      None, None, None, None, None, {})
    executor = SlurmExecutor(tmp_path, poll_seconds=0.5)
    env = {**bench.env, "BABYSIT_SPEC_FILE": str(spec), "BABYSIT_LOG": str(tmp_path / "log.jsonl")}
    launched = executor.launch(attempt, jobscript("sleep", "30"), env, str(tmp_path))
    try:
        (adir / "job.json").unlink()
        found = SlurmExecutor(tmp_path, poll_seconds=0.5).find(attempt)
        assert found is not None and found.job_id == launched.job_id
        assert json.loads((adir / "job.json").read_text())["found_by"] == "token"
    finally:
        running = replace(attempt, job_id=launched.job_id, status="running")
        executor.stop(running, signal.SIGTERM)
        assert executor.wait(running, 30)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGUSR1])
def test_a_stop_reaches_the_trainer_alone_not_its_dataloader_workers(bench: Bench, tmp_path: Path, sig: int) -> None:
    """`scancel --batch`: the batch shell passes the stop to the trainer; its worker is the trainer's to stop."""
    from dataclasses import replace

    from babysit.db.store import Attempt
    from babysit.executors.slurm import SlurmExecutor

    name = unique("tleader")
    notes = tmp_path / "signals.txt"
    spec = bench.run_toml(name, jobscript("leader", str(notes)))
    adir = tmp_path / "attempt"
    attempt = Attempt(1, name, 1, "default", (), "slurm", 0, str(adir), "launching", None, None, None, time.time(),
                      None, None, None, None, None, {})
    executor = SlurmExecutor(tmp_path, poll_seconds=0.5)
    env = {**bench.env, "BABYSIT_SPEC_FILE": str(spec), "BABYSIT_LOG": str(tmp_path / "log.jsonl")}
    launched = executor.launch(attempt, jobscript("leader", str(notes)), env, str(tmp_path))
    running = replace(attempt, job_id=launched.job_id, status="running")
    try:
        bench.until("the trainer and its worker", lambda: notes.exists() and notes.read_text().count("ready") == 2)
        executor.stop(running, sig)
        assert executor.wait(running, 30)
    finally:
        executor.kill(running)
    assert notes.read_text().splitlines()[2:] == [f"leader {signal.Signals(sig).name}"], notes.read_text()
    info = executor.exit_info(running)
    assert info is not None and info.exit_code == 10, info


def test_babysit_run_with_the_slurm_executor_submits_it_follows_it_and_exits_0(bench: Bench) -> None:
    """`babysit run --executor slurm -- CMD`: the command becomes a job, its output (Slurm's --output file,
    which the stdout source reads too) comes through, its printed lines are read by a preset, exit 0."""
    name = unique("adhoc")
    bench.runs.append(name)
    res = subprocess.run([sys.executable, "-m", "babysit", "run", "--accelerated", "--no-view", "--executor",
                          "slurm", "--name", name, "--registry", str(bench.registry), "--", sys.executable, "-m",
                          "babysit.demo.nanogpt_like", "--iters", "60", "--sleep", "0.02"],
                         cwd=bench.root, env=bench.env, capture_output=True, text=True, timeout=240)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    attempt = only_attempt(bench, name)
    assert attempt.job_id and attempt.outcome == "completed"
    assert "iter 60: loss" in res.stdout and 'preset "nanogpt"' in res.stdout
    assert 'executor = "slurm"' in (bench.state_dir / "adhoc" / f"{name}.toml").read_text()


def test_a_requeued_job_is_followed_as_the_same_attempt_resumed_with_its_earlier_run_counted(
        bench: Bench, tmp_path: Path) -> None:
    """`scontrol requeue` mid-run (what a preemption with PreemptMode=REQUEUE does): the same job id goes
    back to PENDING with Restarts=1 and Slurm reruns its script. babysit follows it as the same attempt
    (never a new run, never an end), says it once as not the trainer's fault, reruns the trainer from its
    checkpoint, and counts the GPU-time the job had run before the requeue."""
    name = unique("treq")
    bench.run_toml(name, jobscript("resumable", "30", str(tmp_path / "ckpt")), gpus=[0],
                   guards={"exclusive_gpu": False, "stall_minutes": 90},
                   retry={"max_attempts": 1, "resume": "latest-checkpoint"},
                   slurm={"time_limit": "00:05:00", "sbatch_options": ["--requeue"]})  # the CI's JobRequeue=0
    daemon = bench.start_up()
    try:
        log = tmp_path / "outputs" / name / "train_log.jsonl"
        bench.until("step 5", lambda: log.exists() and any(
            json.loads(x).get("step", 0) >= 5 for x in log.read_text().splitlines()), timeout=60)
        job_id = bench.store().attempts(name)[0].job_id or ""
        first = slurm_job(job_id)
        requeued_at = time.time()
        # requeuehold, released below: a plain requeue may relaunch the job on its node before that node's
        # slurmd has finished killing the first run ("Job already killed, do not launch batch job": FAILED)
        subprocess.run(["scontrol", "requeuehold", job_id], check=True, capture_output=True, timeout=15)
        bench.until("the job requeued", lambda: slurm_job(job_id).get("Restarts") == "1", timeout=30)
        bench.until("the requeue seen", lambda: (Path(bench.store().attempts(name)[0].attempt_dir)
                                                 / "requeues.json").exists(), timeout=30)
        def started_again() -> bool:  # released, and Slurm's ~2-min hold of a requeued job (BeginTime) lifted
            subprocess.run(["scontrol", "release", job_id], capture_output=True, timeout=15)
            subprocess.run(["scontrol", "update", f"JobId={job_id}", "StartTime=now"], capture_output=True, timeout=15)
            return slurm_job(job_id).get("JobState") == "RUNNING"

        bench.until("the job running again", started_again, timeout=30)
        assert daemon.wait(timeout=120) == 0, bench.daemon_logs()[-3000:]
    finally:
        if daemon.poll() is None:
            daemon.kill()
            daemon.wait()
    attempt = only_attempt(bench, name)
    assert attempt.outcome == "completed" and attempt.job_id == job_id, attempt.detail
    assert bench.store().run_state(name)[0] == "finished"
    [earlier] = attempt.detail["requeues"]
    assert earlier["restart"] == 1 and earlier["start"] == parse_time(first["StartTime"])
    assert earlier["end"] >= requeued_at - 1
    assert attempt.detail["requeued_seconds"] == pytest.approx(earlier["end"] - earlier["start"])
    job = slurm_job(job_id)
    assert attempt.started_at == parse_time(job["StartTime"]) >= earlier["end"]  # the rerun's own start, never overlapping
    assert attempt.gpu_seconds(time.time()) == pytest.approx(attempt.ended_at - attempt.started_at
                                                             + attempt.detail["requeued_seconds"])
    said = [i for i in bench.store().incidents(name) if i.kind == "requeued"]
    assert len(said) == 1 and said[0].body["restart"] == 1, said
    posted = [json.loads(line) for line in (bench.state_dir / "channel.jsonl").read_text().splitlines()]
    text = [m["text"] for m in posted if m.get("kind") == "incident" and "requeued" in m.get("text", "")]
    assert len(text) == 1 and f"Slurm requeued job {job_id} (restart 1): not the trainer's fault" in text[0], text
    assert not [i.kind for i in bench.store().incidents(name) if i.kind in ("crashed", "retrying")]
    starts = [json.loads(x) for x in log.read_text().splitlines() if json.loads(x).get("event") == "start"]
    assert len(starts) == 2 and starts[1]["config"]["resumed_from_step"] >= 5, starts
    assert "--resume latest" in (Path(attempt.attempt_dir) / "job.sbatch").read_text()
    assert json.loads(log.read_text().splitlines()[-1])["event"] == "completed"


def test_a_preempted_job_is_not_the_trainers_fault_and_the_run_goes_on_from_its_checkpoint(
        bench: Bench, tmp_path: Path) -> None:
    """A job in partition "urgent" (n3, a higher PriorityTier: `.ci/slurm-up.sh`) needs a GPU the run's job
    holds: Slurm preempts the run's job (PreemptMode=REQUEUE, but the job is not `--requeue`: it ends
    PREEMPTED). babysit calls it `preempted`, never the trainer's fault, and continues the run in a new
    job from its checkpoint at once, whatever retry.on says: one run, one history, one cap."""
    name = unique("tpre")
    bench.run_toml(name, jobscript("resumable", "30", str(tmp_path / "ckpt")), gpus=[0],
                   guards={"exclusive_gpu": False, "stall_minutes": 90},
                   retry={"max_attempts": 1, "on": [], "resume": "latest-checkpoint"},
                   # n3 alone, both its GPUs: the urgent job can only find room by preempting this one
                   slurm={"time_limit": "00:05:00", "gres": "gpu:2", "torchrun": False,
                          "sbatch_options": ["--nodelist=n3", "--exclusive"]})
    daemon = bench.start_up()
    urgent = ""
    try:
        log = tmp_path / "outputs" / name / "train_log.jsonl"
        bench.until("step 5", lambda: log.exists() and any(
            json.loads(x).get("step", 0) >= 5 for x in log.read_text().splitlines()), timeout=90)
        urgent = subprocess.run(["sbatch", "--parsable", "-p", "urgent", "-w", "n3", "--gres=gpu:1", "-o",
                                 "/dev/null", f"--job-name=babysit-{name}-urgent", "--wrap", "sleep 2"],
                                check=True, capture_output=True, text=True, timeout=15).stdout.strip()
        assert daemon.wait(timeout=120) == 0, bench.daemon_logs()[-3000:]
    finally:
        if daemon.poll() is None:
            daemon.kill()
            daemon.wait()
    attempts = bench.store().attempts(name)
    assert [a.outcome for a in attempts] == ["preempted", "completed"], [(a.outcome, a.detail) for a in attempts]
    first, again = attempts
    assert first.detail.get("state") == "PREEMPTED" and slurm_job(first.job_id or "").get("JobState") == "PREEMPTED"
    assert first.detail["summary"].startswith("preempted: Slurm gave the job's nodes to a higher-priority job")
    assert list(again.argv[-2:]) == ["--resume", "latest"]
    starts = [json.loads(x) for x in log.read_text().splitlines() if json.loads(x).get("event") == "start"]
    assert len(starts) == 2 and starts[1]["config"]["resumed_from_step"] >= 5, starts
    assert bench.store().run_state(name)[0] == "finished"
    kinds = [i.kind for i in bench.store().incidents(name)]
    assert "preempted" in kinds and "crashed" not in kinds, kinds
    assert first.gpus == 2 and first.gpu_seconds(time.time()) > 0  # its GPU-time counts in the run's hours
    assert urgent and slurm_job(urgent).get("JobState") == "COMPLETED"
