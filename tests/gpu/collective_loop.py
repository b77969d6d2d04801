"""A torchrun job whose ranks all-reduce a CUDA tensor in a loop, for the hung-rank scenario on real GPUs.

BACKEND=nccl (default): each rank on its own GPU (LOCAL_RANK); PyTorch's ProcessGroupNCCL keeps the flight
recorder and serves its dump pipe itself (babysit sets TORCH_NCCL_DEBUG_INFO_* at launch).
BACKEND=gloo: both ranks may share one GPU (NCCL refuses two ranks on one device); the dump pipe is served
here with torch's own `_dump_fr_trace`, as tests/fixtures/nccl/gloo_hang.py does on CPU.
Rank 0 appends a record to $BABYSIT_LOG after each synchronised step; a stopped rank stops it.
"""

import json
import os
import sys
import threading
import time
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).parents[1] / "fixtures" / "nccl"))
from gloo_hang import serve_dump_pipe


def main() -> None:
    backend = os.environ.get("BACKEND", "nccl")
    local = int(os.environ["LOCAL_RANK"])
    device = torch.device("cuda", local % torch.cuda.device_count())
    torch.cuda.set_device(device)
    dist.init_process_group(backend, device_id=device if backend == "nccl" else None)
    rank = dist.get_rank()
    if backend == "gloo" and os.environ.get("TORCH_NCCL_DEBUG_INFO_PIPE_FILE"):
        dump = torch._C._distributed_c10d._dump_fr_trace
        threading.Thread(target=serve_dump_pipe, args=(rank, dump), daemon=True).start()
    x = torch.ones(1 << 20, device=device)
    log = os.environ.get("BABYSIT_LOG")
    for step in range(1, 10**9):
        dist.all_reduce(x)
        x.div_(dist.get_world_size())
        torch.cuda.synchronize()
        if rank == 0 and log:
            with open(log, "a") as f:
                f.write(json.dumps({"step": step, "ts": time.time(), "train_loss": 1.0 / step}) + "\n")
        time.sleep(0.05)


if __name__ == "__main__":
    main()
