"""Probes against the real thing that exists here: real process trees (psutil), the real pynvml on a
machine without a driver, and the file-injected GPUs the daemon's tests and demo use."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from babysit.errors import BadInput
from babysit.guards import foreign_holders, prelaunch
from babysit.probes.gpu import FileGpuProbe, NullGpuProbe, NvmlGpuProbe, open_gpu_probe
from babysit.probes.host import (
    available_ram_bytes,
    is_same_process,
    process_create_time,
    process_name,
    process_tree,
    read_host,
)
from babysit.spec import GuardsSpec

# parent -> child -> grandchild; the grandchild holds ~64 MiB and writes its pid to argv[1]
GRANDCHILD = "import os, sys, time; b = b'x' * (64 * 2**20); open(sys.argv[1], 'w').write(str(os.getpid())); " \
             "time.sleep(120)"
LAUNCH = "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', *sys.argv[1:]]); time.sleep(120)"


@pytest.fixture
def tree(tmp_path: Path):
    """A real three-level process tree; yields (root Popen, grandchild pid). Killed afterwards."""
    pidfile = tmp_path / "grandchild.pid"
    root = subprocess.Popen([sys.executable, "-c", LAUNCH, LAUNCH, GRANDCHILD, str(pidfile)], start_new_session=True)
    deadline = time.monotonic() + 20
    while not (pidfile.exists() and pidfile.read_text()):
        if time.monotonic() > deadline:
            root.kill()
            pytest.fail("the grandchild never started")
        time.sleep(0.05)
    grandchild = int(pidfile.read_text())
    yield root, grandchild
    try:
        os.killpg(root.pid, 9)
    except ProcessLookupError:
        pass
    root.wait(timeout=10)


def _wait_gone(pid: int, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while process_create_time(pid) is not None and time.monotonic() < deadline:
        time.sleep(0.05)


def test_process_tree_finds_the_grandchild(tree):
    root, grandchild = tree
    pids = process_tree(root.pid)
    assert root.pid in pids and grandchild in pids and len(pids) == 3
    assert os.getpid() not in pids


def test_process_tree_of_a_gone_root_is_empty(tree):
    root, _ = tree
    os.killpg(root.pid, 9)
    root.wait(timeout=10)
    assert process_tree(root.pid) == frozenset()


def test_read_host_sums_rss_over_the_tree_and_measures_cpu_on_the_second_read(tree):
    root, _ = tree
    first = read_host(root.pid)
    assert first.run_pids == process_tree(root.pid)
    assert first.run_rss_bytes is not None and first.run_rss_bytes > 64 * 2**20  # the grandchild's buffer
    assert first.run_cpu_pct is None  # a first look cannot measure a rate
    time.sleep(0.2)
    second = read_host(root.pid)
    assert second.run_cpu_pct is not None and second.run_cpu_pct >= 0
    assert 0 < second.available_ram_bytes <= second.total_ram_bytes


def test_read_host_without_a_run():
    got = read_host(None)
    assert got.run_pids == frozenset() and got.run_rss_bytes is None and got.run_cpu_pct is None
    assert 0 < available_ram_bytes() <= got.total_ram_bytes


def test_is_same_process_true_then_false_after_death(tree):
    root, grandchild = tree
    created = process_create_time(grandchild)
    assert created is not None
    assert is_same_process(grandchild, created)
    assert not is_same_process(grandchild, created - 5.0)  # a recycled pid has another create time
    os.killpg(root.pid, 9)
    root.wait(timeout=10)
    _wait_gone(grandchild)
    assert not is_same_process(grandchild, created)
    assert process_create_time(grandchild) is None


def test_process_name_of_a_real_and_a_missing_pid(tree):
    _, grandchild = tree
    assert "python" in (process_name(grandchild) or "")
    assert process_name(2**22 + 12345) is None  # above pid_max: no such process


def test_nvml_probe_without_a_driver_is_unavailable_with_a_fix_and_never_raises():
    pynvml = pytest.importorskip("pynvml")
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        pass
    else:
        pynvml.nvmlShutdown()
        pytest.skip("an NVIDIA driver is present here: see tests/gpu/")
    probe = NvmlGpuProbe()
    probe.sample()  # before any read: a no-op, not an error
    for indices in ([0], []):
        view = probe.read(indices)
        assert view.available is False and view.gpus == ()
        assert "install the NVIDIA driver" in (view.reason or "")
    probe.sample()
    probe.close()
    assert prelaunch(GuardsSpec(), [0], view)[0].incident == "gpu-unseen"


def _write(path: Path, data: object) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data))
    tmp.replace(path)


def test_file_probe_rereads_its_file_so_a_test_can_start_a_foreign_process(tmp_path: Path):
    path = tmp_path / "gpus.json"
    gpu = {"index": 0, "name": "Simulated H200", "util_pct": 97, "memory_used_bytes": 10,
           "memory_total_bytes": 150 * 2**30, "processes": [], "faults": []}
    _write(path, {"gpus": [gpu]})
    probe = open_gpu_probe(f"file:{path}")
    first = probe.read([0])
    assert first.available and first.gpu(0).util_pct == 97.0 and first.gpu(0).processes == ()
    assert prelaunch(GuardsSpec(), [0], first) == ()
    _write(path, {"gpus": [{**gpu, "processes": [{"pid": 4242, "name": "policy_server",
                                                   "used_memory_bytes": 61 * 2**30}]}]})
    second = probe.read([0])
    assert [p.pid for p in second.gpu(0).processes] == [4242]
    assert prelaunch(GuardsSpec(), [0], second)[0].incident == "gpu-held"


def test_file_probe_own_tree_is_not_foreign(tree, tmp_path: Path):
    root, grandchild = tree
    path = tmp_path / "gpus.json"
    _write(path, {"gpus": [{"index": 0, "processes": [{"pid": grandchild, "name": "worker"},
                                                      {"pid": os.getpid(), "name": "pytest"}]}]})
    view = FileGpuProbe(path).read([])
    holders = foreign_holders(view, [0], process_tree(root.pid))
    assert [h.pid for h in holders] == [os.getpid()]


@pytest.mark.parametrize(("content", "reason_has"), [
    (None, "cannot read simulated GPUs"),
    ("{not json", "cannot read simulated GPUs"),
    ('{"gpus": [{"name": "no index"}]}', "cannot read simulated GPUs"),
    ('{"available": false, "reason": "simulated: driver gone"}', "simulated: driver gone"),
])
def test_file_probe_bad_or_unavailable_file_is_a_view_not_an_exception(tmp_path: Path, content, reason_has):
    path = tmp_path / "gpus.json"
    if content is not None:
        path.write_text(content)
    view = FileGpuProbe(path).read([0])
    assert view.available is False and reason_has in (view.reason or "")


def test_file_probe_filters_indices_and_marks_unlistable_processes(tmp_path: Path):
    path = tmp_path / "gpus.json"
    _write(path, {"gpus": [{"index": 0}, {"index": 1, "processes": None, "faults": ["xid 79"]}]})
    view = FileGpuProbe(path).read([1])
    assert [g.index for g in view.gpus] == [1]
    assert view.gpu(1).processes_known is False and view.gpu(1).faults == ("xid 79",)
    assert view.gpu(1).util_pct is None and view.gpu(1).util_samples == 0


@pytest.mark.parametrize(("spec", "cls"), [
    (None, NvmlGpuProbe), ("", NvmlGpuProbe), ("nvml", NvmlGpuProbe), ("none", NullGpuProbe),
    ("file:/x.json", FileGpuProbe),
])
def test_open_gpu_probe(spec, cls):
    probe = open_gpu_probe(spec)
    assert isinstance(probe, cls)
    probe.close()


@pytest.mark.parametrize("spec", ["file:", "nvidia", "FILE:/x"])
def test_open_gpu_probe_rejects_unknown_specs(spec):
    with pytest.raises(BadInput, match="BABYSIT_GPU_PROBE"):
        open_gpu_probe(spec)


def test_null_probe_refuses_gpu_runs_with_a_reason():
    view = NullGpuProbe().read([0])
    assert view.available is False and "BABYSIT_GPU_PROBE=none" in (view.reason or "")
