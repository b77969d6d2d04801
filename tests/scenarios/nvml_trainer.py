"""A torch-free trainer that "holds" a simulated GPU: it adds pids to the FileGpuProbe's JSON the way a
CUDA context shows up in NVML, and leaves them there after it exits, as NVML does for a moment.

    python nvml_trainer.py LOG GPUFILE [--steps N] [--exit C] [--zombie] [--gone] [--on-term-exit C]
      [--on-term-clear]

--zombie: a child that exits unreaped is listed as a holder (NVML lists an exiting process);
--gone: a child is listed, exits and is reaped, and its entry leaves the list 0.3 s later;
--on-term-exit C: SIGTERM makes it exit C (an OOM while being stopped: C = 12); --on-term-clear: the
foreign holders in GPUFILE are removed first (the intruder left).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time


def edit(path: str, fn) -> None:
    with open(path) as f:
        data = json.load(f)
    fn(data["gpus"][0])
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump(data, f)
    os.replace(tmp, path)


def hold(path: str, pid: int, name: str) -> None:
    edit(path, lambda g: g["processes"].append({"pid": pid, "name": name, "used_memory_bytes": 2**30}))


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("log")
    p.add_argument("gpus")
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--exit", type=int, default=0)
    p.add_argument("--zombie", action="store_true")
    p.add_argument("--gone", action="store_true")
    p.add_argument("--on-term-exit", type=int)
    p.add_argument("--on-term-clear", action="store_true")
    args = p.parse_args()

    def on_term(*_: object) -> None:
        if args.on_term_clear:
            edit(args.gpus, lambda g: g.__setitem__("processes", [q for q in g["processes"] if q["name"] != "intruder"]))
        sys.stderr.write("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n")
        os._exit(args.on_term_exit if args.on_term_exit is not None else 10)

    signal.signal(signal.SIGTERM, on_term)
    hold(args.gpus, os.getpid(), "python nvml_trainer.py")
    children = []
    if args.zombie:
        child = subprocess.Popen([sys.executable, "-c", "pass"])
        children.append(child)  # never waited on until the end: a zombie meanwhile
        hold(args.gpus, child.pid, "python -c pass")
    if args.gone:
        child = subprocess.Popen([sys.executable, "-c", "pass"])
        child.wait()
        hold(args.gpus, child.pid, "python -c pass")
        time.sleep(0.3)
        edit(args.gpus, lambda g: g.__setitem__("processes", [q for q in g["processes"] if q["pid"] != child.pid]))
    with open(args.log, "a") as log:
        for step in range(1, args.steps + 1):
            log.write(json.dumps({"step": step, "ts": time.time(), "train_loss": 1.0 / step}) + "\n")
            log.flush()
            time.sleep(0.05)
    if args.exit == 12:
        sys.stderr.write("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n")
    return args.exit


if __name__ == "__main__":
    sys.exit(main())
