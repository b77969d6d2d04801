"""NvmlGpuProbe on a real NVIDIA GPU (run on the GPU machine: `pytest -m gpu tests/gpu -s`).

Skipped with a reason where `pynvml.nvmlInit()` fails (no driver) or torch.cuda is unavailable.
GPU_INDEX (env BABYSIT_TEST_GPU, default 0) must be idle: the tests start their own matmul load.
Each test prints one `H200:` line with what it measured, for bench/README.md (section 14).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from babysit.core.guards import foreign_holders, prelaunch
from babysit.core.spec.run_toml import GuardsSpec
from babysit.probes.gpu import NvmlGpuProbe, poll_window
from babysit.probes.host import process_tree

pytestmark = pytest.mark.gpu
GPU_INDEX = int(os.environ.get("BABYSIT_TEST_GPU", "0"))

# A matmul loop that keeps the GPU busy; prints "ready" once the first kernels ran.
MATMUL = """
import sys, time, torch
x = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
y = x @ x; torch.cuda.synchronize()
print("ready", flush=True)
end = time.time() + float(sys.argv[1])
while time.time() < end:
    for _ in range(20):
        y = x @ x
    torch.cuda.synchronize()
"""
LAUNCH = "import subprocess, sys, time; p = subprocess.Popen([sys.executable, '-c', *sys.argv[1:]]); p.wait()"


@pytest.fixture(scope="module")
def nvml():
    pynvml = pytest.importorskip("pynvml")
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        pytest.skip(f"no usable NVIDIA driver: pynvml.nvmlInit() failed ({exc})")
    yield pynvml
    pynvml.nvmlShutdown()


@pytest.fixture(scope="module")
def cuda(nvml):
    torch = pytest.importorskip("torch", reason="torch is needed to load the GPU")
    if not torch.cuda.is_available():
        pytest.skip("torch.cuda is not available (CPU wheel or no driver)")
    return torch


@pytest.fixture
def probe(nvml):
    p = NvmlGpuProbe()
    yield p
    p.close()


def _env() -> dict[str, str]:
    return {**os.environ, "CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": str(GPU_INDEX)}


def _start(argv: list[str]) -> subprocess.Popen:
    proc = subprocess.Popen(argv, env=_env(), stdout=subprocess.PIPE, text=True, start_new_session=True)
    line = proc.stdout.readline() if proc.stdout else ""
    if "ready" not in line:
        proc.kill()
        pytest.fail(f"the matmul load did not start (got {line!r})")
    return proc


def _stop(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, 9)
    except ProcessLookupError:
        pass
    proc.wait(timeout=30)


def _window(probe: NvmlGpuProbe, seconds: float, every: float = 0.5):
    probe.read([GPU_INDEX])  # closes the previous window
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        probe.sample()
        time.sleep(every)
    return probe.read([GPU_INDEX]).gpu(GPU_INDEX)


def test_device_is_read_with_name_memory_and_no_errors(probe):
    view = probe.read([])
    assert view.available, view.reason
    g = view.gpu(GPU_INDEX)
    assert g is not None and g.name and g.uuid.startswith("GPU-")
    assert g.memory_total_bytes and g.memory_total_bytes > 0 and g.memory_used_bytes is not None
    assert g.processes_known and g.faults == () and g.errors == ()
    print(f"H200: name={g.name!r} total={g.memory_total_bytes / 2**30:.2f} GiB gpus={len(view.gpus)}")


def test_idle_gpu_reads_near_zero_util(probe):
    g = probe.read([GPU_INDEX]).gpu(GPU_INDEX)
    if g.processes:
        pytest.skip(f"GPU {GPU_INDEX} is not idle: {g.processes}")
    g = _window(probe, 4.0)
    assert g.util_samples >= 2 and g.util_pct is not None and g.util_pct <= 10
    print(f"H200: idle util={g.util_pct:.1f}% samples={g.util_samples}")


def test_matmul_load_averages_at_least_90_percent_and_is_listed(probe, cuda):
    proc = _start([sys.executable, "-c", MATMUL, "60"])
    try:
        time.sleep(1.0)
        g = _window(probe, 6.0)
        assert g.util_pct is not None and g.util_pct >= 90, g
        assert g.util_samples >= 6
        listed = {p.pid: p for p in g.processes}
        assert proc.pid in listed, (f"matmul pid {proc.pid} not among NVML's {sorted(listed)}: "
                                    "babysit in a container without --pid=host?")
        assert listed[proc.pid].used_memory_bytes and listed[proc.pid].used_memory_bytes > 0
        assert listed[proc.pid].visible and "python" in listed[proc.pid].name
        held = prelaunch(GuardsSpec(), [GPU_INDEX], probe.read([GPU_INDEX]))
        assert [a.incident for a in held] == ["gpu-held"]
        print(f"H200: matmul util={g.util_pct:.1f}% samples={g.util_samples} source={probe.util_source(GPU_INDEX)} "
              f"proc_mem={listed[proc.pid].used_memory_bytes / 2**30:.2f} GiB")
    finally:
        _stop(proc)


def test_a_poll_window_is_measured_by_gpm_counters_busy_then_idle_with_no_sampler(probe, cuda):
    """On a GPU with GPM (Hopper and later) a poll window is its counters over the whole window: no
    sample() between the two reads, and the mean of a half-busy window is about half."""
    window = poll_window("gpu-test")
    assert probe.read([GPU_INDEX], window=window).available
    if probe.util_source(GPU_INDEX) != "gpm":
        pytest.skip(f"GPU {GPU_INDEX} has no GPM (util source {probe.util_source(GPU_INDEX)})")
    assert not probe.samples_needed()
    proc = _start([sys.executable, "-c", MATMUL, "60"])
    try:
        probe.read([GPU_INDEX], window=window)  # the busy window starts after the load's first kernels
        time.sleep(6.0)
        busy = probe.read([GPU_INDEX], window=window).gpu(GPU_INDEX)
    finally:
        _stop(proc)
    time.sleep(6.0)
    idle = probe.read([GPU_INDEX], window=window).gpu(GPU_INDEX)
    assert busy.util_pct is not None and busy.util_pct >= 90, busy
    assert busy.util_samples == 0 and busy.util_seconds == pytest.approx(6.0, abs=1.0) and busy.errors == ()
    assert idle.util_pct is not None and idle.util_pct <= 10, idle
    print(f"H200: GPM poll window busy {busy.util_pct:.1f}% over {busy.util_seconds:.2f} s, then idle "
          f"{idle.util_pct:.1f}% over {idle.util_seconds:.2f} s")


def test_a_child_of_the_run_holding_the_gpu_is_own_not_foreign(probe, cuda):
    wrapper = _start_wrapped()
    try:
        view = probe.read([GPU_INDEX])
        run_pids = process_tree(wrapper.pid)
        assert len(run_pids) == 2
        assert foreign_holders(view, [GPU_INDEX], run_pids) == ()
        strangers = foreign_holders(view, [GPU_INDEX], frozenset())
        assert [h.pid for h in strangers] == sorted(run_pids - {wrapper.pid})
    finally:
        _stop(wrapper)


def _start_wrapped() -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", LAUNCH, MATMUL, "60"], env=_env(), stdout=subprocess.PIPE,
                            text=True, start_new_session=True)
    line = proc.stdout.readline() if proc.stdout else ""
    if "ready" not in line:
        _stop(proc)
        pytest.fail(f"the wrapped matmul load did not start (got {line!r})")
    return proc


def test_sample_is_cheap(probe):
    probe.read([])
    n = 200
    start = time.perf_counter()
    for _ in range(n):
        probe.sample()
    per_call = (time.perf_counter() - start) / n
    print(f"H200: sample() {per_call * 1e6:.0f} µs per call")
    assert per_call < 0.01
