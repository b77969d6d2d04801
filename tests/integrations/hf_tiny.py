"""A tiny real Hugging Face training (GPT-2 from a config, random tokens, CPU, no download), used in-process by
the tests and as a trainer babysit launches: `python -m tests.integrations.hf_tiny --out DIR [--nan-at N]`.

`nan_at`: from the N-th training forward on, the model's loss is multiplied by NaN (a forward hook), the
way a real divergence poisons the loss and then the gradients.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

VOCAB = 64


def tiny_trainer(out_dir: str, callbacks: Sequence[Any], *, max_steps: int = 30, logging_steps: int = 5,
                 eval_steps: int = 10, nan_at: int = 0, seed: int = 0, report_to: Sequence[str] = (),
                 disable_tqdm: bool = True) -> Trainer:
    torch.manual_seed(seed)
    config = GPT2Config(vocab_size=VOCAB, n_positions=16, n_embd=32, n_layer=2, n_head=2,
                        bos_token_id=0, eos_token_id=0)
    model = GPT2LMHeadModel(config)
    tokens = torch.randint(0, VOCAB, (48, 16), generator=torch.Generator().manual_seed(seed))
    data = [{"input_ids": row, "labels": row} for row in tokens]
    if nan_at:
        forwards = [0]

        def poison(module: torch.nn.Module, inputs: Any, output: Any) -> Any:
            if module.training:
                forwards[0] += 1
                if forwards[0] >= nan_at:
                    output.loss = output.loss * float("nan")
            return output

        model.register_forward_hook(poison)
    args = TrainingArguments(output_dir=out_dir, max_steps=max_steps, per_device_train_batch_size=8,
                             per_device_eval_batch_size=8, logging_steps=logging_steps, eval_strategy="steps",
                             eval_steps=eval_steps, save_strategy="no", report_to=list(report_to), use_cpu=True,
                             disable_tqdm=disable_tqdm, seed=seed, dataloader_num_workers=0, learning_rate=1e-3)
    return Trainer(model=model, args=args, train_dataset=data, eval_dataset=data[:16], callbacks=list(callbacks))


def main(argv: Sequence[str] | None = None) -> int:
    from babysit.integrations.huggingface import BabysitCallback

    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--max-steps", type=int, default=30)
    parser.add_argument("--nan-at", type=int, default=0)
    parser.add_argument("--history", help="write HF's own state.log_history here (JSON) when training ends")
    a = parser.parse_args(argv)
    torch.set_num_threads(1)  # two shared cores: more threads only spin
    trainer = tiny_trainer(a.out, [BabysitCallback()], max_steps=a.max_steps, nan_at=a.nan_at)
    try:
        trainer.train()
    finally:
        if a.history:
            with open(a.history, "w") as f:
                json.dump(trainer.state.log_history, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
