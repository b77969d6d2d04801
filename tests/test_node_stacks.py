"""babysit/run/node_stacks.py on this machine: a rank's flight record asked for through its dump pipe and
gathered into the stacks folder, as each node of a stalled Slurm job does (tests/slurm covers the nodes)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from babysit.run.node_stacks import gather_records, job_ranks, recorder

# A rank's dump pipe served as PyTorch's ProcessGroupNCCL serves it: `<pipe prefix><rank>.pipe`, and on a
# write its record goes to `<temp prefix><rank>` (here plain bytes: the gathering copies, it does not parse).
# PyTorch keeps the pipe open for reading (non-blocking) and polls it, so a write never finds it unread.
RANK = """
import os, time
pipe = os.environ["TORCH_NCCL_DEBUG_INFO_PIPE_FILE"] + os.environ["RANK"] + ".pipe"
os.mkfifo(pipe)
fd = os.open(pipe, os.O_RDONLY | os.O_NONBLOCK)
print("ready", flush=True)
while True:
    try:
        if os.read(fd, 16):
            break
    except BlockingIOError:
        pass
    time.sleep(0.05)
out = os.environ["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"] + os.environ["RANK"]
with open(out + ".tmp", "wb") as f:
    f.write(b"record of rank " + os.environ["RANK"].encode())
os.replace(out + ".tmp", out)
"""


def test_a_ranks_record_is_asked_for_through_its_pipe_and_copied_an_older_one_is_not(tmp_path: Path) -> None:
    local = tmp_path / "node-local"
    local.mkdir()
    stale = local / "nccl_trace_rank_4"
    stale.write_bytes(b"an earlier run's record")
    os.utime(stale, (time.time() - 3600, time.time() - 3600))
    env = {"TORCH_NCCL_TRACE_BUFFER_SIZE": "2000", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": f"{local}/nccl_trace_rank_",
           "TORCH_NCCL_DEBUG_INFO_PIPE_FILE": f"{local}/nccl_pipe_rank_"}
    rank = subprocess.Popen([sys.executable, "-c", RANK], env={**os.environ, **env, "RANK": "3"},
                            stdout=subprocess.PIPE, text=True)
    old = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])  # rank 4: no pipe, stale file
    try:
        assert rank.stdout is not None and rank.stdout.readline().strip() == "ready"
        gathered, missing = gather_records({rank.pid: {**env, "RANK": "3"}, os.getpid(): {"RANK": "5"}},
                                           tmp_path / "stacks", wait_s=30)  # returns once it is there
        none, stale_only = gather_records({old.pid: {**env, "RANK": "4"}}, tmp_path / "stacks", wait_s=0.5)
    finally:
        for proc in (rank, old):
            proc.kill()
            proc.wait()
    assert [(g["rank"], g["from"], g["bytes"]) for g in gathered] == [(3, f"{local}/nccl_trace_rank_3", 16)]
    assert missing == [] and (tmp_path / "stacks" / "nccl_trace_rank_3").read_bytes() == b"record of rank 3"
    assert none == [] and stale_only == [f"rank 4: flight recorder on, but no dump at {stale} since it started"]
    assert not (tmp_path / "stacks" / "nccl_trace_rank_4").exists()


def test_the_recorder_is_on_only_with_a_buffer_and_dumps_where_its_variables_say() -> None:
    assert recorder({}) is None and recorder({"TORCH_NCCL_TRACE_BUFFER_SIZE": "0"}) is None
    assert recorder({"TORCH_NCCL_TRACE_BUFFER_SIZE": "2000"}) == ("/tmp/nccl_trace_rank_", None)  # PyTorch's default
    assert recorder({"TORCH_FR_BUFFER_SIZE": "10", "TORCH_FR_DUMP_TEMP_FILE": "/x/fr_",
                     "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": "/y/old_", "TORCH_NCCL_DEBUG_INFO_PIPE_FILE": "/x/p_"}) == (
        "/x/fr_", "/x/p_")


def test_only_the_jobs_processes_with_a_numeric_rank_are_its_ranks() -> None:
    """The probe sidecar runs inside the job with RANK cleared: it is no rank (found on an H100, where
    node_stacks crashed on int(''))."""
    job = f"77{os.getpid()}"
    sleep = [sys.executable, "-c", "import time; time.sleep(60)"]
    envs = {"rank": {"RANK": "1"}, "sidecar": {"RANK": ""}, "other job": {"RANK": "0", "SLURM_JOB_ID": "1"}}
    procs = {name: subprocess.Popen(sleep, env={**os.environ, "SLURM_JOB_ID": job, **extra})
             for name, extra in envs.items()}
    try:
        assert list(job_ranks(job, None)) == [procs["rank"].pid]
    finally:
        for proc in procs.values():
            proc.kill()
            proc.wait()
