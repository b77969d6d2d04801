"""A training loop that logs with MLflow and nothing else (no babysit code), as a user's script is: babysit
reads the tracking store MLflow writes with `[source] kind = "mlflow"`.

    python -m tests.integrations.mlflow_plain [--steps N] [--every K] [--sleep S] [--nan-at N] [--exit-on-nan]

It logs to MLflow's default store (MLflow 3: `sqlite:///mlflow.db` in the working directory) unless
`$MLFLOW_TRACKING_URI` says otherwise. `--nan-at N`: the loss is NaN from step N on; the loop goes on, as
a plain script does. Each step's values: `expected(step)` (the tests compare them bit for bit).
"""

from __future__ import annotations

import argparse
import math
import sys
import time


def expected(step: int) -> dict[str, float]:
    loss = 3.0 * math.exp(-step / 20) + 0.5
    return {"train_loss": loss, "lr": 1e-3 * (1 - step / 10_000), "eval_loss": loss + 1 / 3}


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--every", type=int, default=5)
    p.add_argument("--sleep", type=float, default=0.0)
    p.add_argument("--nan-at", type=int, default=0)
    a = p.parse_args()
    import mlflow

    with mlflow.start_run(run_name="plain"):
        mlflow.log_params({"steps": a.steps, "every": a.every})
        for step in range(1, a.steps + 1):
            time.sleep(a.sleep)
            values = expected(step)
            if a.nan_at and step >= a.nan_at:
                values["train_loss"] = float("nan")
            if step % a.every == 0:
                mlflow.log_metrics({"train_loss": values["train_loss"], "lr": values["lr"]}, step=step)
            if step % (4 * a.every) == 0:
                mlflow.log_metric("eval_loss", values["eval_loss"], step=step)
    return 0


if __name__ == "__main__":
    sys.exit(main())
