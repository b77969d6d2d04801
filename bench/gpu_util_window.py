"""A window's GPU utilization three ways, on a real GPU: a timed sampler, the driver's buffer, GPM.

  python bench/gpu_util_window.py [--seconds 70] [--json PATH]     # on the GPU machine (~80 s)

A poll's GPU utilization is the mean over its whole window. The daemon gets it by sampling
nvmlDeviceGetUtilizationRates on a timer (`[daemon].gpu_sample_seconds`). NVML also keeps the driver's own
samples in a buffer, read by nvmlDeviceGetSamples(NVML_GPU_UTILIZATION_SAMPLES, since): if that buffer
spans the guard round (30 s), a read each round covers the window with no sampling timer at all. This
measures, while a load alternates 4 s busy / 4 s idle on GPU 0: the buffer's span and sample period, what
a read `since` the last one returns after 10, 20 and 30 s (the part of the gap it covers), both means over
the same window against the 1-s sampler's, and the cost of one read of each kind. GPM (GPU Performance
Monitoring, Hopper and later: nvmlGpmSampleGet / nvmlGpmMetricsGet) gives a window's utilization from
two snapshots of the GPU's counters, one at each end: no timer between; measured over the same windows.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import subprocess
import sys
import threading
import time

import pynvml

LOAD = """
import time, torch
x = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
end = time.monotonic() + float(__import__("sys").argv[1])
while time.monotonic() < end:
    busy = time.monotonic() + 4
    while time.monotonic() < busy:
        for _ in range(20):
            x @ x
        torch.cuda.synchronize()
    time.sleep(4)
"""


def samples(handle, since: int) -> list[tuple[int, int]]:
    try:
        _, got = pynvml.nvmlDeviceGetSamples(handle, pynvml.NVML_GPU_UTILIZATION_SAMPLES, since)
    except pynvml.NVMLError_NotFound:
        return []
    return [(s.timeStamp, s.sampleValue.uiVal) for s in got]


def span(got: list[tuple[int, int]]) -> dict[str, float]:
    if len(got) < 2:
        return {"n": len(got)}
    ts = [t for t, _ in got]
    gaps = [b - a for a, b in itertools.pairwise(ts)]
    return {"n": len(got), "span_s": (ts[-1] - ts[0]) / 1e6, "median_period_ms": statistics.median(gaps) / 1e3,
            "max_gap_ms": max(gaps) / 1e3, "newest_age_ms": (time.time() * 1e6 - ts[-1]) / 1e3}


GPM_METRICS = ("GRAPHICS_UTIL", "SM_UTIL", "SM_OCCUPANCY")


class Gpm:
    """Two-snapshot GPM metrics over [since, now] for one GPU (None where the GPU has no GPM)."""

    def __init__(self, handle) -> None:
        self.handle = handle
        try:
            self.supported = bool(pynvml.nvmlGpmQueryDeviceSupport(handle).isSupportedDevice)
        except (pynvml.NVMLError, AttributeError) as exc:
            self.supported, self.error = False, str(exc)
        else:
            self.error = None

    def snapshot(self):
        s = pynvml.nvmlGpmSampleAlloc()
        pynvml.nvmlGpmSampleGet(self.handle, s)
        return s

    def metrics(self, first, second) -> dict[str, float | str]:
        got = pynvml.c_nvmlGpmMetricsGet_t()
        got.version = pynvml.NVML_GPM_METRICS_GET_VERSION
        got.numMetrics = len(GPM_METRICS)
        got.sample1, got.sample2 = first, second
        for k, name in enumerate(GPM_METRICS):
            got.metrics[k].metricId = getattr(pynvml, f"NVML_GPM_METRIC_{name}")
        pynvml.nvmlGpmMetricsGet(got)
        return {name: (got.metrics[k].value if got.metrics[k].nvmlReturn == pynvml.NVML_SUCCESS
                       else f"error {got.metrics[k].nvmlReturn}") for k, name in enumerate(GPM_METRICS)}


def cost_us(fn, n: int = 200) -> float:
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t0) / n * 1e6


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seconds", type=float, default=70)
    p.add_argument("--json", metavar="PATH")
    args = p.parse_args()
    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    out: dict[str, object] = {"idle_buffer": span(samples(handle, 0))}
    gpm = Gpm(handle)
    out["gpm_supported"] = gpm.supported if gpm.error is None else f"no: {gpm.error}"
    load = subprocess.Popen([sys.executable, "-c", LOAD, str(args.seconds)])
    timed: list[tuple[float, int]] = []
    stop = threading.Event()

    def sampler() -> None:  # what the daemon does now: the rate every second
        while not stop.wait(1.0):
            timed.append((time.time(), pynvml.nvmlDeviceGetUtilizationRates(handle).gpu))

    threading.Thread(target=sampler, daemon=True).start()
    time.sleep(6)
    reads = []
    last = samples(handle, 0)[-1][0] if samples(handle, 0) else 0
    whole = gpm.snapshot() if gpm.supported else None
    mark = whole
    begun = time.time()
    for gap in (10, 20, 30):
        t0 = time.time()
        time.sleep(gap)
        now = gpm.snapshot() if gpm.supported else None
        got = samples(handle, last)
        window = [v for t, v in got if t > t0 * 1e6]
        rates = [u for t, u in timed if t0 < t <= time.time()]
        covered = (got[-1][0] - max(last, got[0][0])) / 1e6 if len(got) > 1 else 0.0
        reads.append({"gap_s": gap, **span(got), "first_after_last_ms": (got[0][0] - last) / 1e3 if got else None,
                      "covered_s": covered, "mean_samples": statistics.fmean(window) if window else None,
                      "mean_1s_sampler": statistics.fmean(rates) if rates else None,
                      "gpm": gpm.metrics(mark, now) if now is not None else None})
        mark = now
        if got:
            last = got[-1][0]
    out["busy_buffer"] = span(samples(handle, 0))
    if whole is not None:
        rates = [u for t, u in timed if begun < t <= time.time()]
        out["whole_60s"] = {"gpm": gpm.metrics(whole, gpm.snapshot()),
                            "mean_1s_sampler": statistics.fmean(rates) if rates else None}
    out["reads_since_last"] = reads
    recent = samples(handle, 0)
    since = recent[-5][0] if len(recent) >= 5 else 0
    out["cost_us"] = {"GetUtilizationRates": cost_us(lambda: pynvml.nvmlDeviceGetUtilizationRates(handle)),
                      "GetSamples(since 5 back)": cost_us(lambda: samples(handle, since)),
                      "GetSamples(0, whole buffer)": cost_us(lambda: samples(handle, 0))}
    if gpm.supported:
        a, b = gpm.snapshot(), gpm.snapshot()
        out["cost_us"]["GpmSampleGet"] = cost_us(lambda: pynvml.nvmlGpmSampleGet(handle, a), 50)
        pynvml.nvmlGpmSampleGet(handle, b)
        out["cost_us"]["GpmMetricsGet (3 metrics)"] = cost_us(lambda: gpm.metrics(a, b), 50)
    stop.set()
    load.wait()
    pynvml.nvmlShutdown()
    print(json.dumps(out, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
