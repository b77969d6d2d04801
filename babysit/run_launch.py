"""What an attempt is launched with: its environment and its launch post. Functions of the spec, the
attempt and what the executor adds; the supervisor starts the process and records it.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from babysit import nccl
from babysit.core import nonfinite
from babysit.core.spec import RunSpec
from babysit.store import Attempt

SECRETS = ("SLACK_BOT_TOKEN", "SLACK_APP_TOKEN", "SLACK_SIGNING_SECRET")  # the trainer has no business with them


def attempt_env(spec: RunSpec, attempt: Attempt, records_log: Path, executor_env: Mapping[str, str],
                base: Mapping[str, str]) -> dict[str, str]:
    """The attempt's environment: `base` (the daemon's), [run].env, babysit's variables (docs/your-trainer.md),
    the watched metrics for the hooks, the executor's (local: CUDA numbers GPUs as NVML does) and the NCCL
    flight recorder's (unless the user set them); never the bot's credentials."""
    env = dict(base)
    env.update(spec.env)
    env.update({"BABYSIT_RUN": spec.name, "BABYSIT_ATTEMPT": str(attempt.n),
                "BABYSIT_LOG": str(records_log if spec.log is None else spec.log),
                "BABYSIT_CHECKPOINTS": str(spec.checkpoints),
                "PYTHONUNBUFFERED": env.get("PYTHONUNBUFFERED", "1"),
                "BABYSIT_SPEC_FILE": str(spec.spec_file)})  # the Slurm executor reads [slurm] from it
    if spec.source.kind == "wandb" and "WANDB_DIR" not in spec.env:
        assert spec.source.path is not None  # wandb writes its run folders under $WANDB_DIR/wandb
        env["WANDB_DIR"] = str(spec.source.path)
    watched = nonfinite.to_env(spec.guards.nonfinite_metrics)  # the hooks watch what the guard does
    if watched is not None:
        env[nonfinite.ENV] = watched
    for secret in SECRETS:
        env.pop(secret, None)
    env.update(executor_env)
    env.update(nccl.flight_recorder_env(env, Path(attempt.attempt_dir)))
    return env


def launch_payload(spec: RunSpec, attempt: Attempt, note: str | None, max_attempts: int,
                   default_channel: str | None) -> dict[str, Any]:
    """The launch post of an attempt (the run's thread starts with it)."""
    prereg = spec.prereg
    return {"attempt": attempt.n, "max_attempts": max_attempts, "profile": attempt.profile,
            "argv": list(attempt.argv), "gpus": list(spec.gpus), "executor": attempt.executor,
            "pid": attempt.pid, "job_id": attempt.job_id, "note": note,
            "selected_by": attempt.detail.get("selected_by"),
            "question": prereg.question if prereg else None, "read_step": prereg.read_step if prereg else None,
            "channel": spec.notify.channel or default_channel}


def note_lines(notes: Any) -> list[str]:
    """build_argv's notes (a dict of lines, or a list) as lines for the launch post."""
    if not notes:
        return []
    if isinstance(notes, dict):
        return [str(v) for v in notes.values() if v]
    return [str(n) for n in notes]
