"""`BabysitCallback`: a Hugging Face `transformers.TrainerCallback` that writes babysit's records.

    trainer = Trainer(..., callbacks=[BabysitCallback()])

Every `Trainer.log` (train loss, grad_norm, learning_rate, eval_* metrics, the final train_* summary)
becomes one record at `state.global_step`, values exactly as HF logged them (its `state.log_history`),
plus `total_steps` (`state.max_steps`) so babysit's ETA knows the end. Only the main process writes. A
record with an `eval_*` value (what a verdict reads) is on disk when `on_log` returns; the step records
between evals are written off the training thread (`babysit.integrations.DeferredWriter`), within a
second, in one write a batch; all are on disk when training ends.

A non-finite watched value (by default any logged key containing `loss` or `grad_norm`; the run's
`[guards] nonfinite_metrics` when it declares them: the one rule babysit's guard applies, see
`babysit.core.reading.nonfinite`) stops training after the current step and ends the process with exit code
11, which babysit classifies `diverged` (see `babysit.integrations` for why this way). Note that HF's
`logging_nan_inf_filter` (on by default) replaces a NaN *training* loss by an average of earlier ones
before logging it; `grad_norm` and `eval_loss` still show the divergence, and the callback watches both.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

from babysit.integrations import EXIT_DIVERGED, DeferredWriter, Diverged, NonfiniteWatch, describe
from babysit.integrations.client import JsonlWriter

try:
    from transformers import TrainerCallback
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError("babysit.integrations.huggingface needs transformers: pip install 'babysit[huggingface]'"
                      ) from exc


STEP_RECORDS_DELAY = 1.0  # seconds a step record may wait: babysit reads a source every 0.25-5 s anyway


def _eval_keys(keys: tuple[Any, ...]) -> bool:
    """Whether a record with these keys is one HF logs after an evaluation (`eval_loss`, `eval_accuracy`,
    …; `test_*` from predict), remembered for the key set: a step's `on_log` then looks up one tuple."""
    is_eval = any(type(key) is str and key.startswith(("eval_", "test_")) for key in keys)
    if len(_EVAL_KEYS) < _MAX_KEY_SETS:
        _EVAL_KEYS[keys] = is_eval
    return is_eval


_EVAL_KEYS: dict[tuple[Any, ...], bool] = {}  # a record's keys -> an eval record's (_eval_keys)
_MAX_KEY_SETS = 1024  # a trainer logging ever new keys: past this, each new set is tested at each record


class _AnyArguments:
    """An object whose `__init__`, called again, takes any arguments and does nothing: `object.__init__`
    ignores extra arguments on a type that overrides `__new__` but not `__init__` (CPython's rule since 3.3,
    Objects/typeobject.c `object_init`)."""

    __slots__ = ()

    def __new__(cls) -> _AnyArguments:
        return object.__new__(cls)


def _nothing(*args: Any, **kwargs: Any) -> None:
    """Nothing (`_ignore` where `object.__init__` refuses arguments)."""


def _ignoring() -> Any:
    """A callable that takes HF's hook arguments and returns None: the bound `object.__init__` of
    `_AnyArguments` (~0.5 µs a dispatch here against ~0.7 for a Python function naming HF's keywords, and
    ~5 µs less in a step whose caches are cold: no frame, no code object), else `_nothing`."""
    candidate = _AnyArguments().__init__
    try:
        if candidate(None, None, None, model=None, logs={}) is None:
            return candidate
    except TypeError:
        pass
    return _nothing


_ignore = _ignoring()


def _record(logs: dict[str, Any], total: int | None) -> dict[str, Any]:
    """The record of HF's logs: a copy, with the trainer's `max_steps` as `total_steps` unless it says one."""
    return {**logs, "total_steps": total} if total and total > 0 and "total_steps" not in logs else dict(logs)


class BabysitCallback(TrainerCallback):
    """Writes HF Trainer logs to `$BABYSIT_LOG` (or `path`) and ends a diverged run with exit code 11.

    watch: the logged keys whose non-finite value means divergence (exact names, as
    `[guards] nonfinite_metrics`); None: the run's declaration, else every *loss* and *grad_norm*.
    exit_code: the code the process ends with after a divergence (None: only stop training, e.g. in a
    notebook; babysit then still sees the `diverged` record).
    """

    def __init__(self, path: str | None = None, *, watch: Sequence[str] | None = None,
                 exit_code: int | None = EXIT_DIVERGED) -> None:
        self.writer = JsonlWriter(path, all_ranks=True)  # HF says which process is the main one
        # step records are written off the training thread, one write a second; evals at once (on_log)
        self.records = DeferredWriter(self.writer, delay=STEP_RECORDS_DELAY)
        self.watch = None if watch is None else tuple(watch)
        self.nonfinite = NonfiniteWatch(self.watch)
        self.exit_code = exit_code
        self.diverged: str | None = None  # what diverged, once it has

    # HF calls every hook of every callback, with the trainer's objects as keywords; these five come every
    # step and have nothing to do (on_log carries the step), so each is `_ignore`: a C callable taking any
    # arguments, no Python frame, no **kwargs dict (bench/logger_cost.py: the hooks' share of a cold step);
    # so are the others with nothing to do, an epoch's (every few steps on a small data set) and an eval's
    # batch's (on_prediction_step) among them.
    on_step_begin = on_substep_end = on_pre_optimizer_step = on_optimizer_step = on_step_end = _ignore
    on_init_end = on_train_begin = on_epoch_begin = on_epoch_end = on_evaluate = on_predict = _ignore
    on_prediction_step = on_save = on_push_begin = _ignore

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kwargs: Any) -> None:
        """One record a `Trainer.log`: an eval's is on disk before this returns, a step's is queued. The
        record is a copy: a callback after this one changing HF's dict (`PrinterCallback` pops
        `total_flos`) changes nothing written."""
        if not logs:
            return
        keys = tuple(logs)
        is_eval = _EVAL_KEYS.get(keys)
        if is_eval is None:
            is_eval = _eval_keys(keys)
        step = state.global_step
        main = state.is_world_process_zero
        if main:
            self.records.put(step, _record(logs, state.max_steps))
            if is_eval:
                self.records.flush()  # a verdict's evidence never waits in a queue: on disk when on_log returns
        bad = self.nonfinite.check(logs)
        if bad and self.diverged is None:
            self.diverged = f"non-finite {', '.join(bad)} ({describe(bad)}) at step {step}"
            if main:
                self.records.flush()  # the records before it, then the diverged record, on disk now
                self.writer.write(step, {"event": "diverged", "reason": self.diverged, **bad})
                _say(f"babysit: diverged: {self.diverged}; training stops after this step"
                     + (f" and the process exits with code {self.exit_code}" if self.exit_code is not None else ""))
        if bad:
            control.should_training_stop = True

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.records.close()  # every record on disk before training returns (an evaluate() after starts it again)
        if self.diverged is not None and self.exit_code is not None:
            raise Diverged(f"babysit: training diverged: {self.diverged}", self.exit_code)


def _say(message: str) -> None:
    try:
        print(message, file=sys.stderr, flush=True)
    except Exception:
        pass
