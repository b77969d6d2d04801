"""The training run, top to bottom: devices, data, model, optimizer, resume, the loop.

Only rank 0 writes the log and checkpoints. The loop checks three things every step: a non-finite
loss (exit 11), a stop request from SIGTERM/SIGINT (save, exit 10) and whether it is time to log,
evaluate or save.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import random
import resource
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader

from trainer import checkpoint, distributed, exitcodes
from trainer.batches import Batcher, Layout, StepData, samples
from trainer.data import ACTION_DIM, STATE_DIM, load_or_compute_stats, load_or_generate
from trainer.evaluate import eval_record, fixed_train_slice, probe_set
from trainer.log import RANK_LOG_ENV, RankBeat, RunLog
from trainer.model import ModelArgs, build
from trainer.recipe import Recipe, TrainConfig


@dataclass(frozen=True)
class RunConfig:
    recipe: Recipe
    log_path: Path
    checkpoint_dir: Path
    data_cache: Path
    resume: bool
    inject_nan_at_step: int | None = None
    inject_step_delay: float = 0.0  # test hook: seconds slept each step (--inject-step-delay)


def lr_at(step: int, t: TrainConfig) -> float:
    """Linear warmup, then constant or cosine down to min_lr_frac of the peak."""
    peak = t.lr * t.lr_scale
    if step <= t.warmup_steps:
        return peak * step / max(1, t.warmup_steps)
    if t.schedule == "constant":
        return peak
    progress = (step - t.warmup_steps) / max(1, t.steps - t.warmup_steps)
    return peak * (t.min_lr_frac + (1 - t.min_lr_frac) * 0.5 * (1 + math.cos(math.pi * min(progress, 1.0))))


def model_args(recipe: Recipe) -> ModelArgs:
    m, d = recipe.model, recipe.data
    return ModelArgs(kind=m.kind, width=m.width, depth=m.depth, dropout=m.dropout, patch=m.patch,
                     heads=m.heads, image_size=d.image_size, channels=d.channels, state_dim=STATE_DIM,
                     chunk_len=d.chunk_len, action_dim=ACTION_DIM)


def step_seed(seed: int, step: int, rank: int) -> int:
    """Dropout randomness is a function of (seed, step, rank): resume needs no RNG bookkeeping to be exact."""
    return int(np.random.SeedSequence([seed, step, rank]).generate_state(1)[0])


def backward_chunks(model: nn.Module, micro_batches: list[dict[str, torch.Tensor]], autocast: Any,
                    no_sync_all_but_last: bool, nan_now: bool = False) -> torch.Tensor:
    """Forward/backward every micro-batch; gradients accumulate to the mean over the whole batch.

    Each chunk's loss is divided by the number of chunks, so 1 chunk of B and 4 chunks of B/4 give
    the same gradient. Under DDP, `no_sync` skips the all-reduce on all but the last chunk; without it
    every chunk all-reduces, which gives the same sum.
    """
    n = len(micro_batches)
    losses = []
    for i, batch in enumerate(micro_batches):
        sync_off = no_sync_all_but_last and isinstance(model, DDP) and i < n - 1
        # DDP decides at forward time whether this backward all-reduces, so no_sync wraps both.
        with model.no_sync() if sync_off else contextlib.nullcontext():
            with autocast:
                pred = model(batch["image"].float() / 255.0, batch["state"])
            loss = F.mse_loss(pred.float(), batch["actions"])
            if nan_now:
                loss = loss * float("nan")  # test hook: --inject-nan-at-step
            (loss / n).backward()
        losses.append(loss.detach())
    return torch.stack(losses).mean()


class StopFlag:
    """SIGTERM/SIGINT only set a flag; the loop finishes the step, saves and exits 10."""

    def __init__(self) -> None:
        self.reason: str | None = None
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._handle)

    def _handle(self, signum: int, _frame: object) -> None:
        self.reason = signal.Signals(signum).name


def _to_device(batch: dict[str, torch.Tensor], device: torch.device) -> dict[str, torch.Tensor]:
    return {k: v.to(device, non_blocking=True) for k, v in batch.items()}


def _rng_states() -> dict[str, Any]:
    states = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        states["cuda"] = torch.cuda.get_rng_state_all()
    return states


def _restore_rng(states: dict[str, Any]) -> None:
    random.setstate(states["python"])
    np.random.set_state(states["numpy"])
    torch.set_rng_state(states["torch"])
    if "cuda" in states and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states["cuda"])


def _worker_init(_worker_id: int) -> None:
    torch.set_num_threads(1)  # workers render with numpy; torch threads there only oversubscribe
    # A stop is the main process's to handle (checkpoint, exit 10): torchrun signals each rank's whole
    # process group, and a worker killed first would crash the main process before it can save. The
    # workers end with the main process (PyTorch's watchdog), or with SIGKILL after the grace.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, signal.SIG_IGN)


def _peak_rss_gib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024**2  # Linux reports KiB


def run(cfg: RunConfig) -> int:
    recipe, t = cfg.recipe, cfg.recipe.train
    d = distributed.setup(t.device)
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", str(d.world)))
    if "OMP_NUM_THREADS" not in os.environ:  # the user's (or torchrun's) setting wins, as in every torch program
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // local_world))
    cuda = d.device.type == "cuda"
    if cuda:
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    log = RunLog(cfg.log_path, enabled=d.is_main)
    beats = RankBeat(os.environ.get(RANK_LOG_ENV), d.rank)
    stop = StopFlag()

    # Data: rank 0 generates and caches the corpus, the other ranks read the cache.
    if d.is_main:
        corpus = load_or_generate(recipe.data, cfg.data_cache)
        stats = load_or_compute_stats(corpus, recipe.data, cfg.data_cache, t.recompute_stats)
    distributed.barrier(d)
    if not d.is_main:
        corpus = load_or_generate(recipe.data, cfg.data_cache)
        stats = load_or_compute_stats(corpus, recipe.data, cfg.data_cache, recompute=False)
    batcher = Batcher(corpus, stats, recipe.data)
    train_samples = samples(corpus, recipe.data.chunk_len, eval_split=False)
    layout = Layout(t.batch_size, d.world, d.rank, t.backward_chunks)

    # Model and optimizer: identical init on every rank (DDP also broadcasts rank 0's weights).
    torch.manual_seed(t.seed)
    args = model_args(recipe)
    core = build(args, recipe.model.grad_checkpointing).to(d.device)
    decay = [p for p in core.parameters() if p.dim() >= 2]
    no_decay = [p for p in core.parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": t.weight_decay},
                                   {"params": no_decay, "weight_decay": 0.0}], lr=t.lr, fused=cuda)

    start = 0
    resumed = None
    if cfg.resume:
        ckpt = checkpoint.load_latest(cfg.checkpoint_dir)
        if ckpt is None:
            print(f"babysit-trainer: --resume latest: no checkpoint in {cfg.checkpoint_dir}, starting fresh",
                  file=sys.stderr)
        else:
            core.load_state_dict(ckpt["model"])
            optimizer.load_state_dict(ckpt["optimizer"])
            _restore_rng(ckpt["rng"])
            start = resumed = ckpt["step"]
            print(f"babysit-trainer: resumed from {cfg.checkpoint_dir / f'step_{start:06d}.pt'}", file=sys.stderr)

    model: nn.Module = core
    if t.compile:
        model = torch.compile(model)
    if d.world > 1:
        model = DDP(model, device_ids=[d.local_rank] if cuda else None)
    autocast = torch.autocast(d.device.type, dtype=torch.bfloat16, enabled=t.precision == "bf16")

    eval_on = t.eval_every > 0
    if eval_on and d.is_main:
        eval_probe = probe_set(batcher, samples(corpus, recipe.data.chunk_len, eval_split=True), d.device)
        train_probe = probe_set(batcher, fixed_train_slice(train_samples, recipe.data.train_slice,
                                                           recipe.data.data_seed), d.device)
        action_std = torch.from_numpy(stats.action_std).to(d.device)

    def save(step: int) -> None:
        if not d.is_main:
            return
        checkpoint.save(cfg.checkpoint_dir, step, {
            "model_args": dataclasses.asdict(args), "model": core.state_dict(),
            "optimizer": optimizer.state_dict(), "recipe": dataclasses.asdict(recipe), "recipe_name": recipe.name,
            "rng": _rng_states(), "world_size": d.world,
            "data_position": {"next_step": step + 1, "samples_seen": step * t.batch_size, "seed": t.seed},
        })

    # Numbers in the start record live under "config": top-level numeric keys are metrics (docs/trainer.md).
    log.write(start, event="start", device=str(d.device), recipe=recipe.name, precision=t.precision,
              config={"world_size": d.world, "effective_batch": t.batch_size, "micro_batch": layout.micro,
                      "backward_chunks": t.backward_chunks, "resumed_from_step": resumed, "steps": t.steps,
                      "lr": t.lr * t.lr_scale, "seed": t.seed, "eval_every": t.eval_every,
                      "image_augment": recipe.data.image_augment,
                      "grad_checkpointing": recipe.model.grad_checkpointing,
                      "parameters": sum(p.numel() for p in core.parameters())})

    data = StepData(batcher, train_samples, layout, t.seed, first_step=start + 1, last_step=t.steps)
    workers = t.num_workers
    loader = DataLoader(data, batch_size=None, shuffle=False, num_workers=workers, pin_memory=cuda,
                        prefetch_factor=t.prefetch_factor if workers > 0 else None,
                        worker_init_fn=_worker_init if workers > 0 else None)
    batches = iter(loader)
    params = [p for p in core.parameters()]
    window_time = window_wait = 0.0
    window_steps = 0
    model.train()
    for step in range(start + 1, t.steps + 1):
        t0 = time.perf_counter()
        if cfg.inject_step_delay:
            time.sleep(cfg.inject_step_delay)
        torch.manual_seed(step_seed(t.seed, step, d.rank))
        lr = lr_at(step, t)
        for group in optimizer.param_groups:
            group["lr"] = lr
        micro_batches = []
        for _ in range(t.backward_chunks):
            tw = time.perf_counter()
            micro_batches.append(_to_device(next(batches), d.device))
            window_wait += time.perf_counter() - tw
        ready_s = time.perf_counter() - t0  # this rank's own share before it joins the step's all-reduce
        loss = backward_chunks(model, micro_batches, autocast, t.chunk_grad_allreduce,
                               nan_now=cfg.inject_nan_at_step == step)
        loss_value = float(distributed.all_mean(loss, d))
        if not math.isfinite(loss_value):
            log.write(step, event="diverged", reason=f"non-finite train_loss ({loss_value})")
            print(f"babysit-trainer: diverged at step {step}: non-finite train_loss ({loss_value})",
                  file=sys.stderr)
            return _finish(log, d, exitcodes.DIVERGED)
        grad_norm = torch.nn.utils.clip_grad_norm_(params, t.grad_clip if t.grad_clip > 0 else math.inf)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        window_time += time.perf_counter() - t0
        window_steps += 1
        beats.beat(step, time.perf_counter() - t0, ready_s)

        if step % t.log_every == 0 or step == t.steps:
            record = {"train_loss": loss_value, "lr": lr, "grad_norm": round(float(grad_norm), 6),
                      "samples_per_s": round(t.batch_size * window_steps / window_time, 3),
                      "step_time_s": round(window_time / window_steps, 6),
                      "data_wait_frac": round(window_wait / window_time, 6),
                      "peak_rss_gib": round(_peak_rss_gib(), 4)}
            if cuda:
                record["max_memory_allocated_gib"] = round(torch.cuda.max_memory_allocated() / 1024**3, 4)
            log.write(step, **record)
            window_time = window_wait = 0.0
            window_steps = 0
        if eval_on and d.is_main and (step % t.eval_every == 0 or step == t.steps):
            log.write(step, **eval_record(core, eval_probe, train_probe, action_std, autocast,
                                          t.eval_dataset_breakdown))
        if t.save_every and step % t.save_every == 0:
            save(step)
        if distributed.any_rank(stop.reason is not None, d) and step < t.steps:
            if not (t.save_every and step % t.save_every == 0):
                save(step)
            reason = stop.reason or "SIGTERM"
            log.write(step, event="stopped", reason=reason)
            print(f"babysit-trainer: stopped on {reason} after step {step}; checkpoint saved", file=sys.stderr)
            return _finish(log, d, exitcodes.STOPPED)
    log.write(t.steps, event="completed")
    return _finish(log, d, exitcodes.COMPLETED)


def _finish(log: RunLog, d: distributed.Dist, code: int) -> int:
    log.close()
    distributed.teardown(d)
    return code
