"""Throughput benchmark of the reference trainer: samples/s, step time, data wait, GPU utilisation.

Runs `python -m trainer` (or `torchrun --nproc-per-node 2 -m trainer` with `--ddp 2`) on a recipe for
N steps, samples GPU utilisation with NVML while it runs, and reads the trainer's own JSONL log for the
timing. Prints one markdown table row and one JSON object. Targets: GPU util >= 90 %, data wait <= 5 %.

  python bench/trainer_throughput.py --steps 200                     # gpu recipe, one GPU
  python bench/trainer_throughput.py --steps 200 --ddp 2             # two GPUs via torchrun
  python bench/trainer_throughput.py --device cpu --steps 20         # CPU check (tiny recipe)
  python bench/trainer_throughput.py --steps 50 -- --grad-checkpointing --backward-chunks 1
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
WARMUP_RECORDS = 1  # the first train record includes compilation, allocator warm-up and worker start


class GpuSampler(threading.Thread):
    """Polls NVML utilisation every `interval` s; `samples` stays empty when NVML is unavailable."""

    def __init__(self, interval: float = 0.5) -> None:
        super().__init__(daemon=True)
        self.interval, self.samples, self.error = interval, [], None
        self._stop = threading.Event()

    def run(self) -> None:
        try:
            import pynvml  # lazy: nvidia-ml-py is only useful on a GPU machine

            pynvml.nvmlInit()
            handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
        except Exception as exc:  # no driver, no library: report "not measured", never a made-up number
            self.error = f"NVML unavailable ({type(exc).__name__}: {exc}); verify nvidia-ml-py matches the driver"
            return
        next_tick = time.monotonic()
        while not self._stop.is_set():
            now = time.time()
            self.samples.append((now, [pynvml.nvmlDeviceGetUtilizationRates(h).gpu for h in handles]))
            next_tick += self.interval
            self._stop.wait(max(0.0, next_tick - time.monotonic()))

    def stop(self) -> None:
        self._stop.set()


def summarise(records: list[dict[str, Any]], gpu: GpuSampler, gpus_used: int) -> dict[str, Any]:
    train = [r for r in records if "samples_per_s" in r][WARMUP_RECORDS:]
    if not train:
        raise SystemExit("bench: no train records after warm-up; run more --steps (or a lower --log-every)")
    steady_from = train[0]["ts"]
    util = [sum(u[:gpus_used]) / gpus_used for ts, u in gpu.samples if ts >= steady_from and u]
    return {
        "samples_per_s": round(statistics.mean(r["samples_per_s"] for r in train), 2),
        "step_time_s": round(statistics.mean(r["step_time_s"] for r in train), 4),
        "data_wait_frac": round(statistics.mean(r["data_wait_frac"] for r in train), 4),
        "gpu_util_pct": round(statistics.mean(util), 1) if util else None,
        "gpu_util_note": gpu.error if gpu.error else (None if util else "no NVML samples in steady state"),
        "max_memory_allocated_gib": max((r["max_memory_allocated_gib"] for r in train
                                         if "max_memory_allocated_gib" in r), default=None),  # CUDA only
        "peak_rss_gib": max(r["peak_rss_gib"] for r in train),
        "steps_measured": train[-1]["step"] - train[0]["step"] + 1,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--recipe", help="trainer recipe (default: gpu; tiny with --device cpu)")
    p.add_argument("--steps", type=int, default=200, help="steps to run (default 200)")
    p.add_argument("--device", choices=("cuda", "cpu", "auto"), default="auto")
    p.add_argument("--ddp", type=int, default=1, metavar="N", help="ranks via torchrun (needs N GPUs)")
    p.add_argument("--log-every", type=int, default=10, help="train record interval (default 10)")
    p.add_argument("--workdir", type=Path, help="keep the log and checkpoints here (default: a temp dir)")
    p.add_argument("trainer_args", nargs="*", help="extra trainer flags after `--`")
    args = p.parse_args(argv)
    recipe = args.recipe or ("tiny" if args.device == "cpu" else "gpu")
    if args.device == "cpu" and args.recipe is None:
        print("bench: --device cpu: using the tiny recipe (the gpu recipe is far too big for a CPU)",
              file=sys.stderr)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="trainer-bench-"))
    log = workdir / "train_log.jsonl"
    log.unlink(missing_ok=True)
    flags = ["--recipe", recipe, "--steps", str(args.steps), "--device", args.device, "--log-path", str(log),
             "--checkpoints", str(workdir / "checkpoints"), "--log-every", str(args.log_every),
             "--eval-every", "0", "--save-every", "0", *args.trainer_args]
    if args.ddp > 1:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(args.ddp),
               "-m", "trainer", *flags]
    else:
        cmd = [sys.executable, "-m", "trainer", *flags]
    print("bench: " + " ".join(cmd), file=sys.stderr)
    gpu = GpuSampler()
    gpu.start()
    started = time.time()
    result = subprocess.run(cmd, cwd=REPO)
    gpu.stop()
    if result.returncode != 0:
        print(f"bench: trainer exited {result.returncode} (see its stderr above); no numbers", file=sys.stderr)
        return result.returncode
    records = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    summary = {"recipe": recipe, "device": args.device, "ranks": args.ddp, "steps": args.steps,
               "wall_s": round(time.time() - started, 1), **summarise(records, gpu, args.ddp)}
    start = records[0].get("config", {})
    summary.update(effective_batch=start.get("effective_batch"), micro_batch=start.get("micro_batch"))
    util = summary["gpu_util_pct"]
    ok_util = "n/a" if util is None else ("ok" if util >= 90 else "LOW")
    ok_wait = "ok" if summary["data_wait_frac"] <= 0.05 else "HIGH"
    print("| recipe | ranks | eff. batch | samples/s | step s | data wait | GPU util | max mem GiB |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    print(f"| {recipe} | {args.ddp} | {summary['effective_batch']} | {summary['samples_per_s']} | "
          f"{summary['step_time_s']} | {summary['data_wait_frac']:.1%} ({ok_wait}) | "
          f"{'n/a' if util is None else f'{util}%'} ({ok_util}) | {summary['max_memory_allocated_gib']} |")
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
