"""A tiny real Lightning training (linear regression on made-up data, CPU), used in-process by the tests and
through LightningCLI as a trainer babysit launches: `python -m tests.integrations.lightning_tiny fit ...`.

The module records what it logged (`self.logged`: (name, global_step when logged, value)) so a test can
compare the logger's records with the values the model handed to `self.log`.
"""

from __future__ import annotations

import sys
from typing import Any

import torch
from torch import nn

try:
    import lightning.pytorch as pl
except ImportError:  # the older package name, where only it is installed
    import pytorch_lightning as pl  # type: ignore[no-redef]


class TinyRegression(pl.LightningModule):
    """`nan_at`: from the N-th training step on, the loss is multiplied by NaN."""

    def __init__(self, lr: float = 0.05, nan_at: int = 0) -> None:
        super().__init__()
        self.net = nn.Linear(4, 1)
        self.lr = lr
        self.nan_at = nan_at
        self.logged: list[tuple[str, int, float]] = []

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = nn.functional.mse_loss(self.net(x), y)
        if self.nan_at and self.global_step + 1 >= self.nan_at:
            loss = loss * float("nan")
        self.log("train_loss", loss)
        self.logged.append(("train_loss", self.global_step, loss.item()))
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        loss = nn.functional.mse_loss(self.net(x), y)
        self.log("val_loss", loss)  # one batch a validation: the epoch mean is this value
        self.logged.append(("val_loss", self.global_step, loss.item()))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=self.lr)


class TinyData(pl.LightningDataModule):
    def __init__(self, n: int = 64, batch_size: int = 8) -> None:
        super().__init__()
        x = torch.randn(n, 4, generator=torch.Generator().manual_seed(0))
        self.train_set = torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True))
        self.val_set = torch.utils.data.TensorDataset(x[:batch_size], x[:batch_size].sum(1, keepdim=True))
        self.batch_size = batch_size

    def train_dataloader(self) -> torch.utils.data.DataLoader:
        return torch.utils.data.DataLoader(self.train_set, batch_size=self.batch_size)

    def val_dataloader(self) -> torch.utils.data.DataLoader:
        return torch.utils.data.DataLoader(self.val_set, batch_size=self.batch_size)


def trainer_kwargs(max_steps: int = 30, val_every: int = 10) -> dict[str, Any]:
    return {"max_steps": max_steps, "val_check_interval": val_every, "check_val_every_n_epoch": None,
            "log_every_n_steps": 5, "accelerator": "cpu", "devices": 1, "enable_progress_bar": False,
            "enable_model_summary": False, "num_sanity_val_steps": 0}


def cli_main(args: list[str] | None = None) -> Any:
    from lightning.pytorch.cli import LightningCLI

    torch.set_num_threads(1)
    return LightningCLI(TinyRegression, TinyData, args=args)


if __name__ == "__main__":
    cli_main()
    sys.exit(0)
