"""A real Lightning `Trainer` babysit launches: the tiny regression of lightning_tiny.py, quiet (no progress
bar, no model summary), logging every `--every` steps, to one logger:

- `--logger csv`: Lightning's own `CSVLogger`, `<out>/metrics.csv` — no babysit code at all; babysit reads
  it with `[source] kind = "csv"` (Lightning writes it at each log call, so it grows in bursts);
- `--logger babysit`: `babysit.integrations.lightning.BabysitLogger`, records to `$BABYSIT_LOG`.

    python -m tests.integrations.lightning_plain --logger csv|babysit --out DIR [--max-steps N] [--every N]
        [--step-seconds S] [--times FILE] [--logged FILE] [--nan-at N] [--lr LR]

`--step-seconds`: every step is paced to last S seconds (tests/integrations/pace.py); `--times`: the step-end
times Lightning's own callback hook sees; `--logged`: what the module handed to `self.log`, as JSON
`[[name, global_step when logged, value], …]`, when fit ends.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from typing import Any

import torch

from tests.integrations.lightning_tiny import TinyData, TinyRegression, pl
from tests.integrations.pace import Metronome


class Paced(pl.Callback):
    def __init__(self, metronome: Metronome) -> None:
        self.metronome = metronome

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        self.metronome.start()

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        self.metronome.step_end(trainer.global_step)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--logger", choices=("csv", "babysit"), required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--max-steps", type=int, default=30)
    parser.add_argument("--every", type=int, default=10, help="log_every_n_steps and val_check_interval")
    parser.add_argument("--step-seconds", type=float, default=0.0)
    parser.add_argument("--times")
    parser.add_argument("--logged")
    parser.add_argument("--nan-at", type=int, default=0)
    parser.add_argument("--lr", type=float, default=0.05)
    a = parser.parse_args(argv)
    torch.set_num_threads(1)  # two shared cores: more threads only spin
    if a.logger == "csv":
        from lightning.pytorch.loggers import CSVLogger

        logger: Any = CSVLogger(a.out, name="", version="")  # <out>/metrics.csv
    else:
        from babysit.integrations.lightning import BabysitLogger

        logger = BabysitLogger()
    model = TinyRegression(lr=a.lr, nan_at=a.nan_at)
    trainer = pl.Trainer(max_steps=a.max_steps, val_check_interval=a.every, check_val_every_n_epoch=None,
                         log_every_n_steps=a.every, accelerator="cpu", devices=1, enable_progress_bar=False,
                         enable_model_summary=False, num_sanity_val_steps=0, enable_checkpointing=False,
                         logger=logger, default_root_dir=a.out, callbacks=[Paced(Metronome(a.step_seconds, a.times))])
    try:
        trainer.fit(model, datamodule=TinyData())
    finally:
        if a.logged:
            os.makedirs(os.path.dirname(os.path.abspath(a.logged)), exist_ok=True)
        with open(a.logged, "w") as f:
                json.dump(model.logged, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
