"""A Slurm node's two helpers, run for real on a GPU node (run on the GPU machine: `pytest -m gpu tests/gpu -s`).

On a multi-node job babysit sees each node through what runs there: the probe sidecar (`babysit probe
--job-id J`, started on every node by the batch script) and, for a stalled job, `python -m
babysit.run.node_stacks --job-id J` (started on every node with `srun --overlap`). Both find the job's
processes by `SLURM_JOB_ID` in their environment, so on a GPU machine without Slurm they are exercised as
they run on a node: a real CUDA rank of "job" 4242 (its environment as srun sets it), a CUDA process of no
job holding the same GPU, and the two helpers. Each test prints one `GPU:` line for bench/README.md
(section 14). The Slurm side (the batch script, srun, NODE_FAIL) is tested on the CI's multi-node Slurm
(tests/slurm/test_slurm_multinode.py).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from babysit.core.guards import foreign_holders
from babysit.probes.remote import SidecarGpuProbe

pytestmark = pytest.mark.gpu
GPU_INDEX = int(os.environ.get("BABYSIT_TEST_GPU", "0"))
JOB = "4242"

# A rank's training step stand-in: a bf16 matmul loop in a function whose name the stack dump must show.
RANK = """
import sys, torch
def train_step(x):
    return x @ x
x = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
train_step(x); torch.cuda.synchronize()
print("ready", flush=True)
while True:
    for _ in range(50):
        y = train_step(x)
    torch.cuda.synchronize()
"""
HOLDER = """
import torch, time
x = torch.ones(1024, device="cuda")
print("ready", flush=True)
time.sleep(600)
"""


def _cuda_or_skip() -> None:
    try:
        import pynvml

        pynvml.nvmlInit()
        import torch
    except Exception as exc:  # no driver, no torch: nothing to exercise here
        pytest.skip(f"no NVIDIA GPU here: {exc}")
    if not torch.cuda.is_available():
        pytest.skip("torch.cuda is not available (CPU wheel or no driver)")


def _start(code: str, env: dict[str, str]) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    return proc


def test_a_nodes_probe_and_stack_dump_on_a_real_gpu(tmp_path: Path) -> None:
    _cuda_or_skip()
    base = {**os.environ, "CUDA_VISIBLE_DEVICES": str(GPU_INDEX)}
    node_env = {**base, "SLURM_JOB_ID": JOB, "SLURMD_NODENAME": "gpunode", "RANK": "0", "LOCAL_RANK": "0",
                "WORLD_SIZE": "1"}
    rank = _start(RANK, node_env)
    holder = None
    probe = None
    try:
        holder = _start(HOLDER, {k: v for k, v in base.items() if not k.startswith("SLURM")})  # no job's
        probe = subprocess.Popen([sys.executable, "-m", "babysit", "probe", "--out",
                                  str(tmp_path / "probe-{host}.jsonl"), "--interval", "2", "--job-id", JOB,
                                  "--gpus", str(GPU_INDEX)],
                                 env={**node_env, "RANK": ""}, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 60
        sidecar = SidecarGpuProbe(tmp_path)
        while time.monotonic() < deadline and len(sidecar.records()) < 1:
            time.sleep(0.5)
        time.sleep(4.5)  # two more records: the utilisation is a window average
        (record,) = sidecar.records()
        assert record["host"] == "gpunode" and record["job_id"] == JOB, record
        view = sidecar.read([GPU_INDEX])
        (gpu,) = view.gpus
        assert gpu.util_pct is not None and gpu.util_pct > 10, gpu  # the rank's matmuls, averaged
        holders = foreign_holders(view, (GPU_INDEX,), frozenset())
        assert [h.pid for h in holders] == [holder.pid], holders  # the rank is the job's, the holder is not
        ram = sidecar.host()[0]
        assert ram["host"] == "gpunode" and ram["available_ram_bytes"] > 0

        rank.send_signal(signal.SIGSTOP)  # a hung rank
        time.sleep(0.5)
        started = time.monotonic()
        out = subprocess.run([sys.executable, "-m", "babysit.run.node_stacks", "--job-id", JOB],
                             env={**base, "SLURMD_NODENAME": "gpunode"}, capture_output=True, text=True,
                             timeout=120)
        took = time.monotonic() - started
        assert out.stdout.strip(), f"node_stacks printed nothing (exit {out.returncode}): {out.stderr}"
        dump = json.loads(out.stdout.strip().splitlines()[-1])
        (proc,) = dump["procs"]
        assert dump["node"] == "gpunode" and proc["pid"] == rank.pid and proc["rank"] == 0, dump
        assert proc["state"].startswith("T"), proc  # stopped, read without being resumed
        assert "train_step" in (proc["stack"] or ""), dump
        print(f"\nGPU: probe on the node: util {gpu.util_pct:.0f} %, {gpu.memory_used_bytes or 0:,} B used, "
              f"foreign holder pid {holder.pid} named; node_stacks of a SIGSTOPped CUDA rank in {took:.1f} s, "
              f"state {proc['state']}, its stack names train_step")
    finally:
        for proc in (probe, holder, rank):
            if proc is not None and proc.poll() is None:
                proc.kill()  # SIGKILL ends a stopped process too
                proc.wait(10)


# A one-rank NCCL job with PyTorch's flight recorder on: all-reduces on the GPU, its dump pipe served by
# ProcessGroupNCCL itself (the variables are the ones a user or babysit sets at launch).
NCCL_RANK = """
import os, time, torch, torch.distributed as dist
device = torch.device("cuda", 0)
torch.cuda.set_device(device)
dist.init_process_group("nccl", init_method="tcp://127.0.0.1:" + os.environ["FR_PORT"], rank=0, world_size=1,
                        device_id=device)
x = torch.ones(1 << 20, device=device)
for _ in range(5):
    dist.all_reduce(x)
torch.cuda.synchronize()
print("ready", flush=True)
while True:
    dist.all_reduce(x)
    torch.cuda.synchronize()
    time.sleep(0.05)
"""


def test_a_nodes_stack_dump_gathers_the_ranks_real_nccl_flight_record(tmp_path: Path) -> None:
    """`node_stacks` on the node asks the rank's dump pipe; ProcessGroupNCCL writes its flight record to the
    node-local prefix; the record is copied into the attempt's stacks/ folder, named in the node's line, and
    reads back in PyTorch's format with the rank's all-reduces in it."""
    _cuda_or_skip()
    from babysit.run.nccl import load_record

    local, attempt = tmp_path / "node-local", tmp_path / "attempt"
    local.mkdir()
    attempt.mkdir()
    node_env = {**os.environ, "CUDA_VISIBLE_DEVICES": str(GPU_INDEX), "SLURM_JOB_ID": JOB,
                "SLURMD_NODENAME": "gpunode", "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1",
                "FR_PORT": str(29500 + os.getpid() % 2000), "TORCH_NCCL_TRACE_BUFFER_SIZE": "2000",
                "TORCH_NCCL_DUMP_ON_TIMEOUT": "1", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": f"{local}/nccl_trace_rank_",
                "TORCH_NCCL_DEBUG_INFO_PIPE_FILE": f"{local}/nccl_pipe_rank_"}
    rank = _start(NCCL_RANK, node_env)
    try:
        started = time.monotonic()
        out = subprocess.run([sys.executable, "-m", "babysit.run.node_stacks", "--job-id", JOB],
                             env={**os.environ, "SLURMD_NODENAME": "gpunode"}, cwd=attempt, capture_output=True,
                             text=True, timeout=120)
        took = time.monotonic() - started
    finally:
        rank.kill()
        rank.wait(10)
    dump = json.loads(out.stdout.strip().splitlines()[-1])
    assert dump == json.loads((attempt / "stacks" / "node-gpunode.json").read_text()), out.stderr
    assert dump["flight_missing"] == [], dump
    (gathered,) = dump["flight_records"]
    assert gathered["rank"] == 0 and gathered["from"] == f"{local}/nccl_trace_rank_0", gathered
    record = load_record(attempt / "stacks" / "nccl_trace_rank_0")
    names = {str(e.get("profiling_name")) for e in record["entries"]}
    assert any("all_reduce" in n for n in names), names
    print(f"\nGPU: node_stacks gathered rank 0's NCCL flight record ({gathered['bytes']:,} B, "
          f"{len(record['entries'])} entries, version {record.get('version')}) in {took:.1f} s")
