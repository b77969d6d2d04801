"""What the GPU scenarios share: a CUDA check and a real foreign CUDA process holding GPU memory."""

from __future__ import annotations

import subprocess
import sys

import pytest

HOLD = ("import sys, time, torch; x = torch.empty(int(sys.argv[1]) * 2**30, dtype=torch.uint8, device='cuda'); "
        "torch.cuda.synchronize(); print('holding', flush=True); time.sleep(float(sys.argv[2]))")


def require_cuda() -> None:
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch.cuda is not available")


def foreign(gib: int = 2, seconds: float = 120) -> subprocess.Popen:
    """A process that holds `gib` GiB on GPU 0 (NVML lists it) for `seconds`; returns once it does."""
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(gib), str(seconds)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "holding"
    return proc
