"""Where one GPU read goes: `NvmlGpuProbe.read([gpu])` and its parts, each timed alone (issue 26's GPU read).

  python bench/gpu_read_parts.py                        # on the H200: real NVML, GPU 0
  python bench/gpu_read_parts.py --before DIR           # and the code in DIR (bash bench/export_before.sh REV DIR)
  python bench/gpu_read_parts.py --json out/parts.json

Parts: the read; the timed worker's handoff (an empty job); the read's work on this thread (`_read_now`:
the window's sample, the events, `_read_gpu`); `_read_gpu` alone; the health batch (`health.read_fields`);
the round's fields through pynvml's `nvmlDeviceGetFieldValues` and through the array prepared once
(probes/nvml_fields.py); the read's main NVML calls on this thread and as one job on the worker (their
difference less the handoff: what running them on another thread costs; `taskset -c N python …`, every
thread on one core, takes a second core's wake-up out of the handoff); and the NVML calls of a read one by
one. Medians of `--n` calls. A part the code
does not have (43c3b3c has no worker and no health batch) is "—". `--before DIR` runs this same script in a
child with DIR first on PYTHONPATH, after this code's run: the same parts, the same machine, minutes apart.

Without NVML (no driver here) it says so and times the same parts over the tests' NVML stand-in
(tests/nvml_standin.py: Python functions, and a ctypes callback standing in for NVML's C field function,
answering at once with every field 0): those rows are babysit's and pynvml's Python, not NVML's cost.
"""

from __future__ import annotations

import argparse
import inspect
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import code_args, emit, fmt_us, measured_code, summary, time_calls

# the rows, in order: (key, label)
PARTS = (
    ("read", "`NvmlGpuProbe.read([gpu])`"),
    ("read_cpu", "`NvmlGpuProbe.read([gpu])`: CPU of every thread (mean, `time.process_time`)"),
    ("handoff", "the timed worker's handoff (an empty job)"),
    ("calls", "the read's main NVML calls (memory, processes, the round's fields) on this thread"),
    ("calls_worker", "the same calls as one job on the timed worker"),
    ("read_now", "`_read_now` on this thread (sample, events, `_read_gpu`)"),
    ("sample", "the window's sample (`_sample_gpu`)"),
    ("read_gpu", "`_read_gpu` alone"),
    ("read_fields", "the health batch (`health.read_fields`)"),
    ("fields_wrapper", "the round's fields: pynvml's `nvmlDeviceGetFieldValues`"),
    ("fields_prepared", "the round's fields: the prepared array (`FieldBatch.fetch`)"),
    ("processes", "`nvmlDeviceGetComputeRunningProcesses`"),
    ("memory", "`nvmlDeviceGetMemoryInfo`"),
    ("utilization", "`nvmlDeviceGetUtilizationRates` (the window's sample)"),
    ("reasons", "`nvmlDeviceGetCurrentClocksEventReasons`"),
    ("temperature", "`nvmlDeviceGetTemperature`"),
)


def stand_in() -> Any:
    """The tests' stand-in with pynvml's own field wrapper over a C-callable that answers at once, leaving the
    array as pynvml builds it (every field SUCCESS, 0: a healthy GPU), but for the NVLink fields of the first
    read (every field), NOT_SUPPORTED as on a single H200, so the round asks what the H200's asks."""
    import pynvml

    from tests.nvml_standin import CFieldsStandIn

    nvlink = {getattr(pynvml, const) for const in dir(pynvml) if const.startswith("NVML_FI_DEV_NVLINK_")}

    class Quick(CFieldsStandIn):
        def _field_values_c(self, device: Any, count: int, values: Any) -> int:
            if count >= 9:
                for k in range(count):
                    if values[k].fieldId in nvlink:
                        values[k].nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED
            return 0

    return Quick(gpus=1)


def measure(n: int, gpu: int, window: str, nv: Any) -> dict[str, Any]:
    """Every part this code has, timed `n` times; `nv` None: the real pynvml."""
    import babysit
    from babysit.probes.gpu import NvmlGpuProbe

    wanted = inspect.signature(NvmlGpuProbe).parameters
    kwargs: dict[str, Any] = {} if nv is None else {"library": nv}
    if "events_thread" in wanted:
        kwargs["events_thread"] = True  # as the daemon's probe: events on a thread of their own
    probe = NvmlGpuProbe(**kwargs)
    out: dict[str, Any] = {"code": str(Path(babysit.__file__).resolve().parents[1])}
    try:
        view = probe.read([gpu], window)  # initialise: handles, events, the counters' first values
        if not view.available:
            raise SystemExit(f"no GPU to read: {view.reason}")
        probe.read([gpu], window)
        lib, h = probe._nv, probe._handle(gpu)
        timed: dict[str, Callable[[], Any]] = {"read": lambda: probe.read([gpu], window)}
        caller = getattr(probe, "_caller", None)
        if caller is not None:
            timed["handoff"] = lambda: caller.call(_nothing)
        if hasattr(probe, "_read_now"):
            timed["read_now"] = lambda: probe._read_now([gpu], window)
        timed["sample"] = lambda: probe._sample_gpu(gpu)
        timed["read_gpu"] = lambda: probe._read_gpu(gpu, window)
        state = getattr(probe, "_fields", {}).get(gpu)
        if state is not None:
            from babysit.probes import health

            call = probe._call_for(gpu)
            timed["read_fields"] = lambda: health.read_fields(call, lib, h, state, 0.0)
            # the round's fields (the PCIe counter is read once a minute), as the code's state has them
            batches = getattr(state, "batches", None)
            names = [n for n in state.names if n not in health.SLOW_FIELDS]
            ids = [i for n, i in zip(state.names, state.field_ids or [], strict=False) if n not in health.SLOW_FIELDS]
            timed["fields_wrapper"] = lambda: lib.nvmlDeviceGetFieldValues(h, ids)
            if batches is not None and batches[0].fetch is not None:
                timed["fields_prepared"] = lambda: batches[0].fetch(h)
                # the same answer both ways (each field's value type, return code and value)?
                wrapped = batches[0].answer(lib.nvmlDeviceGetFieldValues(h, ids))
                out["same_answer"] = wrapped is not None and wrapped == batches[0].answer(batches[0].fetch(h))
            out["fields"] = names
        if caller is not None:
            fields = getattr(state, "batches", None)
            fetch = fields[0].fetch if fields is not None and fields[0].fetch is not None else None

            def calls() -> None:
                lib.nvmlDeviceGetMemoryInfo(h)
                lib.nvmlDeviceGetComputeRunningProcesses(h)
                if fetch is not None:
                    fetch(h)

            timed["calls"] = calls
            timed["calls_worker"] = lambda: caller.call(calls)
        timed["processes"] = lambda: lib.nvmlDeviceGetComputeRunningProcesses(h)
        timed["memory"] = lambda: lib.nvmlDeviceGetMemoryInfo(h)
        timed["utilization"] = lambda: lib.nvmlDeviceGetUtilizationRates(h)
        timed["reasons"] = lambda: lib.nvmlDeviceGetCurrentClocksEventReasons(h)
        timed["temperature"] = lambda: lib.nvmlDeviceGetTemperature(h, lib.NVML_TEMPERATURE_GPU)
        for key, fn in timed.items():
            try:
                fn()
                out[key] = summary(time_calls(fn, n))
            except Exception as exc:  # a call this GPU or stand-in does not answer: said, not timed
                out[key] = {"n": 0, "error": f"{type(exc).__name__}: {exc}"}
        out["read_cpu"] = read_cpu(timed["read"], n)
        reading = probe.read([gpu], window).gpu(gpu)
        out["reading"] = {"errors": list(reading.errors), "faults": list(reading.faults),
                          "signals": [s.kind for s in getattr(reading, "signals", ())],
                          "processes": len(reading.processes), "util_samples": reading.util_samples}
    finally:
        probe.close()
    return out


def read_cpu(read: Callable[[], Any], n: int) -> dict[str, float]:
    """The CPU a read costs the process, every thread's (the worker's handoff is mostly waiting for a thread
    to wake, which the wall-clock rows count and this does not): the mean of `n` reads, as median and p90."""
    cpu0 = time.process_time()
    for _ in range(n):
        read()
    mean = (time.process_time() - cpu0) / n * 1e6
    return {"n": n, "median_us": mean, "p90_us": mean}


def _nothing() -> None:
    """The empty job: what a handoff to the worker costs by itself."""


def before_run(before: str, args: argparse.Namespace) -> dict[str, Any]:
    """This script in a child with BEFORE first on PYTHONPATH: the same parts of that code."""
    where = Path(tempfile.mkdtemp(prefix="babysit-parts-")) / "before.json"
    cmd = [sys.executable, str(Path(__file__).resolve()), "--code", str(Path(before).resolve()), "--n", str(args.n),
           "--gpu", str(args.gpu), "--window", args.window, "--json", str(where)]
    if args.stand_in:
        cmd.append("--stand-in")
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return json.loads(where.read_text())["now"]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n", type=int, default=1000, help="timed calls a part (default 1000; medians)")
    p.add_argument("--gpu", type=int, default=0, help="GPU index (default 0)")
    p.add_argument("--window", default="guard", help="the window read (default guard, as bench/poll_cost.py)")
    code_args(p)
    args = p.parse_args(argv)
    why = measured_code(args)
    library = stand_in() if args.stand_in else None
    now = measure(args.n, args.gpu, args.window, library)
    if args.code:  # the child: its figures only
        Path(args.json).write_text(json.dumps({"now": now}, default=str))
        return 0
    before = before_run(args.before, args) if args.before else None

    def cell(data: dict[str, Any] | None, key: str, stat: str) -> str:
        part = (data or {}).get(key)
        if not part:
            return "—"
        return fmt_us(part[stat]) if stat in part else f"({part.get('error', '?')})"

    headers = ["part", "median", "p90"] + (["before: median", "before: p90"] if before else [])
    rows = []
    for key, label in PARTS:
        row = [label, cell(now, key, "median_us"), cell(now, key, "p90_us")]
        if before is not None:
            row += [cell(before, key, "median_us"), cell(before, key, "p90_us")]
        rows.append(row)
    what = (f"STAND-IN (tests/nvml_standin.py; no NVML: {why})" if args.stand_in
            else f"NVML, GPU {args.gpu}")
    fields = ", ".join(now.get("fields", [])) or "—"
    notes = [f"{args.n} calls a part, window {args.window!r}; the round's fields: {fields}",
             f"code: {now['code']}" + (f"; before: {before['code']}" if before else ""),
             f"the read's reading: {now['reading']}"]
    if "same_answer" in now:
        notes.append(f"the prepared array's answer is pynvml's wrapper's: {now['same_answer']}")
    if args.stand_in:
        notes.insert(0, "**A stand-in, not NVML**: every NVML call is a Python function of the tests' stand-in "
                        "(the field values a ctypes callback answering at once); the rows are babysit's and "
                        "pynvml's Python around them. Run on the GPU machine for NVML's figures.")
    emit(f"GPU read parts ({what})", headers, rows,
         {"mode": "stand-in" if args.stand_in else "nvml", "why_stand_in": why if args.stand_in else None,
          "n": args.n, "gpu": args.gpu, "window": args.window, "now": now, "before": before}, args.json, notes)
    return 0


if __name__ == "__main__":
    sys.exit(main())
