"""Batches as a pure function of (seed, step): exact resume and world-size-independent data order.

Every step draws its global batch of sample indices from `default_rng([seed, step])`; rank r takes its
contiguous shard and splits it into backward chunks. Augmentation parameters are drawn for the whole
global batch from `default_rng([seed, step, 1])` and sliced the same way, so world=2 sees exactly the
samples (and augmentations) that world=1 sees. There is no loader state to save: the step is the
position. Images are rendered here, inside DataLoader workers on GPU runs.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch.utils.data import Dataset

from trainer.data import STATE_DIM, Corpus, Stats
from trainer.recipe import DataConfig

RENDER_BLOCK = 1024  # samples rendered at a time, to bound temporary float memory


@dataclass(frozen=True)
class Samples:
    """(episode, time) pairs that start a full action chunk."""

    episode: np.ndarray
    time: np.ndarray


def samples(corpus: Corpus, chunk_len: int, eval_split: bool) -> Samples:
    episodes = np.flatnonzero(corpus.is_eval == eval_split)
    times = np.arange(corpus.actions.shape[1] - chunk_len + 1)
    return Samples(np.repeat(episodes, len(times)), np.tile(times, len(episodes)))


def _blobs(centres: np.ndarray, size: int, sigma: float) -> np.ndarray:
    """Gaussian blobs [n, size, size] at centres [n, m, 2] in unit coordinates, summed over m."""
    grid = (np.arange(size, dtype=np.float32) + 0.5) / size
    dx = grid[None, None, :] - centres[:, :, 0:1]  # [n, m, W]
    dy = grid[None, None, :] - centres[:, :, 1:2]  # [n, m, H]
    gx = np.exp(-(dx**2) / (2 * sigma**2))
    gy = np.exp(-(dy**2) / (2 * sigma**2))
    return np.einsum("nmh,nmw->nhw", gy, gx)


def render(gripper: np.ndarray, target: np.ndarray, obstacles: np.ndarray, size: int, channels: int,
           out: np.ndarray) -> None:
    """Draw target, gripper and obstacles into `out` ([n, channels, size, size] uint8)."""
    for lo in range(0, len(gripper), RENDER_BLOCK):
        hi = lo + RENDER_BLOCK
        layers = [_blobs(target[lo:hi, None], size, 0.07), _blobs(gripper[lo:hi, None], size, 0.05),
                  _blobs(obstacles[lo:hi], size, 0.09)]
        grey = (layers[0] + 0.6 * layers[1] + 0.35 * layers[2])[:, None]
        image = np.stack(layers, axis=1) if channels == 3 else grey
        out[lo:hi] = (np.clip(image, 0.0, 1.0) * 255).astype(np.uint8)


class Batcher:
    """Builds normalised micro-batches (CPU tensors) from the corpus."""

    def __init__(self, corpus: Corpus, stats: Stats, cfg: DataConfig) -> None:
        self.corpus, self.stats, self.cfg = corpus, stats, cfg

    def build(self, picked: Samples, augment: dict[str, np.ndarray] | None = None) -> dict[str, torch.Tensor]:
        c, cfg, n = self.corpus, self.cfg, len(picked.episode)
        # The image is the big allocation; make it a torch tensor first so an oversized batch fails in
        # the torch allocator (the message babysit classifies as OOM) and can be pinned later.
        images = torch.empty((n, cfg.channels, cfg.image_size, cfg.image_size), dtype=torch.uint8)
        e, t = picked.episode, picked.time
        render(c.gripper[e, t], c.target[e, t], c.obstacles[e], cfg.image_size, cfg.channels, images.numpy())
        if augment is not None:
            _augment(images.numpy(), augment)
        state = np.zeros((n, STATE_DIM), np.float32)
        state[:, :2], state[:, 2:4] = c.gripper[e, t], c.velocity[e, t]
        state[np.arange(n), 4 + c.dataset_id[e]] = 1.0
        state = (state - self.stats.state_mean) / self.stats.state_std
        window = t[:, None] + np.arange(cfg.chunk_len)[None, :]
        actions = (c.actions[e[:, None], window] - self.stats.action_mean) / self.stats.action_std
        return {"image": images, "state": torch.from_numpy(state),
                "actions": torch.from_numpy(actions.astype(np.float32)),
                "dataset": torch.from_numpy(c.dataset_id[e])}


def _augment(images: np.ndarray, params: dict[str, np.ndarray]) -> None:
    """Brightness jitter and a 1-pixel shift on the samples whose coin came up (in place)."""
    chosen = np.flatnonzero(params["apply"])
    if len(chosen) == 0:
        return
    size = images.shape[-1]
    rows = np.clip(np.arange(size)[None, :] + params["dy"][chosen, None], 0, size - 1)
    cols = np.clip(np.arange(size)[None, :] + params["dx"][chosen, None], 0, size - 1)
    sub = images[chosen][np.arange(len(chosen))[:, None, None, None], np.arange(images.shape[1])[None, :, None, None],
                         rows[:, None, :, None], cols[:, None, None, :]]
    scaled = sub.astype(np.float32) * params["brightness"][chosen, None, None, None]
    images[chosen] = np.clip(scaled, 0, 255).astype(np.uint8)


@dataclass(frozen=True)
class Layout:
    """How one step's global batch is split: world ranks x backward chunks x micro-batch."""

    global_batch: int
    world: int
    rank: int
    chunks: int

    @property
    def micro(self) -> int:
        return self.global_batch // (self.world * self.chunks)


class StepData(Dataset):
    """Item i is micro-batch (step = first_step + i // chunks, chunk = i % chunks) of this rank.

    A map-style dataset read in order, so DataLoader workers and prefetching change nothing about
    which samples a step sees.
    """

    def __init__(self, batcher: Batcher, train: Samples, layout: Layout, seed: int, first_step: int,
                 last_step: int) -> None:
        self.batcher, self.train, self.layout, self.seed = batcher, train, layout, seed
        self.first_step, self.last_step = first_step, last_step

    def __len__(self) -> int:
        return max(0, self.last_step - self.first_step + 1) * self.layout.chunks

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        lay = self.layout
        step, chunk = self.first_step + i // lay.chunks, i % lay.chunks
        picks = np.random.default_rng([self.seed, step]).integers(0, len(self.train.episode), lay.global_batch)
        lo = lay.rank * lay.micro * lay.chunks + chunk * lay.micro
        mine = picks[lo : lo + lay.micro]
        augment = None
        p = self.batcher.cfg.image_augment
        if p > 0:
            rng = np.random.default_rng([self.seed, step, 1])
            full = {"apply": rng.random(lay.global_batch) < p,
                    "brightness": rng.uniform(0.7, 1.3, lay.global_batch).astype(np.float32),
                    "dx": rng.integers(-1, 2, lay.global_batch), "dy": rng.integers(-1, 2, lay.global_batch)}
            augment = {k: v[lo : lo + lay.micro] for k, v in full.items()}
        return self.batcher.build(Samples(self.train.episode[mine], self.train.time[mine]), augment)
