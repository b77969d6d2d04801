"""The general printed-metrics reader (babysit/core/reading/printed.py): lines as trainers print them, each to the
record babysit must read. The corpus of real trainers' output is tests/test_printed_corpus.py; these pin the
rules one at a time."""

from __future__ import annotations

import math

import pytest

from babysit.core.reading.printed import Progress, describe_record, parse


def read(*lines: str) -> tuple[list[tuple[int, dict[str, float]]], list[tuple[str, str]]]:
    progress = Progress()
    out = []
    for line in lines:
        parsed = parse(line)
        got = progress.step(parsed, line) if parsed is not None else None
        if got is not None:
            out.append(got)
    return out, progress.notices


@pytest.mark.parametrize("line, step, metrics", [
    ("step 10 | loss 0.6931 | lr 1e-3", 10, {"loss": 0.6931, "lr": 0.001}),
    ("step=10, loss=0.6931, lr=0.001", 10, {"loss": 0.6931, "lr": 0.001}),
    ("step: 10; loss: 0.6931; lr: 0.001", 10, {"loss": 0.6931, "lr": 0.001}),
    ("step 10\tloss 0.6931\tlr 0.001", 10, {"loss": 0.6931, "lr": 0.001}),
    ("iter 10: loss 4.2, time 30.5ms, mfu 3.4%", 10, {"loss": 4.2, "time_ms": 30.5, "mfu_pct": 3.4}),
    ("global_step 300 train/loss 2.5 val/acc@1 0.7", 300, {"train/loss": 2.5, "val/acc@1": 0.7}),
    ("it 7 Loss: 1.5 Time: 0.356s", 7, {"loss": 1.5, "time_s": 0.356}),
    ("step 100: train loss 4.2, val loss 4.3", 100, {"train_loss": 4.2, "val_loss": 4.3}),
    ("[Rank 0] step=10, skipped=0, lr=[0.0001], mom=[(0.9, 0.999)]", 10, {"skipped": 0.0, "lr": 0.0001}),
    ("2024-05-01 12:00:00,123 - INFO - step 10 loss 0.5 eta 0:10:00", 10, {"loss": 0.5}),
    ("iteration 10/ 500000 | elapsed time per iteration (ms): 1234.5 | number of nan iterations:   0 |", 10,
     {"elapsed_time_per_iteration_ms": 1234.5, "number_of_nan_iterations": 0.0}),
    ("step 20 rank 3 gpu 1 loss 0.25", 20, {"loss": 0.25}),
])
def test_a_line_reads_to_its_step_and_metrics(line, step, metrics):
    got, _ = read(line)
    assert got == [(step, metrics)]


def test_nan_and_inf_are_values_when_printed_as_values():
    got, _ = read("step 10 | loss nan | grad_norm inf", "step 11 loss=NaN lr=-inf")
    assert got[0][0] == 10 and math.isnan(got[0][1]["loss"]) and got[0][1]["grad_norm"] == math.inf
    assert math.isnan(got[1][1]["loss"]) and got[1][1]["lr"] == -math.inf
    lightning, _ = read("step 12 | train_loss=nan.0")  # Lightning's bar formats a NaN so
    assert math.isnan(lightning[0][1]["train_loss"])


@pytest.mark.parametrize("line", [
    "Using batch size 32 and lr 0.001",  # a batch size, not a counter
    "number of parameters: 10.65M",  # a preamble: no step read yet
    "Epoch 1/3",  # a Keras header: carried to the lines after, no record itself
    "  0%|          | 0/100 [00:00<?, ?it/s]",  # a bar's first frame: no step done
    "saving checkpoint to out/ckpt.pt",
])
def test_lines_that_are_no_record(line):
    assert read(line)[0] == []


def test_a_per_epoch_counter_with_its_total_counts_on_across_epochs():
    got, notices = read("[epoch 1/3][batch 20/100] loss=0.5", "[epoch 1/3][batch 100/100] loss=0.4",
                        "[epoch 2/3][batch 20/100] loss=0.3", "[epoch 3/3][batch 20/100] loss=0.2")
    assert [s for s, _ in got] == [20, 100, 120, 220]
    assert notices[0][0] == "general-per-epoch" and "100 per epoch" in notices[0][1]


def test_a_zero_based_epoch_counts_from_zero():
    got, _ = read("Epoch: [0][ 10/5005]\tLoss 6.9 (6.9)", "Epoch: [1][ 10/5005]\tLoss 6.1 (6.2)")
    assert got == [(10, {"loss": 6.9}), (5015, {"loss": 6.1})]


def test_a_per_epoch_counter_without_a_total_is_estimated_and_said():
    got, notices = read("epoch 1 batch 100 loss 0.5", "epoch 1 batch 200 loss 0.4", "epoch 2 batch 100 loss 0.3")
    assert [s for s, _ in got] == [100, 200, 300]
    assert "about 200 per epoch" in notices[0][1] and "batch b/B" in notices[0][1]


def test_a_bar_that_restarts_with_no_epoch_printed_counts_epochs_itself():
    got, _ = read(" 50%|█████     | 50/100 [00:01<00:01, 9.50it/s, loss=0.5]",
                  "100%|██████████| 100/100 [00:02<00:00, 9.50it/s, loss=0.4]",
                  " 10%|█         | 10/100 [00:00<00:09, 9.50it/s, loss=0.3]")
    assert got == [(50, {"loss": 0.5}), (100, {"loss": 0.4}), (110, {"loss": 0.3})]


def test_an_eval_bar_is_not_the_training_bar():
    got, _ = read(" 33%|███▎      | 10/30 [00:01<00:02,  9.50it/s]", " 50%|█████     | 4/8 [00:00<00:00, 99it/s]",
                  " 40%|████      | 12/30 [00:01<00:02,  9.50it/s]")
    assert [s for s, _ in got] == [10, 12]


def test_a_global_counter_never_restarts_across_epochs():
    got, notices = read("epoch 1 step 500 loss 0.5", "epoch 2 step 600 loss 0.4", "epoch 2 | val loss 0.45")
    assert got == [(500, {"loss": 0.5}), (600, {"loss": 0.4}), (600, {"val_loss": 0.45})]
    assert notices == []


def test_a_step_that_goes_backwards_is_kept_and_said_once():
    got, notices = read("step 10 loss 0.5", "step 5 loss 0.6", "step 3 loss 0.7")
    assert [s for s, _ in got] == [10, 5, 3]
    assert [k for k, _ in notices] == ["general-backwards"] and "10 → 5" in notices[0][1]


def test_a_keras_header_carries_its_epoch_to_the_progress_line():
    got, _ = read("Epoch 1/2", "1875/1875 [====] - 3s 1ms/step - loss: 0.2948 - accuracy: 0.9150",
                  "Epoch 2/2", "1875/1875 ━━━━━━━━━━ 3s 1ms/step - accuracy: 0.8763 - loss: 0.4354")
    assert got == [(1875, {"loss": 0.2948, "accuracy": 0.915}), (3750, {"accuracy": 0.8763, "loss": 0.4354})]


def test_an_eval_summary_with_no_counter_is_at_the_last_step():
    got, _ = read("Train Epoch: 1 [59520/60000 (99%)]\tLoss: 0.300000",
                  "Test set: Average loss: 0.0341, Accuracy: 9890/10000 (99%)")
    assert got[1] == (59520, {"average_loss": 0.0341})


def test_another_phases_counter_is_recorded_at_the_training_step_with_its_name():
    got, _ = read("Epoch(train) [1][ 50/313]  lr: 1.0000e-01  eta: 0:10:00  loss: 2.3",
                  "Epoch(val) [1][100/100]    accuracy/top1: 76.5")
    assert got == [(50, {"lr": 0.1, "loss": 2.3}), (50, {"val_accuracy/top1": 76.5})]


def test_progress_survives_a_round_trip_through_its_persisted_state():
    progress = Progress()
    for line in ("[epoch 1/3][batch 100/100] loss=0.4", "[epoch 2/3][batch 20/100] loss=0.3"):
        progress.step(parse(line), line)
    again = Progress.from_dict(progress.to_dict())
    line = "[epoch 2/3][batch 40/100] loss=0.2"
    assert again.step(parse(line), line) == (140, {"loss": 0.2})
    assert again.notices == []  # said once, before the round trip


def test_describe_record_is_the_answer_about_reading():
    assert describe_record(10, {"loss": 0.6931, "lr": 0.001}) == "step 10: loss=0.6931 lr=0.001"
    assert describe_record(10, {}) == "step 10 (a progress bar: no metric printed)"
