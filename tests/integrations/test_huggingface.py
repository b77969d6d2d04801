"""`BabysitCallback` on a real Hugging Face `Trainer` (a tiny GPT-2 built from a config, CPU, no network)."""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path

import pytest

from babysit.core.classify import ExitFacts, classify_exit
from babysit.core.reading.log_records import metric_series, seconds_per_step
from babysit.integrations import Diverged
from babysit.sources.logtail import read_all
from tests.conftest import Lazy, missing

pytestmark = [pytest.mark.skipif(missing("transformers", "accelerate"),
                                 reason="HF Trainer needs transformers and accelerate (pip install '.[huggingface]')"),
              pytest.mark.usefixtures("one_thread")]
hf = Lazy("babysit.integrations.huggingface")
hf_tiny = Lazy("tests.integrations.hf_tiny")


def raw(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_records_are_hf_log_history_exactly_at_global_step_with_total_steps(tmp_path: Path,
                                                                            babysit_log: Path) -> None:
    trainer = hf_tiny.tiny_trainer(str(tmp_path / "hf"), [hf.BabysitCallback()], max_steps=30, logging_steps=5, eval_steps=10)
    trainer.train()
    history = trainer.state.log_history
    records = raw(babysit_log)
    assert len(records) == len(history) > 0
    for record, logged in zip(records, history, strict=True):
        assert record["step"] == logged["step"]
        assert record["total_steps"] == 30
        assert {k: v for k, v in record.items() if k not in ("step", "ts", "total_steps")} == \
               {k: v for k, v in logged.items() if k != "step"}  # every value bit-exact
    # babysit's own reader sees the same series: eval after 10, 20, 30 steps; a train loss every 5
    parsed, garbage = read_all(babysit_log)
    assert garbage == 0
    evals = tuple((h["step"], h["eval_loss"]) for h in history if "eval_loss" in h)
    assert metric_series(parsed, "eval_loss") == evals and [s for s, _ in evals] == [10, 20, 30]
    assert [s for s, _ in metric_series(parsed, "loss")] == [5, 10, 15, 20, 25, 30]
    assert all("grad_norm" in r.metrics and "learning_rate" in r.metrics for r in parsed if "loss" in r.metrics)
    sps = seconds_per_step(parsed)
    assert sps is not None and sps > 0


def test_a_nan_loss_stops_training_writes_diverged_and_ends_with_exit_11(tmp_path: Path, babysit_log: Path,
                                                                         capfd: pytest.CaptureFixture[str]) -> None:
    callback = hf.BabysitCallback()
    trainer = hf_tiny.tiny_trainer(str(tmp_path / "hf"), [callback], max_steps=30, nan_at=12, disable_tqdm=False)
    with pytest.raises(Diverged) as stopped:
        trainer.train()
    assert stopped.value.code == 11  # what the process exits with: babysit's `diverged`
    assert 12 <= trainer.state.global_step < 30  # stopped at the first log after the NaN, not at the end
    records, garbage = read_all(babysit_log)
    assert garbage == 0
    diverged = [r for r in records if r.event == "diverged"]
    # HF's logging_nan_inf_filter hides the NaN train loss; the grad norm shows it, at the log of step 15,
    # and counts at the next log (20): one infinite grad norm may be an fp16 loss scaler's skipped step
    assert len(diverged) == 1 and diverged[0].step == 20
    bad = next(r for r in records if r.step == 15 and "learning_rate" in r.metrics)
    assert "grad_norm" in bad.nonfinite
    stderr = capfd.readouterr().err  # HF's own tqdm bar, redrawn with \r, and the callback's line
    assert "non-finite grad_norm" in stderr and "\r" in stderr
    for exit_code in (11, 1):  # the worker's own code, and a launcher (torchrun) reporting 1
        got = classify_exit(ExitFacts(exit_code=exit_code, signal=None, stderr_tail=stderr, last_records=records[-16:],
                            rules=(), stop_requested=False))
        assert got.outcome == "diverged", (exit_code, got.summary)
        # the metric and its value, never "non-finite loss"; the tail as a terminal showed it
        assert got.summary == f"diverged: grad_norm = nan at step 20 (exit {exit_code})", got.summary
        tail = str(got.detail["stderr_tail"]).splitlines()
        assert not any(c in got.detail["stderr_tail"] for c in "\r\x1b"), tail  # no redraws, no cursor moves
        assert all(a != b for a, b in itertools.pairwise(tail)) and len(tail) < stderr.count("\r") / 3, tail
        assert any("babysit: diverged: non-finite grad_norm" in line for line in tail), tail


def test_with_exit_code_none_a_divergence_only_stops_training(tmp_path: Path, babysit_log: Path) -> None:
    callback = hf.BabysitCallback(exit_code=None)
    trainer = hf_tiny.tiny_trainer(str(tmp_path / "hf"), [callback], max_steps=30, logging_steps=2, eval_steps=100, nan_at=3)
    trainer.train()
    # the NaN from step 3 is logged at 4 (one infinite grad norm may be a skipped fp16 step) and counts at 6
    assert trainer.state.global_step == 6 and callback.diverged is not None
    assert [r["event"] for r in raw(babysit_log) if "event" in r] == ["diverged"]


def test_a_nan_eval_loss_is_divergence_too(tmp_path: Path, babysit_log: Path) -> None:
    callback = hf.BabysitCallback(exit_code=None, watch=("eval_loss",))
    trainer = hf_tiny.tiny_trainer(str(tmp_path / "hf"), [callback], max_steps=30, logging_steps=50, eval_steps=5)

    def nan_eval(module: object, inputs: object, output: object) -> object:
        if not trainer.model.training:
            output.loss = output.loss * math.nan  # type: ignore[attr-defined]
        return output

    trainer.model.register_forward_hook(nan_eval)
    trainer.train()
    assert trainer.state.global_step == 5
    (event,) = [r for r in raw(babysit_log) if r.get("event") == "diverged"]
    assert event["step"] == 5 and math.isnan(event["eval_loss"])


def test_the_diverged_record_is_on_disk_after_the_records_before_it_when_on_log_returns(tmp_path: Path) -> None:
    """Records are written off the training thread; the divergence is not left to it: when on_log returns,
    the records queued before it and then the diverged record are in the file (the process may exit next)."""
    from transformers import TrainerControl, TrainerState

    log = tmp_path / "log.jsonl"
    callback = hf.BabysitCallback(str(log), exit_code=None)
    state, control = TrainerState(max_steps=100, is_world_process_zero=True), TrainerControl()
    callback.records.delay = 3600  # its thread would not write them in this test's time
    for step, loss in ((10, 3.5), (20, 3.25), (30, float("nan"))):
        state.global_step = step
        callback.on_log(None, state, control, logs={"loss": loss, "learning_rate": 1e-3})
    got = raw(log)
    assert [(r["step"], r.get("event")) for r in got] == [(10, None), (20, None), (30, None), (30, "diverged")]
    assert got[0]["loss"] == 3.5 and got[0]["total_steps"] == 100 and math.isnan(got[2]["loss"])
    assert control.should_training_stop
    callback.on_train_end(None, state, control)


def test_an_eval_record_is_on_disk_when_on_log_returns_and_step_records_wait_for_their_batch(tmp_path: Path) -> None:
    """What a verdict reads never waits in the queue: an `eval_*` record (and the step records queued before
    it, in order) is in the file when on_log returns; a step record alone waits for the writer's batch."""
    from transformers import TrainerControl, TrainerState

    log = tmp_path / "log.jsonl"
    callback = hf.BabysitCallback(str(log), exit_code=None)
    assert callback.records.delay == hf.STEP_RECORDS_DELAY == 1.0
    state, control = TrainerState(max_steps=100, is_world_process_zero=True), TrainerControl()
    callback.records.delay = 3600  # its thread would not write them in this test's time
    state.global_step = 10
    callback.on_log(None, state, control, logs={"loss": 3.5, "learning_rate": 1e-3})
    assert not log.exists() or raw(log) == [], "a step record waits for its batch"
    state.global_step = 20
    callback.on_log(None, state, control, logs={"eval_loss": 3.25, "eval_runtime": 0.5})
    assert [(r["step"], r.get("loss"), r.get("eval_loss")) for r in raw(log)] == [(10, 3.5, None), (20, None, 3.25)]
    state.global_step = 30
    callback.on_log(None, state, control, logs={"loss": 3.0})
    assert len(raw(log)) == 2
    callback.on_train_end(None, state, control)
    assert [r["step"] for r in raw(log)] == [10, 20, 30]


def test_another_rank_writes_nothing_and_still_stops_on_a_nan_and_new_key_sets_keep_their_kind(tmp_path: Path) -> None:
    """on_log's one pass (a step record of known keys and plain finite values, on the main process) and its
    careful way agree: a rank other than 0 writes nothing yet stops training on a NaN loss; on the main
    process a key set first seen as a step's stays one, an eval's is on disk when on_log returns."""
    from transformers import TrainerControl, TrainerState

    log = tmp_path / "log.jsonl"
    other = hf.BabysitCallback(str(log), exit_code=None)
    state, control = TrainerState(max_steps=50, is_world_process_zero=False), TrainerControl()
    for step, loss in ((1, 2.0), (2, 1.5), (3, float("nan"))):
        state.global_step = step
        other.on_log(None, state, control, logs={"loss": loss, "grad_norm": 0.5})
    other.on_train_end(None, state, control)
    assert control.should_training_stop and other.diverged is not None and not log.exists()

    main = hf.BabysitCallback(str(log), exit_code=None)
    main.records.delay = 3600
    state, control = TrainerState(max_steps=50, is_world_process_zero=True), TrainerControl()
    for step in range(1, 4):
        state.global_step = step
        main.on_log(None, state, control, logs={"loss": 2.0 / step, "grad_norm": 0.5, "total_steps": 7})
        main.on_log(None, state, control, logs={"test_acc": 0.5 + step / 10, "epoch": 1.0})
        assert [r["step"] for r in raw(log)] == [s for s in range(1, step + 1) for _ in (0, 1)]
    assert raw(log)[0] == {"step": 1, "ts": raw(log)[0]["ts"], "loss": 2.0, "grad_norm": 0.5, "total_steps": 7}
    assert raw(log)[1]["total_steps"] == 50 and not control.should_training_stop
    main.on_train_end(None, state, control)


def test_a_callback_after_ours_changing_hfs_logs_changes_nothing_written(tmp_path: Path, babysit_log: Path) -> None:
    """HF hands every callback one `logs` dict (its own `PrinterCallback`, after ours, pops `total_flos`); a step
    record is read into a tuple when on_log is called, so a later callback changing the dict, or HF reusing it,
    changes nothing babysit writes: the records are HF's log_history exactly, the queued ones included."""
    from transformers import TrainerCallback

    class Meddler(TrainerCallback):
        def on_log(self, args, state, control, logs=None, **kwargs):  # type: ignore[no-untyped-def]
            if logs:
                logs.pop("loss", None)
                logs["grad_norm"] = -1.0
                logs["added"] = 1.0

    callback = hf.BabysitCallback()
    callback.records.delay = 3600  # every step record waits in the queue until the end of training
    trainer = hf_tiny.tiny_trainer(str(tmp_path / "hf"), [callback, Meddler()], max_steps=12, logging_steps=1,
                                   eval_steps=100)
    trainer.train()
    history = trainer.state.log_history
    records = raw(babysit_log)
    assert len(records) == len(history) and sum("loss" in logged for logged in history) == 12
    for record, logged in zip(records, history, strict=True):
        assert {k: v for k, v in record.items() if k not in ("step", "ts", "total_steps")} == \
               {k: v for k, v in logged.items() if k != "step"}
        assert record["step"] == logged["step"] and record["total_steps"] == 12


def test_each_logged_record_is_written_as_encode_writes_it_with_total_steps(tmp_path: Path) -> None:
    """Each on_log is byte for byte the record `encode` writes, with max_steps as `total_steps` when it is a
    positive int and the record names none; a bool, a float subclass (numpy's float64), a float step and a huge
    int are written as `encode` writes them."""
    from transformers import TrainerControl, TrainerState

    from babysit.integrations.client import JsonlWriter

    class Sub(float):
        pass

    log = tmp_path / "log.jsonl"
    callback = hf.BabysitCallback(str(log), exit_code=None)
    callback.records.delay = 3600
    state, control = TrainerState(max_steps=100, is_world_process_zero=True), TrainerControl()
    cases: list[tuple[object, object, dict[str, object]]] = [  # (global_step, max_steps, logs)
        *((step, 100, {"loss": 1 / step, "grad_norm": 0.5 + step, "learning_rate": 1e-3, "epoch": step / 7})
          for step in range(1, 6)),
        (6, 0, {"loss": 0.5, "grad_norm": 0.5, "learning_rate": 1e-3, "epoch": 1.0}),
        (7, None, {"loss": 0.5, "grad_norm": 0.5, "learning_rate": 1e-3, "epoch": 1.0}),
        (8, 100.0, {"loss": 0.5, "grad_norm": 0.5, "learning_rate": 1e-3, "epoch": 1.0}),
        (9, 100, {"loss": 0.5, "grad_norm": True, "learning_rate": 1e-3, "epoch": 1.0}),
        (10, 100, {"loss": Sub(0.5), "grad_norm": 0.5, "learning_rate": 1e-3, "epoch": 1.0}),
        (11.0, 100, {"loss": 0.5, "grad_norm": 0.5, "learning_rate": 1e-3, "epoch": 1.0}),
        (12, 100, {"loss": 0.5, "total_steps": 7}),
        (13, 100, {"loss": 0.5, "total_steps": 7}),
        (14, 100, {"loss": 2**70, "grad_norm": -0.0, "learning_rate": 5e-324, "epoch": 0}),
    ]
    for step, total, logs in cases:
        state.global_step, state.max_steps = step, total  # type: ignore[assignment]
        callback.on_log(None, state, control, logs=logs)
    callback.on_train_end(None, state, control)
    lines = log.read_bytes().splitlines(keepends=True)
    assert len(lines) == len(cases)
    writer = JsonlWriter(None)
    for line, (step, total, logs) in zip(lines, cases, strict=True):
        ts = json.loads(line)["ts"]
        record = {**logs, "total_steps": total} if total and total > 0 and "total_steps" not in logs else logs  # type: ignore[operator]
        assert line == writer.encode(step, record, ts), line
    assert not control.should_training_stop


def test_every_hook_with_nothing_to_do_takes_any_arguments_and_returns_none(tmp_path: Path) -> None:
    """HF dispatches every event to every callback (`if result is not None: control = result`): each hook of
    ours but on_log and on_train_end is the one C no-op, whatever HF passes (its objects as keywords, an eval's
    `metrics`), returning None so HF's control stays its own."""
    import importlib

    from transformers import TrainerCallback

    ignore = importlib.import_module("babysit.integrations.huggingface")._ignore
    callback = hf.BabysitCallback(str(tmp_path / "log.jsonl"))
    events = [name for name in dir(TrainerCallback) if name.startswith("on_")]
    assert {"on_step_begin", "on_step_end", "on_epoch_begin", "on_prediction_step", "on_evaluate"} <= set(events)
    for name in set(events) - {"on_log", "on_train_end"}:
        assert getattr(hf.BabysitCallback, name) is ignore, name
        hook = getattr(callback, name)
        assert hook(None, object(), object(), model=None, processing_class=None, optimizer=None, lr_scheduler=None,
                    train_dataloader=None, eval_dataloader=None, metrics={"eval_loss": 1.0}) is None, name
