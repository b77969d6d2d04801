"""`BabysitLogger`: a `pytorch_lightning` `Logger` that writes babysit's records.

    trainer = pytorch_lightning.Trainer(..., logger=BabysitLogger())
    # or, with no code edit, from LightningCLI:
    python train.py fit --trainer.logger=babysit.integrations.pytorch_lightning.BabysitLogger

Each `log_metrics` call becomes one record at `trainer.global_step` (the optimizer steps done: see
babysit/integrations/_lightning_core.py for why not Lightning's `step`), the values as Lightning hands
them to its loggers, plus `total_steps` (max_steps, else the trainer's estimate) for babysit's ETA.
Only global rank 0 writes.

A non-finite value of a watched key (the run's `[guards] nonfinite_metrics`, else one containing "loss" or
"grad_norm": babysit.core.reading.nonfinite, the rule the daemon applies) sets `trainer.should_stop`
(agreed across ranks), writes a `diverged` record, and when fit ends the process exits with code 11,
which babysit classifies `diverged` (`babysit.integrations` says why this way).

Checkpoints (when this is the first logger and ModelCheckpoint has no dirpath) and LightningCLI's
config.yaml go to `save_dir`: by default `<the log's folder>/attempt-<n>`, one folder an attempt.
The same logger as `babysit.integrations.lightning.BabysitLogger`, on the older package's base class
(LightningCLI's `--trainer.logger` accepts only subclasses of its own package's `Logger`).
"""

from __future__ import annotations

from babysit.integrations._lightning_core import BabysitLoggerCore

try:
    from pytorch_lightning.loggers import Logger
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError("babysit.integrations.pytorch_lightning needs pytorch_lightning: pip install "
                      "pytorch_lightning (for the `lightning` package use babysit.integrations.lightning)") from exc


class BabysitLogger(BabysitLoggerCore, Logger):
    """Writes pytorch_lightning's logged metrics to `$BABYSIT_LOG` (or `path`); ends a diverged run with exit 11.

    Its arguments are `BabysitLoggerCore.__init__`'s.
    """
