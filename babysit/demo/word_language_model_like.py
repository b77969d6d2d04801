# ruff: noqa: UP032  (the print calls are pytorch/examples' own, copied as they are)
"""A torch-free trainer that prints exactly what pytorch/examples' word_language_model prints, and nothing
babysit-specific: its batch counter restarts every epoch and its validation loss has no batch at all,
the case `step = "EXPR"` exists for (docs/your-trainer.md, computed steps).

    python -m babysit.demo.word_language_model_like [--epochs N] [--nbatches N] [--log-interval K]
        [--batch-seconds S] [--nan-at-epoch E]

The two print formats are copied from pytorch/examples word_language_model/main.py at commit
0f4dca7dc202798f545ca7c006c91956cb584f43 (`| epoch {:3d} | {:5d}/{:5d} batches | lr {:02.2f} | ms/batch
{:5.2f} | loss {:5.2f} | ppl {:8.2f}` every `log_interval` batches, and `| end of epoch {:3d} | time:
{:5.2f}s | valid loss {:5.2f} | valid ppl {:8.2f}` between rules of 89 dashes after each epoch), as is
its loop: `batch` counts from 0 within the epoch and is printed when `batch % log_interval == 0 and
batch > 0`; ms/batch is the measured time since the last print over `log_interval`. Each batch sleeps
`--batch-seconds` in place of the forward/backward pass; the loss follows a fixed curve.
"""

from __future__ import annotations

import argparse
import math
import sys
import time


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--nbatches", type=int, default=100, help="len(train_data) // args.bptt")
    p.add_argument("--log-interval", type=int, default=20)
    p.add_argument("--batch-seconds", type=float, default=0.01)
    p.add_argument("--lr", type=float, default=20.0)
    p.add_argument("--nan-at-epoch", type=int, default=0, help="from this epoch on the loss is NaN")
    args = p.parse_args()
    lr = args.lr
    step = 0
    for epoch in range(1, args.epochs + 1):
        epoch_start_time = time.time()
        total_loss = 0.0
        start_time = time.time()
        for batch in range(args.nbatches):
            time.sleep(args.batch_seconds)
            step += 1
            loss = 7.5 * math.exp(-step / 150) + 4.5
            if args.nan_at_epoch and epoch >= args.nan_at_epoch:
                loss = float("nan")
            total_loss += loss
            if batch % args.log_interval == 0 and batch > 0:
                cur_loss = total_loss / args.log_interval
                elapsed = time.time() - start_time
                print('| epoch {:3d} | {:5d}/{:5d} batches | lr {:02.2f} | ms/batch {:5.2f} | '
                      'loss {:5.2f} | ppl {:8.2f}'.format(
                          epoch, batch, args.nbatches, lr, elapsed * 1000 / args.log_interval, cur_loss,
                          math.exp(cur_loss) if cur_loss < 700 else float("inf")), flush=True)
                total_loss = 0.0
                start_time = time.time()
        val_loss = 7.0 * math.exp(-step / 150) + 4.8 if not (args.nan_at_epoch and epoch >= args.nan_at_epoch) \
            else float("nan")
        print('-' * 89)
        print('| end of epoch {:3d} | time: {:5.2f}s | valid loss {:5.2f} | '
              'valid ppl {:8.2f}'.format(epoch, (time.time() - epoch_start_time), val_loss, math.exp(val_loss)),
              flush=True)
        print('-' * 89, flush=True)
    print('=' * 89)
    print('| End of training | test loss {:5.2f} | test ppl {:8.2f}'.format(val_loss, math.exp(val_loss)))
    print('=' * 89, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
