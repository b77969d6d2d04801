"""Deterministic evaluation: a fixed eval set and a fixed train slice, scored in RAW action units.

Both sets are rendered once at start-up (no augmentation) and kept on the device, so an eval costs a
few forward passes and nothing else.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from trainer.batches import Batcher, Samples
from trainer.recipe import KNOWN_DATASETS

EVAL_BATCH = 512


@dataclass(frozen=True)
class ProbeSet:
    """A fixed set of samples, already on the device."""

    image: torch.Tensor
    state: torch.Tensor
    actions: torch.Tensor
    dataset: torch.Tensor


def probe_set(batcher: Batcher, picked: Samples, device: torch.device) -> ProbeSet:
    b = batcher.build(picked)
    return ProbeSet(*(b[k].to(device) for k in ("image", "state", "actions", "dataset")))


def fixed_train_slice(train: Samples, size: int, seed: int) -> Samples:
    """The same train samples at every eval (and across resumes): a function of the data seed only."""
    n = len(train.episode)
    idx = np.sort(np.random.default_rng([seed, 7]).permutation(n)[: min(size, n)])
    return Samples(train.episode[idx], train.time[idx])


@torch.no_grad()
def chunk_mae(model: nn.Module, probe: ProbeSet, action_std: torch.Tensor, autocast: torch.autocast,
              ) -> tuple[float, dict[int, float]]:
    """Mean absolute error over every action of every chunk, de-normalised; also per dataset id."""
    was_training = model.training
    model.eval()
    errors = []
    for lo in range(0, len(probe.image), EVAL_BATCH):
        hi = lo + EVAL_BATCH
        with autocast:
            pred = model(probe.image[lo:hi].float() / 255.0, probe.state[lo:hi])
        # |pred_raw - target_raw| = |pred - target| * std: the mean cancels in raw units.
        errors.append(((pred.float() - probe.actions[lo:hi]).abs() * action_std).mean(dim=(1, 2)))
    model.train(was_training)
    per_sample = torch.cat(errors)
    by_dataset = {int(d): float(per_sample[probe.dataset == d].mean()) for d in probe.dataset.unique()}
    return float(per_sample.mean()), by_dataset


def eval_record(model: nn.Module, eval_probe: ProbeSet, train_probe: ProbeSet, action_std: torch.Tensor,
                autocast: torch.autocast, breakdown: bool) -> dict[str, float]:
    eval_mae, by_dataset = chunk_mae(model, eval_probe, action_std, autocast)
    train_mae, _ = chunk_mae(model, train_probe, action_std, autocast)
    record = {"eval_chunk_mae": round(eval_mae, 6), "train_chunk_mae": round(train_mae, 6)}
    if breakdown:
        record.update({f"eval/{KNOWN_DATASETS[d]}": round(v, 6) for d, v in sorted(by_dataset.items())})
    return record
