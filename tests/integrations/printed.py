"""Tiny real HF and Lightning trainings that print the way they do by default — HF's progress bar and
its printed log dicts, Lightning's progress bar with `self.log(..., prog_bar=True)` in its postfix — and
nothing babysit-specific: what `[source] kind = "stdout"` presets are tested on.

    python -m tests.integrations.printed hf|lightning --out DIR [--max-steps N] [--nan-at N] [--bar tqdm|rich]
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

import torch


def hf(out: str, max_steps: int, nan_at: int) -> None:
    from tests.integrations.hf_tiny import tiny_trainer

    tiny_trainer(out, [], max_steps=max_steps, nan_at=nan_at, disable_tqdm=False).train()


def lightning(out: str, max_steps: int, nan_at: int, bar: str = "tqdm") -> None:
    from lightning.pytorch.callbacks import RichProgressBar, TQDMProgressBar

    from tests.integrations.lightning_tiny import TinyData, TinyRegression, pl, trainer_kwargs

    class ProgBar(TinyRegression):
        def log(self, name: str, value: Any, *args: Any, **kwargs: Any) -> None:  # what users write
            super().log(name, value, *args, **{**kwargs, "prog_bar": True})

    kwargs = {**trainer_kwargs(max_steps=max_steps), "enable_progress_bar": True, "logger": False,
              "enable_checkpointing": False, "default_root_dir": out,
              "callbacks": [TQDMProgressBar() if bar == "tqdm" else RichProgressBar()]}
    pl.Trainer(**kwargs).fit(ProgBar(nan_at=nan_at), datamodule=TinyData())


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("framework", choices=("hf", "lightning"))
    p.add_argument("--out", required=True)
    p.add_argument("--max-steps", type=int, default=30)
    p.add_argument("--nan-at", type=int, default=0)
    p.add_argument("--bar", choices=("tqdm", "rich"), default="tqdm", help="lightning: its progress bar")
    a = p.parse_args(argv)
    torch.set_num_threads(1)
    if a.framework == "hf":
        hf(a.out, a.max_steps, a.nan_at)
    else:
        lightning(a.out, a.max_steps, a.nan_at, a.bar)
    return 0


if __name__ == "__main__":
    sys.exit(main())
