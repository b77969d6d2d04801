"""What `lightning.BabysitLogger` and `pytorch_lightning.BabysitLogger` share; imports no framework, so the
one body serves both packages' `Logger` bases (each module adds its own base class).

Steps: a record's step is `trainer.global_step` when the value is logged, the number of optimizer steps
done (HF's convention): the train loss of the N-th step and the validation after N steps are both at
step N. Lightning hands loggers `global_step - 1` for those (its CSV and TensorBoard files show it), so
the logger takes the trainer's own count. The trainer is learned from `log_graph(model)`, which Lightning
calls on every logger when fit/validate/test starts (with `Trainer(enable_autolog_hparams=True)`, the
default); without it the step Lightning passes is written and divergence cannot stop training.
"""

from __future__ import annotations

import math
import os
import sys
import weakref
from collections.abc import Mapping, Sequence
from typing import Any

from babysit.integrations import EXIT_DIVERGED, Diverged, NonfiniteWatch, describe
from babysit.integrations.client import JsonlWriter, env_rank


class BabysitLoggerCore:
    """The logger's behaviour, for both packages' `BabysitLogger` (babysit/integrations/lightning.py has the
    user-facing docs)."""

    def __init__(self, path: str | None = None, save_dir: str | None = None,
                 watch: Sequence[str] | None = None, exit_code: int | None = EXIT_DIVERGED) -> None:
        """
        Args:
            path: the JSONL file; default `$BABYSIT_LOG`, which babysit sets for every attempt.
            save_dir: where checkpoints and LightningCLI's config go; default one folder an attempt.
            watch: the metric names whose non-finite value means divergence (exact, as `[guards]
            nonfinite_metrics`); None: the run's declaration, else every *loss* and *grad_norm*.
            exit_code: the process's exit code after a divergence; None only stops training.
        """
        super().__init__()
        self.writer = JsonlWriter(path, all_ranks=True)  # the trainer says which process is rank 0
        self._save_dir = save_dir
        self.watch = None if watch is None else tuple(watch)
        self.nonfinite = NonfiniteWatch(self.watch)
        self.exit_code = exit_code
        self.diverged: str | None = None
        self._trainer_ref: weakref.ReferenceType[Any] | None = None
        self._total_steps: int | None = None
        self._raised = False
        self._warned_no_trainer = False

    # -- the Logger interface ----------------------------------------------------------------------
    @property
    def name(self) -> str:
        return ""  # checkpoints under save_dir/checkpoints, not save_dir/<name>/<version>/checkpoints

    @property
    def version(self) -> str:
        return ""

    @property
    def save_dir(self) -> str:
        """Where Lightning puts this run's checkpoints and LightningCLI its config.yaml: one folder an
        attempt (`<log's folder>/attempt-<n>`), so a retry never finds the config of the attempt before
        it (LightningCLI refuses to overwrite one) nor mixes its checkpoints with them."""
        if self._save_dir is not None:
            return self._save_dir
        log = self.writer.path
        if log is None:
            return os.path.join("lightning_logs", "babysit")
        return os.path.join(os.path.dirname(os.path.abspath(log)), f"attempt-{os.environ.get('BABYSIT_ATTEMPT', '0')}")

    @property
    def root_dir(self) -> str:
        return self.save_dir

    @property
    def log_dir(self) -> str:
        return self.save_dir

    def log_hyperparams(self, params: Any, *args: Any, **kwargs: Any) -> None:
        """Nothing: babysit reads metrics; hyperparameters live in the run's command and config."""

    def log_graph(self, model: Any, input_array: Any = None) -> None:
        """Lightning's one call that hands a logger the module, and so the trainer (see module doc)."""
        trainer = getattr(model, "_trainer", None) or _safe_trainer(model)
        if trainer is not None:
            self._trainer_ref = weakref.ref(trainer)

    def log_metrics(self, metrics: Mapping[str, Any], step: int | None = None) -> None:
        trainer = self._trainer()
        if trainer is not None:
            at = int(trainer.global_step)
            main = bool(trainer.is_global_zero)
        else:
            at = int(step) if step is not None else 0
            main = env_rank() == 0
            if not self._warned_no_trainer:
                self._warned_no_trainer = True
                _say("babysit: BabysitLogger did not get the trainer (Trainer(enable_autolog_hparams=False)?): "
                     "records use Lightning's step (global_step - 1) and a divergence cannot stop training")
        if main:
            record = dict(metrics)
            total = self._total(trainer)
            if total is not None:
                record.setdefault("total_steps", total)
            self.writer.write(at, record)
        bad = self.nonfinite.check(metrics)
        stop = bool(bad)
        if trainer is not None and int(getattr(trainer, "world_size", 1)) > 1:
            # every rank must leave the loop together, or the others hang at the next collective
            stop = bool(trainer.strategy.reduce_boolean_decision(stop, all=False))
        if not stop:
            return
        if self.diverged is None:
            what = f"non-finite {', '.join(bad)} ({describe(bad)})" if bad else "non-finite value on another rank"
            self.diverged = f"{what} at step {at}"
            if main:
                self.writer.write(at, {"event": "diverged", "reason": self.diverged, **bad})
                tail = "" if self.exit_code is None else f" and the process exits with code {self.exit_code}"
                _say(f"babysit: diverged: {self.diverged}; training stops after this step{tail}")
        if trainer is not None:
            trainer.should_stop = True

    def save(self) -> None:
        """Nothing to flush: every record is written whole when it is logged."""

    def finalize(self, status: str) -> None:
        """At the end of fit/validate/test: a diverged run ends here with `Diverged` (exit code 11).
        Not on "failed" (an exception is already on its way) nor twice."""
        if status == "success" and self.diverged is not None and self.exit_code is not None and not self._raised:
            self._raised = True
            raise Diverged(f"babysit: training diverged: {self.diverged}", self.exit_code)

    # -- internals ---------------------------------------------------------------------------------
    def _trainer(self) -> Any:
        return self._trainer_ref() if self._trainer_ref is not None else None

    def _total(self, trainer: Any) -> int | None:
        """The step training ends at, for babysit's ETA: max_steps, else the trainer's estimate."""
        if self._total_steps is not None or trainer is None:
            return self._total_steps
        max_steps = getattr(trainer, "max_steps", -1)
        if isinstance(max_steps, int) and max_steps > 0:
            self._total_steps = max_steps
        elif getattr(getattr(trainer, "state", None), "fn", None) == "fit":  # TrainerFn is a str enum
            # only while fitting: outside fit the estimate would set up the training data
            try:
                estimate = float(trainer.estimated_stepping_batches)
            except Exception:
                return None
            if math.isfinite(estimate) and estimate > 0:
                self._total_steps = int(estimate)
        return self._total_steps

    def __getstate__(self) -> dict[str, Any]:
        """Picklable for ddp_spawn: the trainer reference stays behind (log_graph sets it again)."""
        return {**self.__dict__, "_trainer_ref": None}


def _safe_trainer(model: Any) -> Any:
    try:
        return model.trainer
    except Exception:
        return None


def _say(message: str) -> None:
    try:
        print(message, file=sys.stderr, flush=True)
    except Exception:
        pass

