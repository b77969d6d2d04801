"""What the GPU scenarios share: a CUDA check and a real foreign CUDA process holding GPU memory."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

HOLD = ("import sys, time, torch; x = torch.empty(int(sys.argv[1]) * 2**30, dtype=torch.uint8, device='cuda'); "
        "torch.cuda.synchronize(); print('holding', flush=True); time.sleep(float(sys.argv[2]))")


def require_cuda() -> None:
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch.cuda is not available")


def require_gpus(n: int) -> None:
    """Skip unless torch sees at least `n` CUDA devices (the two-GPU scenarios need the x2 machine)."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch.cuda is not available")
    if torch.cuda.device_count() < n:
        pytest.skip(f"needs {n} CUDA devices, torch sees {torch.cuda.device_count()} (run on nvidia-h200-x2)")


def foreign(gib: int = 2, seconds: float = 120, gpu: int = 0) -> subprocess.Popen:
    """A process that holds `gib` GiB on GPU `gpu` (an NVML index; NVML lists it) for `seconds`; returns
    once it does."""
    env = {**os.environ, "CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": str(gpu)}
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(gib), str(seconds)], stdout=subprocess.PIPE, text=True,
                            env=env)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "holding"
    return proc
