"""Process group setup for `torchrun`: nccl on CUDA, gloo on CPU; a plain run is world size 1."""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class Dist:
    rank: int
    local_rank: int
    world: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def resolve_device(requested: str) -> str:
    if requested == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return requested


def setup(requested_device: str) -> Dist:
    """Read torchrun's environment; initialise the process group only when there is more than one rank."""
    kind = resolve_device(requested_device)
    if kind == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda: no CUDA device is visible (use --device cpu or auto)")
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if kind == "cuda":
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
    if world > 1:
        dist.init_process_group(backend="nccl" if kind == "cuda" else "gloo",
                                device_id=device if kind == "cuda" else None)
    return Dist(rank, local_rank, world, device)


def all_mean(value: torch.Tensor, d: Dist) -> torch.Tensor:
    """Mean over ranks (identity at world 1), so every rank logs and decides on the same number."""
    if d.world > 1:
        value = value.clone()
        dist.all_reduce(value, op=dist.ReduceOp.SUM)
        value /= d.world
    return value


def any_rank(flag: bool, d: Dist) -> bool:
    """True if any rank says so: a signal seen by one rank stops all of them at the same step."""
    if d.world == 1:
        return flag
    t = torch.tensor([1.0 if flag else 0.0], device=d.device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item())


def barrier(d: Dist) -> None:
    if d.world > 1:
        dist.barrier()


def teardown(d: Dist) -> None:
    """Every rank reaches the end before the group goes: a rank that tears down while another is still
    in a collective makes gloo abort the process ("terminate called without an active exception")."""
    if d.world > 1 and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
