"""The pure parts of the Slurm backend: batch-script rendering, state parsing, the state → exit mapping,
and the sidecar reader. No Slurm needed: these run everywhere."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

from babysit.core.classify import ExitFacts, classify_exit
from babysit.core.spec.slurm import SlurmSpec
from babysit.executors import slurm_script as script
from babysit.executors import slurm_state as st
from babysit.probes.remote import SidecarGpuProbe, choose_gpus, view_from_records

NASTY = ["python", "-c", "print('$HOME `id` $(whoami); rm -rf / && echo \"x\" | cat > /tmp/p *')", "a b", "", "'"]


def request(**over: object) -> script.BatchRequest:
    base: dict[str, object] = dict(run="r1", attempt=2, token="abcd1234", attempt_dir="/st/runs/r1/attempt-2",
                                   workdir="/work dir/x", argv=tuple(NASTY),
                                   env=(("WEIRD", "a b'c\"$(id)`x`;\n2"), ("PLAIN", "1")),
                                   slurm=SlurmSpec(), n_gpus=1)
    base.update(over)
    return script.BatchRequest(**base)  # type: ignore[arg-type]


# -- batch script ---------------------------------------------------------------------------------------


def test_script_quotes_every_argv_word_so_the_shell_sees_exactly_the_argv() -> None:
    text = script.render(request())
    line = next(ln for ln in text.splitlines() if ln.startswith("( trap - INT QUIT; exec python"))
    assert shlex.split(line.removeprefix("( trap - INT QUIT; exec ").removesuffix(" ) &")) == NASTY


def test_script_exports_env_values_verbatim_through_a_real_shell(tmp_path: Path) -> None:
    req = request(attempt_dir=str(tmp_path), workdir=str(tmp_path), argv=("printenv", "WEIRD"))
    (tmp_path / "job.sh").write_text(script.render(req))
    out = subprocess.run(["bash", str(tmp_path / "job.sh")], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    assert out.stdout == "a b'c\"$(id)`x`;\n2\n"
    assert json.loads((tmp_path / "exit.json").read_text())["exit_code"] == 0


def test_script_rejects_env_names_a_shell_cannot_export() -> None:
    with pytest.raises(ValueError, match="not a shell variable name"):
        script.render(request(env=(("BAD-NAME", "1"),)))


def test_script_is_valid_bash() -> None:
    for req in (request(), request(slurm=SlurmSpec(nodes=2, gpus_per_node=4)),
                request(probe_argv=("/venv/bin/python", "-m", "babysit", "probe"))):
        res = subprocess.run(["bash", "-n"], input=script.render(req), capture_output=True, text=True)
        assert res.returncode == 0, res.stderr


def test_directives_carry_job_name_token_and_every_slurm_field_with_user_extras_last() -> None:
    s = SlurmSpec(partition="gpu", account="lab", qos="high", nodes=1, gpus_per_node=2, time_limit="01:00:00",
                  cpus_per_task=8, mem="64G", sbatch_options=("--exclusive", "--constraint=h200"))
    opts = script.directives(request(slurm=s))
    assert opts[0] == "--job-name=babysit-r1-2-abcd1234"
    assert "--output=/st/runs/r1/attempt-2/stdout.log" in opts and "--error=/st/runs/r1/attempt-2/stderr.log" in opts
    for want in ("--partition=gpu", "--account=lab", "--qos=high", "--nodes=1", "--gres=gpu:2", "--time=01:00:00",
                 "--cpus-per-task=8", "--mem=64G", "--ntasks-per-node=1"):
        assert want in opts
    assert opts[-2:] == ["--exclusive", "--constraint=h200"]


@pytest.mark.parametrize(("slurm", "n_gpus", "gres"), [
    (SlurmSpec(), 1, "gpu:1"),
    (SlurmSpec(), 0, None),
    (SlurmSpec(gpus_per_node=8), 1, "gpu:8"),
    (SlurmSpec(gres="gpu:h200:4"), 1, "gpu:h200:4"),
    (SlurmSpec(gres=""), 2, None),
    (SlurmSpec(gpus_per_node=0), 2, None),
])
def test_gres_comes_from_gres_else_gpus_per_node_else_len_gpus(slurm: SlurmSpec, n_gpus: int,
                                                               gres: str | None) -> None:
    assert script.gres(slurm, n_gpus) == gres


def test_requested_gpus_is_nodes_times_per_node() -> None:
    assert script.requested_gpus(SlurmSpec(nodes=2, gpus_per_node=8), 1) == 16
    assert script.requested_gpus(SlurmSpec(gres="gpu:h200:4"), 1) == 4
    assert script.requested_gpus(SlurmSpec(), 0) == 0


def test_gpu_hours_and_the_cap_count_nodes_times_gpus_over_every_attempt() -> None:
    """The executor charges an attempt nodes × GPUs per node; the store's attempts carry it, and the cap's
    sum runs over every attempt: two 1-hour attempts of a 2-node × 8-GPU job are 32 GPU-hours, not 8."""
    from babysit.core import progress
    from babysit.core.spec.run_toml import RunSpec
    from babysit.db.store import Attempt
    from babysit.executors.local import LocalExecutor
    from babysit.executors.slurm import SlurmExecutor

    def spec(gpus: tuple[int, ...], slurm: SlurmSpec) -> RunSpec:
        return RunSpec(name="r", command=("true",), log=None, spec_file=Path("r.toml"), workdir=Path("."),
                       checkpoints=Path("ckpt"), gpus=gpus, executor="slurm", slurm=slurm)

    charged = SlurmExecutor().charged_gpus(spec(tuple(range(8)), SlurmSpec(nodes=2)))
    assert charged == 16
    assert SlurmExecutor().charged_gpus(spec((0,), SlurmSpec(nodes=3, gres="gpu:h200:4"))) == 12
    assert SlurmExecutor().charged_gpus(spec((0,), SlurmSpec(nodes=2, gres=""))) == 0  # asks for no GPU
    assert LocalExecutor().charged_gpus(spec(tuple(range(8)), SlurmSpec(nodes=2))) == 8  # one box: its own GPUs

    def attempt(n: int, start: float, end: float | None) -> Attempt:
        return Attempt(n, "r", n, "default", (), "slurm", charged, f"/a/{n}", "ended", None, None, str(n), start,
                       start, end, 0, None, "crashed", {})

    attempts = [attempt(1, 0.0, 3600.0), attempt(2, 7200.0, None)]
    assert progress.gpu_hours_used(attempts, now=10800.0) == pytest.approx(32.0)


def test_a_whitespace_option_is_double_quoted_and_a_line_break_refused() -> None:
    text = script.render(request(attempt_dir="/st dir/a"))
    assert '#SBATCH --output="/st dir/a/stdout.log"' in text
    with pytest.raises(ValueError, match="line break"):
        script.directives(request(slurm=SlurmSpec(sbatch_options=("--comment=a\n#SBATCH --x",))))


def test_torchrun_only_for_several_gpus_per_node_or_nodes_unless_forced() -> None:
    assert not script.uses_torchrun(SlurmSpec(), 1)
    assert script.uses_torchrun(SlurmSpec(), 2)
    assert script.uses_torchrun(SlurmSpec(nodes=2), 1)
    assert not script.uses_torchrun(SlurmSpec(torchrun=False), 8)
    assert script.uses_torchrun(SlurmSpec(torchrun=True), 1)


def test_torchrun_keeps_the_runs_interpreter_and_never_sees_the_runs_words() -> None:
    argv = script.torchrun_argv(["/venv/bin/python", "-m", "trainer", "--log", "x y"], 2, 8)
    assert argv[:3] == ["/venv/bin/python", "-m", "torch.distributed.run"]
    assert argv[argv.index("--nnodes") + 1] == "2" and argv[argv.index("--nproc-per-node") + 1] == "8"
    assert argv[argv.index("--rdzv-backend") + 1] == "c10d"
    assert argv[-4:] == ["--no-python", "bash", "-c", 'eval "exec $BABYSIT_RANK_ARGV"']
    assert "--log" not in argv and "trainer" not in argv
    assert script.torchrun_argv(["python3", "train.py", "-a"], 1, 2)[:3] == ["python3", "-m", "torch.distributed.run"]
    assert script.torchrun_argv(["./run.sh", "x"], 1, 2)[0] == "torchrun"


def test_each_torchrun_worker_execs_the_runs_exact_argv(tmp_path: Path) -> None:
    """The worker command (`bash -c 'eval "exec $BABYSIT_RANK_ARGV"'`) run by a real shell with the script's
    export: the program gets every word as written, the nasty ones too."""
    text = script.render(request(argv=(sys.executable, "-c", "import json, sys; print(json.dumps(sys.argv[1:]))",
                                       *NASTY), slurm=SlurmSpec(nodes=2)))
    export = next(ln for ln in text.splitlines() if ln.startswith("export BABYSIT_RANK_ARGV="))
    out = subprocess.run(["bash", "-c", f"{export}\n{' '.join(shlex.quote(w) for w in script.RANK_EXEC)}"],
                         capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == NASTY


def test_torchrun_line_runs_under_srun_with_the_head_node_endpoint() -> None:
    text = script.render(request(argv=("python", "-m", "trainer", "$SLURM_JOB_ID"),
                                 slurm=SlurmSpec(nodes=2, gpus_per_node=4)))
    line = next(ln for ln in text.splitlines() if ln.startswith("srun --kill-on-bad-exit"))
    assert '--rdzv-endpoint "$BABYSIT_RDZV"' in line and '--rdzv-id "$SLURM_JOB_ID"' in line
    assert line.endswith("""--no-python bash -c 'eval "exec $BABYSIT_RANK_ARGV"' &""")
    assert "trainer" not in line  # the run's words reach the workers through $BABYSIT_RANK_ARGV alone
    assert 'export BABYSIT_RDZV="${babysit_addr:-$babysit_head}:${BABYSIT_RDZV_PORT:-29500}"' in text


def test_the_rendezvous_endpoint_is_the_head_nodes_address_as_slurm_knows_it(tmp_path: Path) -> None:
    """A node name need not resolve (several slurmd on one host, or a cluster's own names): the endpoint is
    the head's NodeAddr from `scontrol show node`, else its name. A stand-in scontrol answers here."""
    text = script.render(request(slurm=SlurmSpec(nodes=2)))
    setup = [ln for ln in text.splitlines() if ln.startswith(("babysit_head=", "babysit_addr=", "export BABYSIT_RDZV"))]
    fake = tmp_path / "scontrol"
    fake.write_text('#!/bin/bash\nif [ "$2" = hostnames ]; then echo n2; echo n3; '
                    'else echo "NodeName=n2 Arch=x86_64 NodeAddr=10.0.0.2 NodeHostName=vm Port=17002"; fi\n')
    fake.chmod(0o755)
    env = {"PATH": f"{tmp_path}:/usr/bin:/bin", "SLURM_JOB_NODELIST": "n[2-3]"}
    out = subprocess.run(["bash", "-c", "\n".join([*setup, 'echo "$BABYSIT_RDZV"'])], env=env,
                         capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "10.0.0.2:29500"
    fake.write_text("#!/bin/bash\n[ \"$2\" = hostnames ] && echo n2\nexit 0\n")  # no NodeAddr: the name
    out = subprocess.run(["bash", "-c", "\n".join([*setup, 'echo "$BABYSIT_RDZV"'])], env=env,
                         capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "n2:29500"


def test_script_waits_through_a_term_and_exits_with_the_childs_code(tmp_path: Path) -> None:
    """The shell must outlive the trainer's checkpoint: TERM to the whole group, the shell still reports 10."""
    child = "import signal,sys,time\nsignal.signal(signal.SIGTERM, lambda *a: (time.sleep(0.5), sys.exit(10)))\n" \
            "print('ready', flush=True)\ntime.sleep(30)"
    req = request(attempt_dir=str(tmp_path), workdir=str(tmp_path), argv=("python3", "-c", child), env=())
    path = tmp_path / "job.sh"
    path.write_text(script.render(req))
    proc = subprocess.Popen(["bash", str(path)], stdout=subprocess.PIPE, text=True, start_new_session=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    import os

    os.killpg(proc.pid, signal.SIGTERM)
    assert proc.wait(timeout=10) == 10
    assert json.loads((tmp_path / "exit.json").read_text())["exit_code"] == 10


LEADER = """
import os, signal, subprocess, sys, time
# a trainer and a DataLoader-like worker in its process group; each notes in argv[1] the signals it gets
worker = subprocess.Popen([sys.executable, "-c", "import signal, sys, time\\n"
    "signal.signal(signal.SIGUSR1, lambda n, f: (open(sys.argv[1], 'a').write('worker\\\\n'), sys.exit(1)))\\n"
    "signal.signal(signal.SIGINT, lambda n, f: (open(sys.argv[1], 'a').write('worker\\\\n'), sys.exit(1)))\\n"
    "time.sleep(30)", sys.argv[1]])
def stop(n, _):
    open(sys.argv[1], "a").write(signal.Signals(n).name + "\\n")
    worker.kill()
    sys.exit(10)
signal.signal(signal.SIGUSR1, stop)
if sys.argv[2] == "handle-int":
    signal.signal(signal.SIGINT, stop)
print("ready", flush=True)
try:
    time.sleep(30)
except KeyboardInterrupt:  # Python's own SIGINT handler, there only if SIGINT was not ignored at start
    open(sys.argv[1], "a").write("KeyboardInterrupt\\n")
    worker.kill()
    sys.exit(10)
"""


@pytest.mark.parametrize(("sig", "mode", "seen"), [
    (signal.SIGUSR1, "handle-int", "SIGUSR1"),
    (signal.SIGINT, "handle-int", "SIGINT"),
    (signal.SIGINT, "python-default", "KeyboardInterrupt"),
])
def test_a_stop_to_the_shell_alone_reaches_the_trainer_alone(tmp_path: Path, sig: int, mode: str, seen: str) -> None:
    """`scancel --batch` signals the batch shell only: it passes the signal to the trainer, not its workers."""
    notes = tmp_path / "notes"
    req = request(attempt_dir=str(tmp_path), workdir=str(tmp_path), argv=("python3", "-c", LEADER, str(notes), mode),
                  env=())
    assert script.stop_scope(req.slurm, req.n_gpus) == "batch"
    path = tmp_path / "job.sh"
    path.write_text(script.render(req))
    proc = subprocess.Popen(["bash", str(path)], stdout=subprocess.PIPE, text=True, start_new_session=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    proc.send_signal(sig)  # the shell's pid alone, as slurmstepd does for --batch
    assert proc.wait(timeout=30) == 10  # a bound for a hang, not a timing: CI runs it beside the slow tests
    assert notes.read_text().splitlines() == [seen], "the trainer got it; its worker did not"
    assert json.loads((tmp_path / "exit.json").read_text())["exit_code"] == 10


def test_under_srun_every_stop_signal_is_left_to_scancel_full_and_the_shell_survives_it() -> None:
    torchrun = SlurmSpec(nodes=2, gpus_per_node=4)
    assert script.stop_scope(torchrun, 4) == "full" and script.stop_scope(SlurmSpec(), 1) == "batch"
    text = script.render(request(slurm=torchrun))
    assert "trap ':' TERM INT HUP USR1 USR2" in text and "babysit_stop" not in text


# -- state parsing --------------------------------------------------------------------------------------

SCONTROL = ("JobId=42 JobName=babysit-r-1-ab UserId=u(1) JobState=PENDING Reason=Resources Dependency=(null) "
            "ExitCode=0:0 RunTime=00:00:00 SubmitTime=2026-01-02T03:04:05 StartTime=2026-01-02T04:00:00 "
            "EndTime=Unknown NodeList=(null) TRES=cpu=8,mem=64G,node=1,billing=8,gres/gpu=4 "
            "Command=/a dir/job.sbatch WorkDir=/a dir")


def test_scontrol_line_parses_values_with_spaces_and_a_pending_estimate_is_not_a_start() -> None:
    job = st.from_scontrol("42", SCONTROL, 1.0)
    assert job is not None
    assert (job.state, job.reason, job.alloc_gpus, job.end) == ("PENDING", "Resources", 4, None)
    assert not job.started  # StartTime of a PENDING job is the scheduler's guess
    assert st.parse_kv(SCONTROL)["Command"] == "/a dir/job.sbatch"
    assert st.from_scontrol("43", SCONTROL, 1.0) is None


@pytest.mark.parametrize(("text", "want"), [
    ("0:0", (0, None)), ("3:0", (3, None)), ("0:9", (0, 9)), ("10:15", (10, 15)), ("", (None, None)),
    ("x:y", (None, None)), ("137", (137, None)),
])
def test_exit_code_n_colon_s(text: str, want: tuple[int | None, int | None]) -> None:
    assert st.parse_exit_code(text) == want


@pytest.mark.parametrize(("tres", "gpus"), [
    ("cpu=8,mem=64G,node=1,billing=8,gres/gpu=4", 4),
    ("cpu=8,gres/gpu=8,gres/gpu:h200=8", 8),
    ("cpu=8,gres/gpu:a100=2,gres/gpu:h200=2", 4),
    ("cpu=1,mem=512M,node=1,billing=1", None),
    ("", None),
])
def test_alloc_tres_gpu_count(tres: str, gpus: int | None) -> None:
    assert st.gpus_from_tres(tres) == gpus


def test_base_state_strips_cancelled_by_and_plus() -> None:
    assert st.base_state("CANCELLED by 1000") == "CANCELLED"
    assert st.base_state("COMPLETED+") == "COMPLETED"


def test_sacct_takes_the_allocation_line_and_the_last_run_of_a_requeued_job() -> None:
    text = ("42|PREEMPTED|0:15|2026-01-02T03:00:00|2026-01-02T03:30:00|cpu=8,gres/gpu=2|n1|None\n"
            "42|COMPLETED|0:0|2026-01-02T04:00:00|2026-01-02T05:00:00|cpu=8,gres/gpu=2|n2|None\n")
    job = st.from_sacct("42", text, 1.0)
    assert job is not None and job.state == "COMPLETED" and job.alloc_gpus == 2 and job.nodes == "n2"
    assert job.end is not None and job.start is not None and job.end - job.start == 3600


def test_jobcomp_line() -> None:
    text = ("JobId=41 UserId=root(0) Name=x JobState=COMPLETED ExitCode=0:0\n"
            "JobId=42 UserId=root(0) GroupId=root(0) Name=babysit-r-1-ab JobState=OUT_OF_MEMORY Partition=debug "
            "StartTime=2026-01-02T03:00:00 EndTime=2026-01-02T03:00:10 NodeList=vm Tres=cpu=1,gres/gpu=1 "
            "ExitCode=0:125\n")
    job = st.from_jobcomp("42", text, 1.0)
    assert job is not None and (job.state, job.exit_code, job.exit_signal, job.alloc_gpus) == ("OUT_OF_MEMORY", 0,
                                                                                               125, 1)


# -- the state → exit mapping, read by the real classifier -----------------------------------------------


def _classify(job: st.JobState, tail: str = "", stop: bool = False) -> str:
    info = st.exit_info(job, tail)  # read as babysit/run/run_exit.py reads it
    return classify_exit(ExitFacts(exit_code=info.exit_code, signal=info.signal, stderr_tail=info.stderr_tail,
                         last_records=[], rules=(), stop_requested=stop,
                         node_fail=info.state if info.state in st.MACHINE_LOST else None,
                         preempted=info.state == "PREEMPTED")).outcome


def _job(state: str, code: int | None = 0, sig: int | None = None) -> st.JobState:
    return st.JobState(job_id="7", state=state, source="scontrol", exit_code=code, exit_signal=sig, start=1.0,
                       end=2.0, seen_at=3.0)


@pytest.mark.parametrize(("state", "code", "sig", "stop", "outcome"), [
    ("COMPLETED", 0, None, False, "completed"),
    ("FAILED", 3, None, False, "crashed"),
    ("FAILED", 12, None, False, "oom"),
    ("OUT_OF_MEMORY", 0, 125, False, "oom"),
    ("TIMEOUT", 10, None, False, "crashed"),  # the trainer's clean stop on SIGTERM is no clean end here
    ("NODE_FAIL", 0, None, False, "node-lost"),  # the machine's fault
    ("BOOT_FAIL", 0, None, False, "node-lost"),
    ("PREEMPTED", 0, 15, False, "preempted"),  # the scheduler's, not the trainer's: the run goes on
    ("PREEMPTED", 10, None, True, "stopped"),  # babysit's own stop came first
    ("CANCELLED", 10, None, True, "stopped"),  # babysit's own stop
    ("CANCELLED", 0, 15, True, "stopped"),
    ("CANCELLED", 0, None, True, "stopped"),  # cancelled while PENDING: ExitCode 0:0 is no success
    ("CANCELLED", 0, None, False, "crashed"),
    ("VANISHED", None, None, False, "crashed"),
])
def test_state_mapping_table(state: str, code: int | None, sig: int | None, stop: bool, outcome: str) -> None:
    assert _classify(_job(state, code, sig), stop=stop) == outcome


def test_scheduler_ends_name_the_state_in_the_tail_and_note() -> None:
    info = st.exit_info(_job("TIMEOUT", 10), "step 5\n")
    assert "TIMEOUT" in info.stderr_tail.splitlines()[-1] and info.state == "TIMEOUT" and "TIMEOUT" in info.note
    assert (info.exit_code, info.signal) == (None, None)


def test_a_vanished_job_says_what_was_last_seen() -> None:
    last = st.JobState(job_id="7", state="RUNNING", source="scontrol", start=5.0, seen_at=9.0)
    gone = st.vanished("7", last, 20.0)
    assert gone.terminal and gone.state == st.VANISHED and "last seen RUNNING" in (gone.reason or "")
    assert gone.start == 5.0 and gone.end == 9.0


def test_exit_file_is_the_end_of_a_forgotten_job() -> None:
    job = st.from_exit_file("7", {"exit_code": 143, "started_at": 1.5, "ended_at": 4.0}, None, 9.0)
    assert (job.state, job.exit_code, job.exit_signal, job.start, job.end) == ("FAILED", 143, 15, 1.5, 4.0)


def test_status_note_shows_the_pending_reason() -> None:
    pending = st.JobState(job_id="9", state="PENDING", source="scontrol", reason="BeginTime")
    assert st.status_note(pending) == "Slurm job 9 PENDING (BeginTime)"
    assert st.status_note(_job("COMPLETED")) is None
    requeued = st.JobState(job_id="9", state="RUNNING", source="scontrol", nodes="n2", restarts=1)
    assert st.status_note(requeued) == "Slurm job 9 RUNNING on n2, requeued 1×"


# -- sidecar reader -------------------------------------------------------------------------------------


def _record(host: str, ts: float, gpus: list[dict], available: bool = True) -> dict:
    return {"ts": ts, "host": host, "gpu": {"available": available, "reason": None if available else "no driver",
                                           "gpus": gpus}}


def test_sidecar_maps_the_runs_indices_onto_the_jobs_gpus_and_drops_the_jobs_own_processes() -> None:
    g = [{"index": 4, "util_pct": 90, "processes": [{"pid": 1, "name": "mine", "job": True},
                                                    {"pid": 2, "name": "intruder", "job": False}]},
         {"index": 5, "util_pct": 80, "processes": []}]
    view = view_from_records([_record("n1", 100.0, g)], [0, 1], now=101.0, stale_after=60)
    assert view.available and [r.index for r in view.gpus] == [0, 1]
    reading = view.gpu(0)
    assert reading is not None and reading.util_pct == 90 and [p.name for p in reading.processes] == ["intruder"]


def test_a_silent_node_is_waited_for_while_the_job_starts_then_not_measured() -> None:
    """n2's sidecar has not written: while the job is younger than stale_after the view is pending (the
    guards wait; a queued job's too), then it is unavailable naming n2, never n1's GPUs alone."""
    from babysit.core.guards import live
    from babysit.core.spec.run_toml import GuardsSpec
    from tests.test_guards import facts

    n1 = [_record("n1", 99.0, [{"index": 0, "processes": []}])]
    young = view_from_records(n1, [0], now=100.0, stale_after=60, nodes=("n1", "n2"), started_at=90.0)
    queued = view_from_records([], [0], now=100.0, stale_after=60, nodes=(), started_at=None)
    assert young.pending and queued.pending and "first reading on n2" in (young.reason or "")
    assert live(GuardsSpec(), facts(view=young)) == ()
    late = view_from_records(n1, [0], now=200.0, stale_after=60, nodes=("n1", "n2"), started_at=90.0)
    assert not late.available and not late.pending and late.reason.startswith("no probe sidecar reading on n2 110 s")
    (warn,) = live(GuardsSpec(), facts(view=late))
    assert (warn.kind, warn.incident) == ("warn", "gpu-unseen")
    both = view_from_records([*n1, _record("n2", 99.0, [{"index": 0, "processes": []}])], [0], now=200.0,
                             stale_after=600, nodes=("n1", "n2"), started_at=90.0)
    assert both.available and both.nodes == ("n1", "n2")


def test_sidecar_silence_and_absence_are_not_measured_never_fine() -> None:
    assert not view_from_records([], [0], now=100.0, stale_after=60, started_at=1.0).available
    stale = view_from_records([_record("n1", 0.0, [])], [0], now=100.0, stale_after=60)
    assert not stale.available and "silent" in (stale.reason or "")
    nodriver = view_from_records([_record("n1", 99.0, [], available=False)], [0], now=100.0, stale_after=60)
    assert not nodriver.available and "no driver" in (nodriver.reason or "")


def test_sidecar_probe_reads_the_newest_complete_line_of_each_node(tmp_path: Path) -> None:
    now = time.time()
    for host, util in (("n2", 20), ("n1", 10)):
        with open(tmp_path / f"probe-{host}.jsonl", "w") as f:
            f.write(json.dumps(_record(host, now - 5, [{"index": 0, "util_pct": 1}])) + "\n")
            f.write(json.dumps(_record(host, now, [{"index": 0, "util_pct": util}])) + "\n")
            f.write('{"ts": 1, "partial')
    view = SidecarGpuProbe(tmp_path).read([0, 1])
    assert [r.util_pct for r in view.gpus] == [10, 20]  # nodes in host-name order
    assert [(r.node, r.index) for r in view.gpus] == [("n1", 0), ("n2", 0)]  # each node's GPU 0: the run's GPU 0


def test_sidecar_view_of_a_job_across_nodes_holds_every_nodes_gpus_and_health_signals() -> None:
    """2 nodes × 2 GPUs: the run's GPUs 0 and 1 on each node, named by node; a holder on n2 stays n2's; an
    NVML signal written by the sidecar reads back as the signal it was."""
    from babysit.core.readings import GpuReading, GpuSignal, GpuView
    from babysit.probes.remote import gpu_record, keep_signals

    xid = GpuSignal("xid", code=79, at=5.0, text="xid 79")
    _, seen = keep_signals({}, GpuView(True, None, (GpuReading(3, "H100", "GPU-b", 90.0, 4, 1, 2, (), ("xid 79",),
                                                               signals=(xid,)),)))
    later, seen = keep_signals(seen, GpuView(True, None, (GpuReading(3, "H100", "GPU-b", 91.0, 4, 1, 2, (), ()),)))
    assert later.gpus[0].signals == (xid,)  # an event seen once stays in every later record of the job
    records = [_record("n1", 99.0, [{"index": 6, "processes": []}, {"index": 7, "processes": []}]),
               _record("n2", 99.0, [gpu_record(later, frozenset())["gpus"][0],
                                    {"index": 4, "processes": [{"pid": 9, "name": "intruder", "job": False}]}])]
    view = view_from_records(records, [0, 1], now=100.0, stale_after=60)
    assert [(g.node, g.index) for g in view.gpus] == [("n1", 0), ("n1", 1), ("n2", 0), ("n2", 1)]
    assert view.nodes == ("n1", "n2") and view.on("n2").gpu(0).signals == (xid,)
    assert [p.name for p in view.on("n2").gpu(1).processes] == ["intruder"] and not view.on("n1").gpu(1).processes


@pytest.mark.parametrize(("visible", "env", "want"), [
    ([0, 1, 2, 3], {"SLURM_JOB_GPUS": "2,3"}, (2, 3)),
    ([0, 1], {"SLURM_JOB_GPUS": "6,7"}, (0, 1)),  # ConstrainDevices: NVML renumbers
    ([0, 1, 2], {"CUDA_VISIBLE_DEVICES": "1"}, (1,)),
    ([0, 1], {"CUDA_VISIBLE_DEVICES": "GPU-abc"}, (0, 1)),
    ([0, 1], {}, (0, 1)),
])
def test_sidecar_picks_the_jobs_gpus(visible: list[int], env: dict[str, str], want: tuple[int, ...]) -> None:
    assert choose_gpus(visible, env) == want


# -- a lost node ----------------------------------------------------------------------------------------


def test_sinfo_names_the_lost_nodes_down_drained_or_not_responding() -> None:
    text = "n1 allocated\nn2 down*\nn3 idle\nn4 drained\nn5 idle*\nn6 mixed\n"
    assert st.lost_nodes(text) == ("n2", "n4", "n5")
    assert st.lost_nodes("") == ()


def test_a_node_fail_is_the_machines_fault_whatever_the_exit_and_stderr_say() -> None:
    cls = classify_exit(ExitFacts(exit_code=None, signal=None, stderr_tail="RuntimeError: Connection closed by peer\n"
                        "babysit: Slurm ended job 7 NODE_FAIL: a node of the job failed", last_records=[], rules=[],
                        stop_requested=False, lost_nodes=("n2",), node_fail="NODE_FAIL"))
    assert cls.outcome == "node-lost" and cls.detail["lost_nodes"] == ["n2"]
    assert cls.summary.startswith("node lost, the machine's fault: Slurm lost n2 under the job (NODE_FAIL)")
    unknown = classify_exit(ExitFacts(exit_code=None, signal=None, stderr_tail="", last_records=[], rules=[],
                            stop_requested=False, node_fail="NODE_FAIL"))
    assert unknown.outcome == "node-lost" and "Slurm lost a node of the job" in unknown.summary
    timeout = classify_exit(ExitFacts(exit_code=None, signal=None, stderr_tail="babysit: Slurm ended job 7 TIMEOUT",
                            last_records=[], rules=[], stop_requested=False))
    assert timeout.outcome == "crashed"  # not a node's fault


def test_the_next_attempt_excludes_the_nodes_earlier_attempts_lost(tmp_path: Path) -> None:
    from babysit.executors.slurm_nodes import lost_earlier as excluded_nodes

    run = tmp_path / "runs" / "r"
    for n, lost in ((1, ["n2"]), (2, ["n4", "n2"]), (4, ["n9"])):
        (run / f"attempt-{n}").mkdir(parents=True)
        (run / f"attempt-{n}" / "lost_nodes.json").write_text(json.dumps({"nodes": lost}))
    assert excluded_nodes(run / "attempt-3") == ("n2", "n4")  # attempt 4's loss is not before attempt 3
    assert excluded_nodes(run / "attempt-1") == ()
    opts = script.directives(request(exclude=("n2", "n4"), slurm=SlurmSpec(nodes=2)))
    assert "--exclude=n2,n4" in opts and opts.index("--exclude=n2,n4") == opts.index("--nodes=2") + 1
    assert not any(o.startswith("--exclude") for o in script.directives(request()))


# -- the time limit ---------------------------------------------------------------------------------------


def test_a_time_limit_asks_slurm_to_warn_the_batch_shell_which_stops_the_trainer() -> None:
    text = script.render(request(slurm=SlurmSpec(time_limit="02:00:00", time_limit_warning_seconds=600),
                                 stop_signal="SIGUSR1"))
    assert "#SBATCH --signal=B:URG@600" in text
    assert "trap babysit_timelimit URG" in text and 'kill -s USR1 "$babysit_child"' in text
    assert "#SBATCH --signal" not in script.render(request())  # no time limit: nothing to warn of


def test_a_time_limit_stop_is_chained_only_when_the_trainer_saved() -> None:
    saved = classify_exit(ExitFacts(exit_code=10, signal=None, stderr_tail="stopped on SIGTERM; checkpoint saved",
                          last_records=[], rules=[], stop_requested=False, time_limit=True))
    assert saved.outcome == "time-limit"
    died = classify_exit(ExitFacts(exit_code=None, signal=None, stderr_tail="babysit: Slurm ended job 3 TIMEOUT",
                         last_records=[], rules=[], stop_requested=False, time_limit=True))
    assert died.outcome == "crashed"  # killed before it saved: a chain would not move forward


def test_a_time_limit_link_continues_the_run_resumed_and_costs_no_attempt() -> None:
    from babysit.core.retry import PastAttempt, next_attempt
    from babysit.core.spec.run_toml import RetrySpec, RunSpec

    spec = RunSpec(name="r", command=("t",), log=None, spec_file=Path("r.toml"), workdir=Path("."),
                   checkpoints=Path("c"), retry=RetrySpec(max_attempts=1, on=()))
    links = [PastAttempt(n, "default", "time-limit") for n in (1, 2, 3)]
    decision = next_attempt(links, spec)
    assert decision.retry and decision.n == 4 and decision.resume  # retry.on empty, max_attempts 1: still on
    crashed = next_attempt([*links, PastAttempt(4, "default", "crashed")], spec)
    assert not crashed.retry  # the links cost no attempt, but a crash is still judged by retry.on


def test_the_warning_comes_five_minutes_or_a_tenth_of_the_limit_before_it(tmp_path: Path) -> None:
    from babysit.core.errors import BabysitError
    from babysit.core.spec.run_toml import load_spec
    from babysit.core.spec.slurm import slurm_seconds

    assert [slurm_seconds(x) for x in ("5", "05:30", "01:00:00", "1-02", "1-02:03:04")] == [300, 330, 3600, 93600,
                                                                                           93784]
    assert SlurmSpec(time_limit="12:00:00").warning_seconds() == 300
    assert SlurmSpec(time_limit="00:10:00").warning_seconds() == 60  # a tenth of a short limit
    assert SlurmSpec(time_limit="00:10:00", time_limit_warning_seconds=120).warning_seconds() == 120
    assert SlurmSpec().warning_seconds() is None
    spec = tmp_path / "r.toml"
    spec.write_text('[run]\nname = "r"\ncommand = ["t"]\nlog = "l.jsonl"\nexecutor = "slurm"\n'
                    '[slurm]\ntime_limit = "00:01:00"\ntime_limit_warning_seconds = 60\n')
    with pytest.raises(BabysitError, match=r"slurm.time_limit_warning_seconds: expected a number of seconds under "
                                           r"time_limit \(00:01:00\), got 60"):
        load_spec(spec)


# -- requeues and preemption ------------------------------------------------------------------------------


def _scontrol(state: str, restarts: int, start: str, nodes: str = "n1") -> str:
    return (f"JobId=42 JobName=j JobState={state} Reason=None Requeue=1 Restarts={restarts} BatchFlag=1 "
            f"ExitCode=0:0 StartTime={start} EndTime=Unknown NodeList={nodes if state == 'RUNNING' else '(null)'}")


def test_a_requeued_job_keeps_its_earlier_run_from_its_start_to_when_the_requeue_was_seen() -> None:
    """Slurm forgets a requeued job's StartTime (a PENDING job's is the estimate): the earlier run is the
    last start babysit saw to the look that saw the restart count go up."""
    t0 = st.parse_time("2026-12-07T02:56:47") or 0.0
    ran = st.from_scontrol("42", _scontrol("RUNNING", 0, "2026-12-07T02:56:47"), t0 + 20)
    assert ran is not None and ran.restarts == 0 and ran.started
    queued = st.from_scontrol("42", _scontrol("PENDING", 1, "2026-12-07T02:59:10"), t0 + 25)
    assert queued is not None and queued.restarts == 1 and not queued.started
    earlier = st.requeued_run(ran, queued)
    assert earlier == {"restart": 1, "start": t0, "end": t0 + 25, "nodes": "n1", "state": "PENDING"}
    again = st.from_scontrol("42", _scontrol("RUNNING", 1, "2026-12-07T02:57:35", "n2"), t0 + 60)
    assert again is not None and st.requeued_run(queued, again) is None  # the same restart, seen running
    # a requeue and a restart between two looks: the earlier run ends no later than the new start
    missed = st.requeued_run(ran, again)
    assert missed is not None and missed["end"] == again.start == t0 + 48 and missed["nodes"] == "n1"
    assert st.requeued_run(None, queued) is None and st.requeued_run(ran, ran) is None
    never = st.from_scontrol("42", _scontrol("PENDING", 0, "2026-12-07T02:56:47"), t0)
    assert st.requeued_run(never, queued) is None  # it had never run: nothing to count
    assert st.JobState.from_dict(queued.to_dict()) == queued  # kept in state.json across a daemon restart


def test_a_requeued_attempts_earlier_runs_count_in_its_gpu_hours() -> None:
    """started_at follows the job's new start after a requeue; the runs before it count all the same."""
    from babysit.core import progress
    from babysit.db.store import Attempt

    live = Attempt(1, "r", 1, "default", (), "slurm", 16, "/a/1", "running", None, None, "42", 0.0, 7200.0, None,
                   None, None, None, {"requeued_seconds": 1800.0})
    assert progress.gpu_hours_used([live], now=10800.0) == pytest.approx(16 * 1.5)  # 1 h now + 0.5 h before
    waiting = Attempt(1, "r", 1, "default", (), "slurm", 16, "/a/1", "running", None, None, "42", 0.0, None, None,
                      None, None, None, {"requeued_seconds": 1800.0})
    assert progress.gpu_hours_used([waiting], now=10800.0) == pytest.approx(8.0)


def test_a_rerun_after_a_requeue_resumes_and_forgets_the_earlier_runs_end(tmp_path: Path) -> None:
    """Slurm reruns the same batch script after a requeue, with SLURM_RESTART_COUNT up: the trainer gets the
    run's resume args, and the exit file of the run before is not taken for this one's end."""
    from babysit.core.retry import rerun_argv
    from babysit.core.spec.run_toml import RetrySpec, RunSpec

    spec = RunSpec(name="r", command=("t",), log=None, spec_file=Path("r.toml"), workdir=Path("."),
                   checkpoints=Path("c"), retry=RetrySpec(resume="latest-checkpoint", resume_args=("--from", "{name}")))
    argv = ("python3", "-c", "import sys; print(' '.join(sys.argv[1:]))", "a b")
    assert rerun_argv(spec, argv, 2) == (*argv, "--from", "r")
    assert rerun_argv(spec, (*argv, "--from", "r"), 2) == ()  # it resumes already
    assert rerun_argv(RunSpec(name="r", command=("t",), log=None, spec_file=Path("r.toml"), workdir=Path("."),
                              checkpoints=Path("c")), argv, 2) == ()  # retry.resume = "fresh": run it again
    path = tmp_path / "job.sh"
    path.write_text(script.render(request(attempt_dir=str(tmp_path), workdir=str(tmp_path), argv=argv, env=(),
                                          restart_argv=rerun_argv(spec, argv, 2))))
    for restarts, want in (("0", "a b"), ("1", "a b --from r")):
        (tmp_path / "exit.json").write_text('{"exit_code": 10}')
        out = subprocess.run(["bash", str(path)], capture_output=True, text=True, timeout=30,
                             env={**os.environ, "SLURM_RESTART_COUNT": restarts})
        assert out.stdout.strip() == want, out.stderr
    torch = script.render(request(slurm=SlurmSpec(nodes=2), argv=argv, restart_argv=rerun_argv(spec, argv, 2)))
    assert f'[ "${{SLURM_RESTART_COUNT:-0}}" -gt 0 ] && export {script.RANK_ARGV_ENV}=' in torch


def test_a_preempted_attempt_continues_resumed_whatever_retry_on_says_and_costs_no_attempt() -> None:
    from babysit.core.retry import PastAttempt, next_attempt
    from babysit.core.spec.run_toml import RetrySpec, RunSpec

    spec = RunSpec(name="r", command=("t",), log=None, spec_file=Path("r.toml"), workdir=Path("."),
                   checkpoints=Path("c"), retry=RetrySpec(max_attempts=1, on=()))
    decision = next_attempt([PastAttempt(1, "default", "preempted")], spec)
    assert decision.retry and decision.resume and decision.n == 2
    assert "preempted by the scheduler, not by a fault of the trainer's" in decision.reason
    after = next_attempt([PastAttempt(1, "default", "preempted"), PastAttempt(2, "default", "crashed")],
                         replace(spec, retry=RetrySpec(max_attempts=1, on=("crashed",))))
    assert not after.retry and "no attempts left" in after.reason  # the preemption cost no attempt; max is 1


def test_a_lost_node_shares_the_machine_fault_budget_and_needs_retry_on() -> None:
    from babysit.core.retry import PastAttempt, next_attempt
    from babysit.core.spec.run_toml import RetrySpec, RunSpec

    def spec(on: tuple[str, ...]) -> RunSpec:
        return RunSpec(name="r", command=("t",), log=None, spec_file=Path("r.toml"), workdir=Path("."),
                       checkpoints=Path("c"), retry=RetrySpec(max_attempts=1, on=on, gpu_fault_max=2))

    lost = [PastAttempt(1, "default", "node-lost")]
    assert not next_attempt(lost, spec(("gpu-fault",))).retry  # a lost node is no GPU fault
    first = next_attempt(lost, spec(("node-lost",)))
    assert first.retry and "node-lost retry 1 of 2" in first.reason
    three = [PastAttempt(1, "default", "gpu-fault"), PastAttempt(2, "default", "node-lost"),
             PastAttempt(3, "default", "node-lost")]
    out = next_attempt(three, spec(("gpu-fault", "node-lost")))
    assert not out.retry and "no node-lost retries left (retry.gpu_fault_max = 2)" in out.reason


def test_a_quarantined_node_is_excluded_from_every_runs_next_submission_until_released(tmp_path: Path) -> None:
    from babysit.executors import slurm_nodes

    adir = tmp_path / "runs" / "r" / "attempt-2"  # what attempt 2 of run r is submitted with --exclude of
    assert slurm_nodes.excluded(tmp_path, adir) == ()
    assert slurm_nodes.quarantine(tmp_path, ["n5"], "lost under Slurm job 7 (NODE_FAIL)", 1.0, run="a") == ["n5"]
    assert slurm_nodes.quarantine(tmp_path, ["n5", "n2"], "by hand", 2.0) == ["n2"]  # n5 keeps its first reason
    (adir.parent / "attempt-1").mkdir(parents=True)
    (adir.parent / "attempt-1" / "lost_nodes.json").write_text(json.dumps({"nodes": ["n7"]}))
    assert slurm_nodes.excluded(tmp_path, adir) == ("n2", "n5", "n7")  # every run's, and its own run's
    assert slurm_nodes.lines(slurm_nodes.quarantined(tmp_path))[0].startswith(
        "n5: quarantined 1970-01-01 00:00 UTC by babysit: lost under Slurm job 7 (NODE_FAIL)")
    assert slurm_nodes.release(tmp_path, "n5") and not slurm_nodes.release(tmp_path, "n5")
    assert slurm_nodes.excluded(tmp_path, adir) == ("n2", "n7")


def test_babysit_node_lists_quarantines_and_releases_a_node_and_says_what_to_do_on_a_bad_name(
        tmp_path: Path) -> None:
    from babysit.executors.slurm_nodes import excluded

    (tmp_path / "babysit.toml").write_text("")

    def babysit(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "babysit", "node", *args, "--registry",
                               str(tmp_path / "babysit.toml")], capture_output=True, text=True, timeout=60)

    assert babysit("list").stdout.strip() == "no node is quarantined"
    got = babysit("quarantine", "n5", "--reason", "fans failing")
    assert got.returncode == 0 and "n5 quarantined: no run is submitted to it" in got.stdout
    assert excluded(tmp_path / ".babysit", tmp_path / "attempt-1") == ("n5",)  # what the next sbatch excludes
    assert "n5: quarantined " in babysit("list").stdout and "fans failing" in babysit("list").stdout
    bad = babysit("quarantine", "n[1-2]")
    assert bad.returncode == 2 and "expected one Slurm node name" in bad.stderr and "HINT:" in bad.stderr
    unknown = babysit("release", "n4")
    assert unknown.returncode == 2 and "n4 is not quarantined (quarantined: n5)" in unknown.stderr
    assert babysit("release", "n5").returncode == 0
    assert excluded(tmp_path / ".babysit", tmp_path / "attempt-1") == ()


def test_each_nodes_stack_line_is_read_from_its_file_when_srun_interleaved_the_output(tmp_path: Path) -> None:
    """Two nodes print 30 KiB lines at once: srun mixes them, and neither parses. Each node's file on the
    shared disk (`stacks/node-<node>.json`) is whole; a line that parses stands for a node without a file."""
    from babysit.executors.slurm import node_dumps

    n1, n2 = ({"node": n, "procs": [{"rank": r, "stack": "x" * 30000}]} for n, r in (("n1", 0), ("n2", 1)))
    a, b = json.dumps(n1), json.dumps(n2)
    mixed = a[:4096] + b[:4096] + a[4096:] + "\n" + b[4096:] + "\n" + json.dumps({"node": "n3", "procs": []}) + "\n"
    (tmp_path / "node-n1.json").write_text(a + "\n")
    (tmp_path / "node-n2.json").write_text(b + "\n")
    assert sorted((d["node"], len(d["procs"])) for d in node_dumps(mixed, tmp_path)) == [
        ("n1", 1), ("n2", 1), ("n3", 0)]


def test_the_jobs_sidecar_records_are_its_exit_evidence_each_naming_its_node(tmp_path: Path) -> None:
    """At the exit the daemon reads every signal the sidecars kept (however old the records): n2's Xid 79 is
    machine-side evidence on n2, a throttle warning is none."""
    from babysit.probes.remote import SidecarGpuProbe

    xid = {"kind": "xid", "code": 79, "value": None, "at": 5.0, "text": "xid 79"}
    warm = {"kind": "throttle", "code": None, "value": 64.0, "at": 6.0, "text": "HW thermal slowdown"}
    for node, signals in (("n1", [warm]), ("n2", [xid])):
        (tmp_path / f"probe-{node}.jsonl").write_text(json.dumps(_record(node, 1.0, [
            {"index": 3, "uuid": f"GPU-{node}", "processes": [], "signals": signals}])) + "\n")
    (item,) = SidecarGpuProbe(tmp_path).job_evidence([0])
    assert (item["node"], item["gpu"], item["uuid"], item["xid"], item["side"]) == ("n2", 0, "GPU-n2", 79, "machine")


def test_the_sidecar_writes_a_last_record_when_it_is_stopped(tmp_path: Path) -> None:
    """An Xid that kills the trainer comes as the job ends: SIGTERM (the batch script's, or Slurm's) gets one
    more record, holding it, instead of none until the next interval."""
    gpus = tmp_path / "gpus.json"
    gpus.write_text(json.dumps({"gpus": [{"index": 0, "util_pct": 90, "processes": []}]}))
    out = tmp_path / "probe-{host}.jsonl"
    probe = subprocess.Popen([sys.executable, "-m", "babysit", "probe", "--out", str(out), "--interval", "60",
                              "--gpu-probe", f"file:{gpus}"], env={**os.environ, "SLURMD_NODENAME": "n7"},
                             stderr=subprocess.PIPE, text=True)
    written = tmp_path / "probe-n7.jsonl"
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not (written.exists() and written.read_text().endswith("\n")):
            time.sleep(0.1)
        gpus.write_text(json.dumps({"gpus": [{"index": 0, "util_pct": 0, "processes": [], "faults": ["xid 79"]}]}))
        probe.send_signal(signal.SIGTERM)
        assert probe.wait(timeout=30) == 0, probe.stderr.read() if probe.stderr else ""
    finally:
        if probe.poll() is None:
            probe.kill()
            probe.wait()
    first, last = (json.loads(line) for line in written.read_text().splitlines())
    assert first["gpu"]["gpus"][0]["faults"] == [] and last["gpu"]["gpus"][0]["faults"] == ["xid 79"]
