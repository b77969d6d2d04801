"""What one log call costs the training loop: `babysit.log` vs `wandb.log` (offline mode), the same
records, the same machine, in one run; and the HF `BabysitCallback`'s cost per step against a tiny real
model's step.

  python bench/logger_cost.py              # ~2.5 min here (wandb's start-up, HF's imports, the paced runs)
  python bench/logger_cost.py --calls 20000 --json out.json
  python bench/logger_cost.py --before DIR # DIR from bench/export_before.sh: its client and its HF
                                           # callback measured in the same run, round for round (~5 min)
  python3 bench/logger_cost.py --babysit-only   # no wandb/transformers there (e.g. a bare GPU box)

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
import importlib.util
import os
import sys
import tempfile
import time
from itertools import pairwise
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import emit, fmt_us, summary

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def records(n: int) -> list[dict[str, float]]:
    return [{"train_loss": 2.5 / (1 + i / 1000), "lr": 3e-4, "grad_norm": 0.8731 + i * 1e-6} for i in range(n)]


def client_at(before: str | None) -> Any:
    """This tree's `babysit.integrations.client`, or (before) DIR's loaded on its own (stdlib only):
    DIR/babysit/integrations/client.py, or DIR/babysit/client.py for code from before the package move."""
    if before is None:
        from babysit.integrations import client

        return client
    where = Path(before) / "babysit" / "integrations" / "client.py"
    if not where.exists():
        where = Path(before) / "babysit" / "client.py"
    spec = importlib.util.spec_from_file_location("babysit_client_before", where)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def time_babysit(tmp: Path, recs: list[dict[str, float]], clients: dict[str, Any],
                 rounds: int = 10) -> dict[str, dict[str, Any]]:
    """Each client's `log` over the records, in `rounds` interleaved rounds (a noisy box's load falls on
    both alike): every call's wall time, and the CPU a call (`time.process_time` over a round / its calls)."""
    os.environ["BABYSIT_LOG"] = str(tmp / "train_log.jsonl")
    walls: dict[str, list[float]] = {name: [] for name in clients}
    cpus: dict[str, list[float]] = {name: [] for name in clients}
    per = max(1, len(recs) // rounds)
    for r in range(rounds):
        chunk = recs[r * per:(r + 1) * per]
        for name, client in clients.items():
            log = client.log
            log(0, warmup=1.0)
            out = walls[name]
            c0 = time.process_time()
            for step, rec in enumerate(chunk, start=1):
                t0 = time.perf_counter()
                log(step, **rec)
                out.append(time.perf_counter() - t0)
            cpus[name].append((time.process_time() - c0) / len(chunk))
    result = {}
    for name in clients:
        cpu = sorted(cpus[name])
        result[name] = {**summary(walls[name]), "cpu_us": cpu[len(cpu) // 2] * 1e6, "cpu_min_us": cpu[0] * 1e6}
    return result


def time_wandb(tmp: Path, recs: list[dict[str, float]]) -> tuple[list[float], float, float]:
    os.environ.update({"WANDB_MODE": "offline", "WANDB_SILENT": "true", "WANDB_DIR": str(tmp)})
    import wandb

    t0 = time.perf_counter()
    run = wandb.init(project="babysit-bench")
    init_s = time.perf_counter() - t0
    wandb.log({"warmup": 1.0}, step=0)
    out = []
    for step, rec in enumerate(recs, start=1):
        t0 = time.perf_counter()
        wandb.log(rec, step=step)
        out.append(time.perf_counter() - t0)
    t0 = time.perf_counter()
    run.finish()
    return out, init_s, time.perf_counter() - t0


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

    class Records(TrainerCallback):
        """Before ours in the list: its records' thread's CPU at each step's end and at the train's end
        (before ours closes it; the one empty wake-up after the close is not counted)."""

        def __init__(self, callback: Any) -> None:
            self.callback, self.cpu = callback, 0.0

        def _sample(self) -> None:
            thread = self.callback.records._thread if self.callback is not None else None
            if thread is not None and thread.ident is not None:
                try:
                    self.cpu = time.clock_gettime(time.pthread_getcpuclockid(thread.ident))
                except (OSError, AttributeError):
                    pass

        def on_step_end(self, args, state, control, **kw):  # type: ignore[no-untyped-def]
            self._sample()

        def on_train_end(self, args, state, control, **kw):  # type: ignore[no-untyped-def]
            self._sample()

    def timed(handler: Any, target: Any, arm: str) -> Any:
        def call_event(event: str, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
            for callback in handler.callbacks:
                if callback is target:
                    t0 = clock()
                    result = None if arm == "none" else getattr(callback, event)(
                        args, state, control, model=handler.model, processing_class=handler.processing_class,
                        optimizer=handler.optimizer, lr_scheduler=handler.lr_scheduler,
                        train_dataloader=handler.train_dataloader, eval_dataloader=handler.eval_dataloader,
                        **kwargs)
                    spent[arm] += clock() - t0
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


def hf_in_process(tree: str | None, hf_steps: int, paced_steps: int, pace_ms: float,
                  trained_steps: int) -> dict[str, Any]:
    """`hf_callback` in a process of its own, on this tree's babysit or (tree) DIR's (bench/export_before.sh;
    DIR has no tests/: the tiny trainer is this tree's)."""
    import json
    import subprocess

    argv = [sys.executable, str(Path(__file__).resolve()), "--hf-worker", tree or "",
            "--hf-steps", str(hf_steps), "--paced-steps", str(paced_steps), "--pace-ms", str(pace_ms),
            "--trained-steps", str(trained_steps)]
    done = subprocess.run(argv, capture_output=True, text=True, check=True, cwd=str(REPO))
    return json.loads(done.stdout.strip().splitlines()[-1])


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
    p.add_argument("--hf-worker", metavar="TREE", default=None, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.hf_worker is not None:  # one callback measurement, as JSON on stdout (hf_in_process)
        if a.hf_worker:
            sys.path.insert(0, str(Path(a.hf_worker).resolve()))
        import json

        import babysit

        got = hf_callback(a.hf_steps, paced_steps=a.paced_steps, pace_s=a.pace_ms / 1000)
        if a.trained_steps:
            got.update(hf_in_training(a.trained_steps))
        print(json.dumps({**got, "babysit": str(Path(babysit.__file__).resolve().parent)}))
        return 0
    recs = records(a.calls)
    clients = {"now": client_at(None)}
    if a.before:
        clients["before"] = client_at(a.before)
    with tempfile.TemporaryDirectory() as d:
        timed = time_babysit(Path(d), recs, clients)
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
    codes = {"now": None, **({"before": a.before} if a.before else {})}
    hfs: dict[str, list[dict[str, Any]]] = {code: [] for code in codes}
    for _ in range(a.hf_pairs):
        for code, tree in codes.items():
            hfs[code].append(hf_in_process(tree, a.hf_steps, a.paced_steps, a.pace_ms, a.trained_steps))
    ratio = theirs["median_us"] / ours["median_us"]
    rows.append(["`wandb.log` per call (offline)", fmt_us(theirs["median_us"]), fmt_us(theirs["p90_us"]), "—",
                 f"ours {ratio:,.1f}× cheaper: " + ("met" if ratio >= 10 else "missed") + " (≥ 10×)"])
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
    hf = hfs["now"][0]
    emit("Logger cost per call (bench/logger_cost.py)", headers, rows,
         {"babysit": timed, "wandb": theirs, "wandb_init_s": init_s, "wandb_finish_s": finish_s, "hf": hfs,
          "calls": a.calls}, a.json,
         notes=[f"{a.calls} calls each, the same records (3 floats), babysit's in 10 rounds interleaved with "
                f"--before's; wandb.init {init_s:.2f} s and run.finish {finish_s:.2f} s not counted in its "
                "per-call figure",
                f"HF: a tiny GPT-2 (tests/integrations/hf_tiny.py), {a.hf_steps} steps, logging every step, in a "
                f"process of its own for each code, alternated {a.hf_pairs} times; the callback's share of a "
                f"step: HF's dispatch of its every-step hooks ({hf['per_step_s'] * 1e6:.1f} µs) and of on_log with "
                f"one record ({hf['log_s'] * 1e6:.1f} µs on the training thread, {hf['log_total_s'] * 1e6:.1f} µs "
                "with the records' thread writing it), on the trainer's real state, less an empty handler's; "
                "the paced run: the module doc"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
