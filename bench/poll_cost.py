"""Poll cost: one babysit snapshot (NVML GPU read + host read of the run's tree + log delta) vs the same
facts the way babysitting shell scripts get them (two `nvidia-smi` subprocesses, `ps`, and re-parsing
the whole log), and vs babysit's own way before (the run's tree found by one pass over every /proc/N/stat).

  python bench/poll_cost.py                       # here: host + log parts; GPU "not measured (no NVML)"
  python bench/poll_cost.py --json out/poll.json  # on the H200: every part, NVML calls one by one

Targets: ≤ 0.5 ms per snapshot, ≥ 1000x cheaper than the naive way. `NvmlGpuProbe.sample()` and
`read()` are reported separately, and each NVML call they make is timed alone, so a slow one shows.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import emit, end_tree, fmt_us, naive_parse, nvml_or_reason, spawn_tree, summary, time_calls, write_log

from babysit.probes import proctree
from babysit.probes.host import read_host
from babysit.sources import logtail


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n", type=int, default=300, help="timed calls per cheap part (default 300)")
    p.add_argument("--naive-n", type=int, default=15, help="timed calls per naive part (default 15)")
    p.add_argument("--log-records", type=int, default=200_000,
                   help="records already in the log (default 200000 ≈ 27 MB, a ~1-day run at 2 steps/s)")
    p.add_argument("--append", type=int, default=20, help="records appended between two polls (default 20)")
    p.add_argument("--children", type=int, default=4, help="processes under the run's root (default 4)")
    p.add_argument("--gpu", type=int, default=0, help="GPU index to read (default 0)")
    p.add_argument("--json", metavar="PATH")
    args = p.parse_args(argv)

    tmp = Path(tempfile.mkdtemp(prefix="babysit-poll-"))
    tree = spawn_tree(args.children)
    parts: dict[str, Any] = {}
    notes: list[str] = []
    try:
        log = tmp / "train_log.jsonl"
        size = write_log(log, args.log_records)
        state = logtail.read_new(log, logtail.TailState(), max_bytes=2**40).state  # caught up, as the daemon is
        step = [args.log_records]

        def append() -> None:
            write_log(log, args.append, start=step[0])
            step[0] += args.append

        def ours_log() -> None:
            nonlocal state
            got = logtail.read_new(log, state)
            assert len(got.records) == args.append, len(got.records)
            state = got.state

        read_host(tree.pid)  # the first read primes the CPU counters
        parts["host read_host (walk down from the root)"] = summary(time_calls(lambda: read_host(tree.pid), args.n))
        parts["log read_new (delta)"] = summary(time_calls(ours_log, args.n, setup=append))
        before: dict[str, Any] = {}
        before["host: one pass over every /proc/N/stat + meminfo"] = summary(time_calls(
            lambda: (proctree.scan_tree(tree.pid), proctree.meminfo()), args.n))
        before["host: psutil children(recursive=True) + virtual_memory"] = summary(
            time_calls(lambda: psutil_tree(tree.pid), max(20, args.n // 10)))
        processes = sum(1 for name in os.listdir("/proc") if name.isdigit())

        nv, why = nvml_or_reason()
        gpu: dict[str, Any] = {}
        if nv is None:
            notes.append(f"GPU part: {why}. Run on the H200: `python bench/poll_cost.py` (or bench/run_gpu.sh).")
        else:
            gpu = gpu_parts(nv, args)
            parts.update(gpu)

        # -- the naive way
        naive: dict[str, Any] = {}
        naive["log: re-parse whole log (json)"] = summary(time_calls(lambda: naive_parse(log), args.naive_n))
        ps = ["ps", "-o", "pid=,rss=,pcpu=", "-g", str(os.getpgid(tree.pid))]
        naive["host: ps subprocess"] = summary(
            time_calls(lambda: subprocess.run(ps, capture_output=True), args.naive_n))
        smi = shutil.which("nvidia-smi")
        if smi and nv is not None:
            q1 = [smi, "--query-gpu=utilization.gpu,memory.used,memory.total", "--format=csv", "-i", str(args.gpu)]
            q2 = [smi, "--query-compute-apps=pid,process_name,used_memory", "--format=csv"]
            naive["gpu: nvidia-smi --query-gpu"] = summary(
                time_calls(lambda: subprocess.run(q1, capture_output=True), args.naive_n))
            naive["gpu: nvidia-smi --query-compute-apps"] = summary(
                time_calls(lambda: subprocess.run(q2, capture_output=True), args.naive_n))
        else:
            notes.append("naive GPU part (nvidia-smi) not measured: " + ("no nvidia-smi" if not smi else why or "?"))

        ours_keys = ["host read_host (walk down from the root)", "log read_new (delta)"]
        if nv is not None:
            ours_keys.append("NvmlGpuProbe.read([gpu])")
        ours_total = sum(parts[k]["median_us"] for k in ours_keys)
        naive_total = sum(v["median_us"] for v in naive.values())
        # the same parts compared like for like (host+log only, where there is no GPU)
        rows = [[k, fmt_us(v["median_us"]), fmt_us(v["p90_us"]), v["n"]] for k, v in parts.items()]
        rows += [[f"before — {k}", fmt_us(v["median_us"]), fmt_us(v["p90_us"]), v["n"]] for k, v in before.items()]
        rows += [[f"naive — {k}", fmt_us(v["median_us"]), fmt_us(v["p90_us"]), v["n"]] for k, v in naive.items()]
        scope = "host + log + GPU" if nv is not None else "host + log only (GPU not measured)"
        before_total = ours_total - parts["host read_host (walk down from the root)"]["median_us"] \
            + before["host: one pass over every /proc/N/stat + meminfo"]["median_us"]
        rows.append([f"**snapshot, ours ({scope})**", f"**{fmt_us(ours_total)}**", "", ""])
        rows.append([f"snapshot, before (the same with the /proc pass; {scope})", fmt_us(before_total), "", ""])
        rows.append([f"**snapshot, naive ({scope})**", f"**{fmt_us(naive_total)}**", "", ""])
        ratio = naive_total / ours_total
        rows.append(["**ratio naive / ours**", f"**{ratio:,.0f}x**", "", ""])
        target = ours_total <= 500 and ratio >= 1000
        notes.append(f"log: {args.log_records:,} records ({size / 2**20:.1f} MiB), {args.append} appended per poll; "
                     f"tree: 1 python + {args.children} children; {processes} processes on the machine. "
                     f"Target ≤ 0.5 ms and ≥ 1000x: {'met' if target else 'MISSED'} ({scope}).")
        emit("poll cost (one snapshot)", ["part", "median", "p90", "calls"], rows,
             {"parts": parts, "before": before, "naive": naive, "ours_total_us": ours_total,
              "before_total_us": before_total, "naive_total_us": naive_total, "processes_on_machine": processes,
              "ratio": ratio, "scope": scope, "gpu_measured": nv is not None, "gpu_not_measured_reason": why,
              "log_records": args.log_records, "log_bytes": size, "append": args.append}, args.json, notes)
    finally:
        end_tree(tree)
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


def psutil_tree(root: int) -> tuple[Any, ...]:
    """The tree as psutil finds it (every process's stat read to learn who is whose child), RSS and CPU."""
    import psutil

    proc = psutil.Process(root)
    members = [proc, *proc.children(recursive=True)]
    return psutil.virtual_memory(), [(p.memory_info().rss, p.cpu_times()) for p in members]


def gpu_parts(nv: Any, args: argparse.Namespace) -> dict[str, Any]:
    """NvmlGpuProbe.read / sample, and each NVML call they make, timed alone."""
    from babysit.probes.gpu import NvmlGpuProbe

    out: dict[str, Any] = {}
    probe = NvmlGpuProbe()
    probe.read([args.gpu])  # initialise (handles, event set, ECC baseline): once per daemon
    out["NvmlGpuProbe.read([gpu])"] = summary(time_calls(lambda: probe.read([args.gpu]), args.n))
    out["NvmlGpuProbe.sample()"] = summary(time_calls(probe.sample, args.n))
    view = probe.read([args.gpu])
    reading = view.gpu(args.gpu)
    out["  probe check"] = {"n": 0, "median_us": 0, "p90_us": 0, "util_source": probe.util_source(args.gpu),
                            "errors": list(reading.errors) if reading else ["no reading"],
                            "processes": len(reading.processes) if reading else None}
    probe.close()

    nv.nvmlInit()
    h = nv.nvmlDeviceGetHandleByIndex(args.gpu)
    calls = {
        "nvmlDeviceGetUtilizationRates": lambda: nv.nvmlDeviceGetUtilizationRates(h),
        "nvmlDeviceGetMemoryInfo": lambda: nv.nvmlDeviceGetMemoryInfo(h),
        "nvmlDeviceGetComputeRunningProcesses": lambda: nv.nvmlDeviceGetComputeRunningProcesses(h),
        "nvmlDeviceGetName": lambda: nv.nvmlDeviceGetName(h),
        "nvmlDeviceGetUUID": lambda: nv.nvmlDeviceGetUUID(h),
        "nvmlDeviceGetTotalEccErrors": lambda: nv.nvmlDeviceGetTotalEccErrors(
            h, nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nv.NVML_VOLATILE_ECC),
        "nvmlDeviceGetSamples(ts=0) (pynvml: 2 C calls, whole buffer)": lambda: nv.nvmlDeviceGetSamples(
            h, nv.NVML_GPU_UTILIZATION_SAMPLES, 0),
    }
    last = [0]

    def newest() -> None:
        try:
            _, samples = nv.nvmlDeviceGetSamples(h, nv.NVML_GPU_UTILIZATION_SAMPLES, last[0])
            if samples:
                last[0] = max(s.timeStamp for s in samples)
        except nv.NVMLError:
            pass

    calls["nvmlDeviceGetSamples(last ts) (pynvml: 2 C calls)"] = newest
    for name, fn in calls.items():
        try:
            fn()
            out[f"raw {name}"] = summary(time_calls(fn, args.n))
        except nv.NVMLError as exc:
            out[f"raw {name}"] = {"n": 0, "median_us": 0, "p90_us": 0, "error": str(exc)}
    try:
        _, samples = nv.nvmlDeviceGetSamples(h, nv.NVML_GPU_UTILIZATION_SAMPLES, 0)
        out["  samples in NVML's buffer"] = {"n": 0, "median_us": 0, "p90_us": 0, "count": len(samples)}
    except nv.NVMLError:
        pass
    nv.nvmlShutdown()
    return out


if __name__ == "__main__":
    sys.exit(main())
