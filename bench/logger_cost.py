"""What one log call costs the training loop: `babysit.log` vs `wandb.log` (offline mode), the same
records, the same machine, in one run; and the HF `BabysitCallback`'s cost per step against a tiny real
model's step.

  python bench/logger_cost.py              # ~2.5 min here (wandb's start-up, HF's imports, the paced runs)
  python bench/logger_cost.py --calls 20000 --json out.json
  python bench/logger_cost.py --before DIR # DIR from bench/export_before.sh: its client and its HF
                                           # callback measured in the same run, round for round (~5 min)
  python3 bench/logger_cost.py --babysit-only   # no wandb/transformers there (e.g. a bare GPU box)
  python bench/logger_cost.py --hf-only --hf-logging-steps 1,10,500  # the callback beside no callback and an
                                           # empty TrainerCallback, at each logging_steps (~2 min a process)

Targets (issue 28): `babysit.log` ≤ 10 µs a call and ≥ 10× cheaper than `wandb.log`; the callback's
cost per step ≤ 0.1 % of the tiny model's step. wandb's call is measured as the loop sees it (its
record handed to wandb-core, which writes the file on its own process); `run.finish()` is timed apart.

The callback is measured two ways, each in a process of its own (`--hf-worker`, this tree's or
`--before`'s babysit, alternated `--hf-pairs` times): HF's dispatch of the hooks in a tight loop (CPU of
the training thread, and of the process with what is queued written inside the window), and a paced
run — `--paced-steps` steps of `--pace-ms` (10 ms: the tiny model's step on a quiet box; the same for
both codes, as the cost a step depends on how many records a batch holds), each the four every-step hooks, an
`on_log` of a record with the values a real run logs (a loss rounded as HF rounds it, a full-precision
grad norm, a decaying learning rate, the epoch) and a sleep for the rest of the step, as a model step
on the GPU or in torch's kernels leaves the interpreter — whose `time.process_time` counts everything
the callback costs the process: the training thread, its records' thread waking once a batch and
writing it, at the batch sizes a real run makes. Less an empty handler's run, in interleaved chunks.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections.abc import Callable
from itertools import pairwise
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import emit, fmt_us, summary
from _log_calls import load_client, records, time_babysit, time_wandb

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def records_thread(records: Any) -> int | None:
    """The ident of a `DeferredWriter`'s thread while one runs: `_thread_id`, or (code before it) `_thread`'s."""
    if hasattr(records, "_thread_id"):
        return records._thread_id
    thread = getattr(records, "_thread", None)
    return thread.ident if thread is not None else None


def timed_dispatch(handler: Any, target: Any, call: bool, clock: Callable[[], float],
                   add: Callable[[float], None]) -> Callable[..., Any]:
    """HF 5.x's `CallbackHandler.call_event` loop (getattr, the trainer's objects as keywords) with `target`'s
    call timed by `clock` in place, `add`ed its time; `call` False: the timer pair around nothing where it
    would be (the arm without it). The dispatch is written out in the timed region itself, not called."""
    def call_event(event: str, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        for callback in handler.callbacks:
            if callback is target:
                t0 = clock()
                result = None if not call else getattr(callback, event)(
                    args, state, control, model=handler.model, processing_class=handler.processing_class,
                    optimizer=handler.optimizer, lr_scheduler=handler.lr_scheduler,
                    train_dataloader=handler.train_dataloader, eval_dataloader=handler.eval_dataloader,
                    **kwargs)
                add(clock() - t0)
            else:
                result = getattr(callback, event)(
                    args, state, control, model=handler.model, processing_class=handler.processing_class,
                    optimizer=handler.optimizer, lr_scheduler=handler.lr_scheduler,
                    train_dataloader=handler.train_dataloader, eval_dataloader=handler.eval_dataloader,
                    **kwargs)
            if result is not None:
                control = result
        return control
    return call_event


def records_sampler() -> Any:
    """A TrainerCallback class placed before an arm's callback: ours' records' thread's CPU (its own clock)
    at each step's end and at the train's end (before ours closes it: the one empty wake-up after the close
    is not counted). Made when asked: transformers is imported only by the HF measures."""
    from transformers import TrainerCallback

    class Records(TrainerCallback):
        def __init__(self, callback: Any) -> None:
            self.callback, self.cpu = callback, 0.0

        def _sample(self) -> None:
            ident = records_thread(self.callback.records) if self.callback is not None else None
            if ident is not None:
                try:
                    self.cpu = time.clock_gettime(time.pthread_getcpuclockid(ident))
                except (OSError, AttributeError):
                    pass

        def on_step_end(self, args, state, control, **kw):  # type: ignore[no-untyped-def]
            self._sample()

        def on_train_end(self, args, state, control, **kw):  # type: ignore[no-untyped-def]
            self._sample()

    return Records


def hf_callback(steps: int, rounds: int = 7, n: int = 2000, paced_steps: int = 400,
                pace_s: float = 0.01) -> dict[str, Any]:
    """A tiny real HF training's median step, and what BabysitCallback adds to a step: HF's own dispatch
    (`CallbackHandler`, with the trainer's model, optimizer and scheduler as kwargs, as in training) of
    every hook it calls each step — on_step_begin, on_pre_optimizer_step, on_optimizer_step, on_step_end —
    and of on_log with a record, to a handler holding only the callback, less the same calls on an empty
    handler (HF's loop costs that without any callback). CPU time (`time.process_time`), median of rounds;
    then the paced run (module doc)."""
    import torch
    from transformers import TrainerCallback
    from transformers.trainer_callback import CallbackHandler
    from transformers.utils import logging as hf_logging

    from babysit.integrations.huggingface import BabysitCallback
    from tests.integrations.hf_tiny import tiny_trainer

    torch.set_num_threads(1)
    stamps: list[float] = []

    class Clock(TrainerCallback):
        def on_step_end(self, args, state, control, **kw):  # type: ignore[no-untyped-def]
            stamps.append(time.perf_counter())

    with tempfile.TemporaryDirectory() as out:
        os.environ["BABYSIT_LOG"] = str(Path(out) / "log.jsonl")
        callback = BabysitCallback()
        trainer = tiny_trainer(out, [Clock(), callback], max_steps=steps, logging_steps=1, eval_steps=10 ** 6)
        trainer.train()
        gaps = [b - a for a, b in pairwise(stamps[5:])]  # past the first steps' warm-up
        step_s = sorted(gaps)[len(gaps) // 2]
        state, args, control = trainer.state, trainer.args, trainer.control
        logs = {"loss": 3.9, "grad_norm": 0.88, "learning_rate": 1e-3, "epoch": 0.5}
        h = trainer.callback_handler
        hf_logging.set_verbosity_error()  # a handler without DefaultFlowCallback says so; it is not training
        handlers = {name: CallbackHandler(cbs, h.model, h.processing_class, h.optimizer, h.lr_scheduler)
                    for name, cbs in (("ours", [callback]), ("empty", []))}
        for handler in handlers.values():
            handler.train_dataloader = h.train_dataloader
            handler.eval_dataloader = h.eval_dataloader

        def hooks(handler: Any) -> None:
            handler.on_step_begin(args, state, control)
            handler.on_pre_optimizer_step(args, state, control)
            handler.on_optimizer_step(args, state, control)
            handler.on_step_end(args, state, control)

        def cpu_per(call: Any, handler: Any, clock: Any) -> float:
            """CPU a call by `clock`: the training thread's (`time.thread_time`), or the process's, the records'
            thread included, with what it has still to write flushed inside the window."""
            c0 = clock()
            for _ in range(n):
                call(handler)
            if clock is time.process_time:
                callback.records.flush()
            spent = clock() - c0
            callback.records.flush()
            return spent / n

        def logged(handler: Any) -> None:
            handler.on_log(args, state, control, logs=dict(logs))

        got: dict[str, list[float]] = {"hooks": [], "log": [], "log_total": []}
        for _ in range(rounds):
            for key, call, clock in (("hooks", hooks, time.thread_time), ("log", logged, time.thread_time),
                                     ("log_total", logged, time.process_time)):
                got[key].append(cpu_per(call, handlers["ours"], clock) - cpu_per(call, handlers["empty"], clock))

        def paced_chunk(handler: Any, first: int, count: int) -> tuple[float, float]:
            """(process CPU, training-thread CPU) of `count` paced steps through `handler`."""
            c0, t0 = time.process_time(), time.thread_time()
            sleep, clock = time.sleep, time.perf_counter
            for i in range(first, first + count):
                start = clock()
                hooks(handler)
                state.global_step = i
                handler.on_log(args, state, control, logs={
                    "loss": round(3.9 / (1 + i / 400), 4), "grad_norm": 0.8731 + i * 1.37e-7,
                    "learning_rate": 1e-3 * (1 - i / (4 * paced_steps)), "epoch": i / 48})
                rest = pace_s - (clock() - start)
                if rest > 0:
                    sleep(rest)
            if handler is handlers["ours"]:
                callback.records.flush()  # what its thread has not written yet, inside the window
                # and its thread's last wake-up (the end of its sleep, finding nothing) too, not in the next
                # chunk's window: the training thread only sleeps meanwhile
                sleep(callback.records.delay + 0.05)
            return time.process_time() - c0, time.thread_time() - t0

        chunks = 4
        per = max(1, paced_steps // chunks)
        paced: dict[str, list[tuple[float, float]]] = {"ours": [], "empty": []}
        for c in range(chunks):
            for name in ("empty", "ours") if c % 2 else ("ours", "empty"):
                paced[name].append(paced_chunk(handlers[name], c * per, per))
        ours_cpu = sum(x[0] for x in paced["ours"]) - sum(x[0] for x in paced["empty"])
        ours_thread = sum(x[1] for x in paced["ours"]) - sum(x[1] for x in paced["empty"])
    med = {k: sorted(v)[len(v) // 2] for k, v in got.items()}
    return {"step_s": step_s, "per_step_s": med["hooks"], "log_s": med["log"], "log_total_s": med["log_total"],
            "steps": steps, "paced_steps": per * chunks, "paced_total_s": ours_cpu / (per * chunks),
            "paced_thread_s": ours_thread / (per * chunks), "pace_s": pace_s}


def hf_in_training(steps: int, chunks: int = 2) -> dict[str, Any]:
    """What BabysitCallback costs a step of the tiny model's real training (`Trainer.train`, logging every
    step, HF's default callbacks around it): its dispatch — every hook HF calls on it, at the cache state a
    real step leaves — timed in place (CPU of the training thread), less the same timer around nothing at
    the same place in a training without it; plus its records' thread's CPU (that thread's own clock). In
    `chunks` trainings a code, alternated (each starts the records' thread and flushes its last batch at its
    end, as one real training does once). The handler's `call_event` is HF 5.x's loop (getattr, the
    trainer's objects as keywords), with the one callback's call timed; the timer pair itself (a system call,
    0.1–10 µs by machine) is what the training without it measures and is taken off."""
    from transformers import TrainerCallback

    from babysit.integrations.huggingface import BabysitCallback
    from tests.integrations.hf_tiny import tiny_trainer

    clock = time.thread_time
    spent = {"ours": 0.0, "none": 0.0}
    counted = {"ours": 0, "none": 0}
    records_cpu = [0.0]

    class Marker(TrainerCallback):
        """Where ours would be, never called: the timer pair around nothing."""

    Records = records_sampler()

    def timed(handler: Any, target: Any, arm: str) -> Any:
        return timed_dispatch(handler, target, arm != "none", clock,
                              lambda took: spent.__setitem__(arm, spent[arm] + took))

    per = max(1, steps // chunks)
    with tempfile.TemporaryDirectory() as out:
        os.environ["BABYSIT_LOG"] = str(Path(out) / "trained.jsonl")
        for c in range(chunks):
            for arm in ("none", "ours") if c % 2 else ("ours", "none"):
                callback = BabysitCallback() if arm == "ours" else None
                target = callback if callback is not None else Marker()
                records = Records(callback)
                trainer = tiny_trainer(str(Path(out) / f"{arm}{c}"), [records, target], max_steps=per,
                                       logging_steps=1, eval_steps=10 ** 6)
                handler = trainer.callback_handler
                handler.call_event = timed(handler, target, arm)
                trainer.train()
                counted[arm] += trainer.state.global_step
                if arm == "ours":
                    records_cpu[0] += records.cpu
    thread = spent["ours"] / counted["ours"] - spent["none"] / counted["none"]
    return {"trained_steps": counted["ours"], "trained_thread_s": thread,
            "trained_total_s": thread + records_cpu[0] / counted["ours"]}


HF_ARMS = ("none", "empty", "ours")  # no callback; an empty TrainerCallback subclass (HF's floor); ours


def hf_logs(step: int, total: int) -> dict[str, float]:
    """The record a real run logs at `step`: a loss rounded as HF rounds it, a full-precision grad norm, a
    decaying learning rate, the epoch (a fresh dict a call, as HF's `_maybe_log_save_evaluate` makes)."""
    return {"loss": round(3.9 / (1 + step / 400), 4), "grad_norm": 0.8731 + step * 1.37e-7,
            "learning_rate": 1e-3 * (1 - step / (4 * total)), "epoch": step / 48}


def whole(count: int, every: int) -> int:
    """`count` steps, at least one interval's, rounded up to whole intervals: every arm logs as often."""
    return -(-max(count, every) // every) * every


def hf_arms(steps: int, intervals: list[int], *, rounds: int = 7, n: int = 2000, paced_steps: int = 400,
            pace_s: float = 0.01, paced_chunk_steps: int = 20, trained_steps: int = 800,
            chunks: int = 2) -> dict[str, Any]:
    """What a step costs with no callback, with an empty `TrainerCallback` subclass (HF's floor for having
    any callback: its hooks are HF's own no-ops, dispatched with the trainer's objects as keywords) and with
    `BabysitCallback`, at each `logging_steps` in `intervals`, three ways, the arms alternated:

    - tight: `n` steps back to back through HF's `CallbackHandler` (every-step hooks, `on_log` every k-th),
      caches warm; CPU a step of the training thread, and of the process with what is queued written
      inside the window (median of `rounds`);
    - paced: steps of `pace_s` (the hooks, `on_log` every k-th, a sleep for the rest: a model step leaves the
      interpreter), caches cold, the records' thread writing the batches a real run makes; at least
      `paced_steps` steps an arm and k, whole intervals, in chunks of `paced_chunk_steps` alternated: the
      training thread's CPU (`thread_time`); plus, for ours, its records' thread's own CPU clock over a
      run of ours alone (its last wake-up waited for, the flush of what was left counted);
    - trained: each arm's dispatch timed in place inside the tiny model's real `Trainer.train`
      (`hf_in_training`'s way), `chunks` trainings an arm and k of at least `trained_steps / chunks` steps.

    Per arm and k: (training thread, all threads) seconds a step, not yet less any other arm's; the
    tiny model's step (`step_s`, as `hf_callback` measures it)."""
    import torch
    from transformers import TrainerCallback
    from transformers.trainer_callback import CallbackHandler
    from transformers.utils import logging as hf_logging

    torch.set_num_threads(1)
    hf_logging.set_verbosity_error()  # a handler without DefaultFlowCallback says so; it is not training

    class Empty(TrainerCallback):
        """Every hook HF's own no-op: what any callback costs before it does anything."""

    workspace = tempfile.TemporaryDirectory()
    step_s, trainer, callback = tiny_step(workspace.name, steps)
    state, args, control = trainer.state, trainer.args, trainer.control
    h = trainer.callback_handler
    members: dict[str, list[Any]] = {"none": [], "empty": [Empty()], "ours": [callback]}
    handlers = {arm: CallbackHandler(cbs, h.model, h.processing_class, h.optimizer, h.lr_scheduler)
                for arm, cbs in members.items()}
    for handler in handlers.values():
        handler.train_dataloader = h.train_dataloader
        handler.eval_dataloader = h.eval_dataloader
    records = callback.records

    def hooks(handler: Any) -> None:
        handler.on_step_begin(args, state, control)
        handler.on_pre_optimizer_step(args, state, control)
        handler.on_optimizer_step(args, state, control)
        handler.on_step_end(args, state, control)

    def tight(arm: str, every: int) -> tuple[float, float]:
        handler, total = handlers[arm], n
        c0, t0 = time.process_time(), time.thread_time()
        for i in range(1, n + 1):
            hooks(handler)
            state.global_step = i
            if i % every == 0:
                handler.on_log(args, state, control, logs=hf_logs(i, total))
        thread = time.thread_time() - t0
        if arm == "ours":
            records.flush()  # what is queued, written inside the window
        return thread / n, (time.process_time() - c0) / n

    tights: dict[str, dict[int, list[tuple[float, float]]]] = {arm: {k: [] for k in intervals} for arm in HF_ARMS}
    for r in range(rounds):
        order = HF_ARMS[r % 3:] + HF_ARMS[:r % 3]
        for k in intervals:
            for arm in order:
                tights[arm][k].append(tight(arm, k))

    def paced_chunk(arm: str, every: int, first: int, count: int, total: int) -> float:
        """The training thread's CPU over `count` paced steps through the arm's handler."""
        handler = handlers[arm]
        t0 = time.thread_time()
        sleep, clock = time.sleep, time.perf_counter
        for i in range(first, first + count):
            start = clock()
            hooks(handler)
            state.global_step = i
            if i % every == 0:
                handler.on_log(args, state, control, logs=hf_logs(i, total))
            rest = pace_s - (clock() - start)
            if rest > 0:
                sleep(rest)
        return time.thread_time() - t0

    def records_cpu() -> float:
        """Ours' records' thread's CPU so far (0 before it starts): its own clock, whichever arm's chunk it
        ran in — all of it is ours."""
        ident = records_thread(records)
        if ident is None:
            return 0.0
        try:
            return time.clock_gettime(time.pthread_getcpuclockid(ident))
        except (OSError, AttributeError):
            return 0.0

    # the training thread: short chunks, the arms' order rotating, many a k (a paced step's CPU, a sleep's
    # wake-up and cold caches, varies by tens of µs from one second to the next here, alike for every arm
    # only over many chunks); ours' records' thread: then, in a run of ours alone at the pace, so that it
    # wakes as often a step as in a real run (interleaved with the other arms it would wake 3× as often a
    # step of ours: ~170 µs of CPU a wake-up here)
    paced: dict[str, dict[int, list[float]]] = {arm: {k: [0.0, 0.0] for k in intervals} for arm in HF_ARMS}
    for k in intervals:
        total = whole(paced_steps, k)
        for c, first in enumerate(range(1, total + 1, paced_chunk_steps)):
            count = min(paced_chunk_steps, total + 1 - first)
            for arm in HF_ARMS[c % 3:] + HF_ARMS[:c % 3]:
                paced[arm][k][0] += paced_chunk(arm, k, first, count, total)
        records.flush()
        time.sleep(records.delay + 0.05)  # its thread idle, waiting for a ring
        cpu0 = records_cpu()
        paced_chunk("ours", k, 1, total, total)
        t0 = time.thread_time()
        records.flush()  # what its thread has not written yet (its work, done here)
        left = time.thread_time() - t0
        time.sleep(records.delay + 0.05)  # its last wake-up (the end of its sleep, finding nothing)
        for arm in HF_ARMS:
            paced[arm][k][1] = paced[arm][k][0]
        paced["ours"][k][1] += records_cpu() - cpu0 + left

    def med(pairs: list[tuple[float, float]]) -> list[float]:
        return [sorted(x[i] for x in pairs)[len(pairs) // 2] for i in (0, 1)]

    got: dict[str, Any] = {
        "step_s": step_s, "intervals": intervals, "pace_s": pace_s,
        "paced_steps": {str(k): whole(paced_steps, k) for k in intervals},
        "tight": {arm: {str(k): med(v) for k, v in by.items()} for arm, by in tights.items()},
        "paced": {arm: {str(k): [x / whole(paced_steps, k) for x in v] for k, v in by.items()}
                  for arm, by in paced.items()}}
    records.close()
    workspace.cleanup()
    if trained_steps:
        got["trained"], got["trained_steps"] = hf_trained_arms(intervals, trained_steps, chunks, Empty)
    return got


def tiny_step(out: str, steps: int) -> tuple[float, Any, Any]:
    """The tiny model's median step over `steps` of real training, logging every step with a
    `BabysitCallback` (past the first steps' warm-up); the trainer and the callback, trained."""
    from transformers import TrainerCallback

    from babysit.integrations.huggingface import BabysitCallback
    from tests.integrations.hf_tiny import tiny_trainer

    stamps: list[float] = []

    class Clock(TrainerCallback):
        def on_step_end(self, args, state, control, **kw):  # type: ignore[no-untyped-def]
            stamps.append(time.perf_counter())

    os.environ["BABYSIT_LOG"] = str(Path(out) / "log.jsonl")
    callback = BabysitCallback()
    trainer = tiny_trainer(out, [Clock(), callback], max_steps=steps, logging_steps=1, eval_steps=10 ** 6)
    trainer.train()
    gaps = [b - a for a, b in pairwise(stamps[5:])]
    return sorted(gaps)[len(gaps) // 2], trainer, callback


def hf_trained_arms(intervals: list[int], trained_steps: int, chunks: int,
                    empty: type) -> tuple[dict[str, dict[str, list[float]]], dict[str, int]]:
    """`hf_in_training` for the three arms at each logging interval: the dispatch of the arm's callback timed
    in place (the none arm: the timer pair around nothing where a callback would be), plus ours' records'
    thread's CPU. Per arm and k: [training thread, all threads] seconds a step; the steps trained a k."""
    from transformers import TrainerCallback

    from babysit.integrations.huggingface import BabysitCallback
    from tests.integrations.hf_tiny import tiny_trainer

    clock = time.thread_time

    class Marker(TrainerCallback):
        """Where a callback would be, never called: the timer pair around nothing."""

    Records = records_sampler()

    spent = {(arm, k): [0.0, 0.0] for arm in HF_ARMS for k in intervals}  # thread, records' thread
    counted = {(arm, k): 0 for arm in HF_ARMS for k in intervals}

    def timed(handler: Any, target: Any, key: tuple[str, int]) -> Any:
        return timed_dispatch(handler, target, key[0] != "none", clock,
                              lambda took: spent[key].__setitem__(0, spent[key][0] + took))

    per = max(1, trained_steps // chunks)
    with tempfile.TemporaryDirectory() as out:
        os.environ["BABYSIT_LOG"] = str(Path(out) / "trained.jsonl")
        for c in range(chunks):
            for k in intervals:
                for arm in HF_ARMS[c % 3:] + HF_ARMS[:c % 3]:
                    callback = BabysitCallback() if arm == "ours" else None
                    target = callback if callback is not None else (empty() if arm == "empty" else Marker())
                    sampler = Records(callback)
                    trainer = tiny_trainer(str(Path(out) / f"{arm}{k}-{c}"), [sampler, target],
                                           max_steps=whole(per, k), logging_steps=k, eval_steps=10 ** 6)
                    handler = trainer.callback_handler
                    handler.call_event = timed(handler, target, (arm, k))
                    trainer.train()
                    counted[(arm, k)] += trainer.state.global_step
                    spent[(arm, k)][1] += sampler.cpu
    result = {arm: {str(k): [spent[(arm, k)][0] / counted[(arm, k)],
                             sum(spent[(arm, k)]) / counted[(arm, k)]] for k in intervals} for arm in HF_ARMS}
    return result, {str(k): counted[("ours", k)] for k in intervals}


def hf_in_process(tree: str | None, hf_steps: int, paced_steps: int, pace_ms: float,
                  trained_steps: int, logging_steps: str | None = None) -> dict[str, Any]:
    """`hf_callback` (or, with `logging_steps`, `hf_arms`) in a process of its own, on this tree's babysit or
    (tree) DIR's (bench/export_before.sh; DIR has no tests/: the tiny trainer is this tree's)."""
    import json
    import subprocess

    argv = [sys.executable, str(Path(__file__).resolve()), "--hf-worker", tree or "",
            "--hf-steps", str(hf_steps), "--paced-steps", str(paced_steps), "--pace-ms", str(pace_ms),
            "--trained-steps", str(trained_steps)] + (["--hf-logging-steps", logging_steps] if logging_steps else [])
    done = subprocess.run(argv, capture_output=True, text=True, check=True, cwd=str(REPO))
    return json.loads(done.stdout.strip().splitlines()[-1])


def hf_rows(hfs: dict[str, list[dict[str, Any]]]) -> list[list[str]]:
    """The one-arm rows (`hf_callback`, `hf_in_training`): ours less no callback, a row a process."""
    rows = []
    for code, runs in hfs.items():
        tag = " (before)" if code == "before" else ""
        for hf in runs:
            step = hf["step_s"]
            for every in (1, 10, 500):  # logging_steps: every step, a busy setting, HF's default
                cost = hf["per_step_s"] + hf["log_s"] / every
                total = hf["per_step_s"] + hf["log_total_s"] / every
                pct = cost / step * 100
                rows.append([f"`BabysitCallback`{tag} per step, logging_steps={every}", "—", "—",
                             f"{fmt_us(cost * 1e6)} (all threads: {fmt_us(total * 1e6)})",
                             f"{pct:.3f} % of the tiny model's {step * 1e3:.1f} ms step on its thread: "
                             + ("met" if pct <= 0.1 else "missed")
                             + f" (≤ 0.1 %); all threads {total / step * 100:.3f} %"])
            pace = hf["pace_s"]
            paced = hf["paced_total_s"] / pace * 100
            rows.append([f"`BabysitCallback`{tag} paced, logging_steps=1 ({hf['paced_steps']} steps of "
                         f"{pace * 1e3:.0f} ms)", "—", "—",
                         f"{fmt_us(hf['paced_thread_s'] * 1e6)} (all threads: {fmt_us(hf['paced_total_s'] * 1e6)})",
                         f"all threads {paced:.3f} % of the {pace * 1e3:.0f} ms step: "
                         + ("met" if paced <= 0.1 else "missed") + " (≤ 0.1 %)"])
            if "trained_steps" in hf:
                trained = hf["trained_total_s"] / step * 100
                rows.append([f"`BabysitCallback`{tag} in training, logging_steps=1 ({hf['trained_steps']} steps, "
                             "dispatch timed in place)", "—", "—",
                             f"{fmt_us(hf['trained_thread_s'] * 1e6)} (all threads: "
                             f"{fmt_us(hf['trained_total_s'] * 1e6)})",
                             f"all threads {trained:.3f} % of the tiny model's {step * 1e3:.1f} ms step: "
                             + ("met" if trained <= 0.1 else "missed") + " (≤ 0.1 %)"])
    return rows


def middle(xs: list[float]) -> float:
    xs = sorted(xs)
    half = len(xs) // 2
    return xs[half] if len(xs) % 2 else (xs[half - 1] + xs[half]) / 2


def arms_rows(hfs: dict[str, list[dict[str, Any]]]) -> list[list[str]]:
    """The arms table: per measure and logging interval, what an empty callback adds to no callback (HF's
    floor), what ours adds to no callback and to the empty one, and ours' share of the step — medians over
    the processes of a code (their range beside ours' figure over all threads)."""
    rows = []
    for code, runs in hfs.items():
        tag = " (before)" if code == "before" else ""
        for measure in ("tight", "paced", "trained"):
            if any(measure not in run for run in runs):
                continue
            for k in (str(k) for k in runs[0]["intervals"]):
                def over(arm: str, base: str, clock: int, measure: str = measure, k: str = k,
                         runs: list[dict[str, Any]] = runs) -> list[float]:
                    """Each process's figure: `arm` less `base` (clock 0: the training thread, 1: all threads)."""
                    return sorted(run[measure][arm][k][clock] - run[measure][base][k][clock] for run in runs)

                def pair(arm: str, base: str) -> str:
                    return f"{fmt_us(middle(over(arm, base, 0)) * 1e6)} / {fmt_us(middle(over(arm, base, 1)) * 1e6)}"

                step = middle([run["pace_s"] if measure == "paced" else run["step_s"] for run in runs])
                ours_all = over("ours", "none", 1)
                pct = middle(ours_all) / step * 100
                rows.append([f"{measure}{tag}", k, fmt_us(middle([r[measure]["none"][k][0] for r in runs]) * 1e6),
                             pair("empty", "none"),
                             f"{fmt_us(middle(over('ours', 'none', 0)) * 1e6)} / **{fmt_us(middle(ours_all) * 1e6)}**"
                             f" ({fmt_us(ours_all[0] * 1e6)}–{fmt_us(ours_all[-1] * 1e6)})",
                             pair("ours", "empty"),
                             f"{pct:.3f} % of {step * 1e3:.2f} ms: " + ("met" if pct <= 0.1 else "missed")])
    return rows


def arms_notes(a: argparse.Namespace) -> list[str]:
    return [f"HF: a tiny GPT-2 (tests/integrations/hf_tiny.py); {a.hf_pairs} process(es) a code, alternated; in "
            "each, the three arms alternated: tight (2,000 steps back to back through HF's CallbackHandler, median of "
            f"7 rounds), paced (≥ {a.paced_steps} steps of {a.pace_ms:g} ms an arm, whole intervals, in chunks of 20 "
            "alternated; ours' records' thread by its own CPU clock in a run of ours alone), in "
            f"training (≥ {a.trained_steps} steps of Trainer.train an arm, 2 trainings, the dispatch timed in place; "
            "its none arm is the timer pair). CPU a step; 'all' counts the records' thread too. The no-callback "
            "column: HF's dispatch of the events to no callback (tight), with a 10-ms sleep's wake-up (paced), the "
            "timer pair taken off the others (trained)"]


ARMS_HEADERS = ["measure", "logging_steps", "no callback: CPU a step (thread)",
                "empty − none (thread / all)", "ours − none (thread / all; range)", "ours − empty (thread / all)",
                "ours − none, all threads, ≤ 0.1 %"]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--calls", type=int, default=5000)
    p.add_argument("--hf-steps", type=int, default=60)
    p.add_argument("--json", default=None)
    p.add_argument("--babysit-only", action="store_true", help="time babysit.log alone (stdlib only)")
    p.add_argument("--before", metavar="DIR", help="also time DIR/babysit/client.py (bench/export_before.sh), "
                                                   "in the same rounds, and DIR's HF callback")
    p.add_argument("--paced-steps", type=int, default=400, help="steps of the callback's paced run")
    p.add_argument("--pace-ms", type=float, default=10.0,
                   help="the paced run's step (the same for both codes: a tiny model's step on a quiet box)")
    p.add_argument("--trained-steps", type=int, default=800,
                   help="steps of real training (2 trainings a code, alternated) in which the callback's dispatch "
                        "is timed in place; 0: not run")
    p.add_argument("--hf-pairs", type=int, default=2, help="callback measurements (a process each) per code")
    p.add_argument("--hf-logging-steps", metavar="K,K,…", default=None,
                   help="the callback's three arms (no callback, an empty TrainerCallback, ours) at these "
                        "logging_steps, each measure (tight, paced, in training), instead of the one-arm rows")
    p.add_argument("--hf-only", action="store_true", help="the callback alone: no babysit.log, no wandb")
    p.add_argument("--hf-worker", metavar="TREE", default=None, help=argparse.SUPPRESS)
    a = p.parse_args()
    intervals = [int(k) for k in a.hf_logging_steps.split(",")] if a.hf_logging_steps else None
    if a.hf_worker is not None:  # one callback measurement, as JSON on stdout (hf_in_process)
        if a.hf_worker:
            sys.path.insert(0, str(Path(a.hf_worker).resolve()))
        import json

        import babysit

        if intervals:
            got = hf_arms(a.hf_steps, intervals, paced_steps=a.paced_steps, pace_s=a.pace_ms / 1000,
                          trained_steps=a.trained_steps)
            print(json.dumps({**got, "babysit": str(Path(babysit.__file__).resolve().parent)}))
            return 0
        got = hf_callback(a.hf_steps, paced_steps=a.paced_steps, pace_s=a.pace_ms / 1000)
        if a.trained_steps:
            got.update(hf_in_training(a.trained_steps))
        print(json.dumps({**got, "babysit": str(Path(babysit.__file__).resolve().parent)}))
        return 0
    codes = {"now": None, **({"before": a.before} if a.before else {})}
    if a.hf_only:
        hfs = {code: [] for code in codes}
        for _ in range(a.hf_pairs):
            for code, tree in codes.items():
                hfs[code].append(hf_in_process(tree, a.hf_steps, a.paced_steps, a.pace_ms, a.trained_steps,
                                               a.hf_logging_steps))
        title = "The HF callback's cost a step, three arms (bench/logger_cost.py --hf-only)"
        if intervals:
            emit(title, ARMS_HEADERS, arms_rows(hfs), {"hf": hfs}, a.json, notes=arms_notes(a))
        else:
            emit(title, ["call", "median", "p90", "CPU a call", "target"], hf_rows(hfs), {"hf": hfs}, a.json)
        return 0
    recs = records(a.calls)
    clients = {"now": load_client(None)}
    if a.before:
        clients["before"] = load_client(a.before)
    with tempfile.TemporaryDirectory() as d:
        timed = time_babysit(Path(d) / "train_log.jsonl", recs, clients)
        ours = timed["now"]
        rows = []
        for name, got in timed.items():
            label = "`babysit.log` per call" + (" (before)" if name == "before" else "")
            rows.append([label, fmt_us(got["median_us"]), fmt_us(got["p90_us"]), fmt_us(got["cpu_us"]),
                         "≤ 10 µs: " + ("met" if got["median_us"] <= 10 else "missed")])
        headers = ["call", "median", "p90", "CPU a call", "target"]
        if a.babysit_only:
            emit("babysit.log per call (bench/logger_cost.py --babysit-only)", headers, rows,
                 {"babysit": timed, "calls": a.calls}, a.json)
            return 0
        theirs_samples, init_s, finish_s = time_wandb(Path(d), recs)
        theirs = summary(theirs_samples)
    hfs: dict[str, list[dict[str, Any]]] = {code: [] for code in codes}
    for _ in range(a.hf_pairs):
        for code, tree in codes.items():
            hfs[code].append(hf_in_process(tree, a.hf_steps, a.paced_steps, a.pace_ms, a.trained_steps,
                                           a.hf_logging_steps))
    ratio = theirs["median_us"] / ours["median_us"]
    rows.append(["`wandb.log` per call (offline)", fmt_us(theirs["median_us"]), fmt_us(theirs["p90_us"]), "—",
                 f"ours {ratio:,.1f}× cheaper: " + ("met" if ratio >= 10 else "missed") + " (≥ 10×)"])
    data = {"babysit": timed, "wandb": theirs, "wandb_init_s": init_s, "wandb_finish_s": finish_s, "hf": hfs,
            "calls": a.calls}
    calls_note = (f"{a.calls} calls each, the same records (3 floats), babysit's in 10 rounds interleaved with "
                  f"--before's; wandb.init {init_s:.2f} s and run.finish {finish_s:.2f} s not counted in its "
                  "per-call figure")
    if intervals:
        emit("Logger cost per call (bench/logger_cost.py)", headers, rows, data, None, notes=[calls_note])
        emit("The HF callback's cost a step, three arms", ARMS_HEADERS, arms_rows(hfs), data, a.json,
             notes=arms_notes(a))
        return 0
    rows.extend(hf_rows(hfs))
    hf = hfs["now"][0]
    emit("Logger cost per call (bench/logger_cost.py)", headers, rows, data, a.json,
         notes=[calls_note,
                f"HF: a tiny GPT-2 (tests/integrations/hf_tiny.py), {a.hf_steps} steps, logging every step, in a "
                f"process of its own for each code, alternated {a.hf_pairs} times; the callback's share of a "
                f"step: HF's dispatch of its every-step hooks ({hf['per_step_s'] * 1e6:.1f} µs) and of on_log with "
                f"one record ({hf['log_s'] * 1e6:.1f} µs on the training thread, {hf['log_total_s'] * 1e6:.1f} µs "
                "with the records' thread writing it), on the trainer's real state, less an empty handler's; "
                "the paced run: the module doc"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
