"""A real Hugging Face `Trainer` with no babysit code in it, as a user's script is: HF's own TensorBoard
reporting (`report_to=["tensorboard"]`: event files under `<out>/runs/<date>_<host>/`, tags `train/loss`,
`eval/loss`, …), and quiet (no printer, no progress bar), so the event files are the only output that
grows, once every `--every` steps, when HF logs and flushes them. babysit reads them with
`[source] kind = "tensorboard"`.

    python -m tests.integrations.hf_plain --out DIR [--max-steps N] [--every N] [--step-seconds S]
        [--times FILE] [--history FILE]

`--step-seconds`: every step is paced to last S seconds (tests/integrations/pace.py); `--times`: the step-end
times HF's own callback sees; `--history`: HF's `state.log_history` (JSON) when training ends.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from typing import Any

import torch
from transformers import PrinterCallback, TrainerCallback

from tests.integrations.hf_tiny import tiny_trainer
from tests.integrations.pace import Metronome


class Paced(TrainerCallback):
    def __init__(self, metronome: Metronome) -> None:
        self.metronome = metronome

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.metronome.start()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.metronome.step_end(state.global_step)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--max-steps", type=int, default=30)
    parser.add_argument("--every", type=int, default=10, help="logging_steps and eval_steps")
    parser.add_argument("--step-seconds", type=float, default=0.0)
    parser.add_argument("--times")
    parser.add_argument("--history")
    a = parser.parse_args(argv)
    torch.set_num_threads(1)  # two shared cores: more threads only spin
    trainer = tiny_trainer(a.out, [Paced(Metronome(a.step_seconds, a.times))], max_steps=a.max_steps,
                           logging_steps=a.every, eval_steps=a.every, report_to=["tensorboard"])
    trainer.remove_callback(PrinterCallback)  # quiet: only the event files grow
    trainer.train()
    if a.history:
        os.makedirs(os.path.dirname(os.path.abspath(a.history)), exist_ok=True)
        with open(a.history, "w") as f:
            json.dump(trainer.state.log_history, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
