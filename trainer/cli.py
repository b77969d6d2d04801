"""Command line: `python -m trainer --recipe RECIPE [overrides]`. Flags override recipe values.

`main(argv) -> int` maps every outcome to an exit code (see exitcodes.py); only `__main__` exits.
The flags and the recipe are checked before torch is imported: a bad input exits 2 in a fraction of a
second, not after the 2-3 CPU-seconds torch's import takes (tests/trainer/test_recipe_validation.py).
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from pathlib import Path

from trainer import exitcodes
from trainer.recipe import Recipe, RecipeError, load, override

# flag dest -> (recipe section, field). Flags left unset keep the recipe's value.
OVERRIDES: dict[str, tuple[str, str]] = {
    "batch_size": ("train", "batch_size"), "backward_chunks": ("train", "backward_chunks"),
    "lr": ("train", "lr"), "lr_scale": ("train", "lr_scale"), "seed": ("train", "seed"),
    "steps": ("train", "steps"), "eval_every": ("train", "eval_every"), "save_every": ("train", "save_every"),
    "log_every": ("train", "log_every"), "eval_dataset_breakdown": ("train", "eval_dataset_breakdown"),
    "recompute_stats": ("train", "recompute_stats"), "num_workers": ("train", "num_workers"),
    "prefetch_factor": ("train", "prefetch_factor"), "device": ("train", "device"),
    "precision": ("train", "precision"), "chunk_grad_allreduce": ("train", "chunk_grad_allreduce"),
    "compile": ("train", "compile"), "image_augment": ("data", "image_augment"),
    "grad_checkpointing": ("model", "grad_checkpointing"),
}


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m trainer",
        description="babysit's reference trainer: behaviour cloning of action chunks on scripted demos. "
                    "Exit codes: 0 completed, 1 crashed, 2 bad input, 10 stopped on request, "
                    "11 diverged, 12 out of memory.")
    p.add_argument("--recipe", required=True, help="bundled name (tiny, healthy, drift, gpu) or a .toml path")
    size = p.add_mutually_exclusive_group()
    size.add_argument("--batch-size", type=int, help="EFFECTIVE batch per optimizer step, at any world size")
    size.add_argument("--micro-batch-size", type=int,
                      help="per-rank micro-batch instead; effective = micro x chunks x world")
    p.add_argument("--backward-chunks", "--grad-accum", type=int, dest="backward_chunks",
                   help="micro-batches (backward passes) per optimizer step")
    flag = argparse.BooleanOptionalAction
    p.add_argument("--grad-checkpointing", action=flag, help="recompute transformer blocks in backward")
    p.add_argument("--lr", type=float)
    p.add_argument("--lr-scale", type=float, help="multiplies the recipe's lr")
    p.add_argument("--seed", type=int, help="data order, augmentation and init")
    p.add_argument("--steps", type=int)
    p.add_argument("--eval-every", type=int, help="0 turns eval off")
    p.add_argument("--save-every", type=int, help="0: save only on stop")
    p.add_argument("--log-every", type=int)
    p.add_argument("--eval-dataset-breakdown", action=flag, help="add eval/<dataset> keys")
    p.add_argument("--image-augment", type=float, help="probability per sample")
    p.add_argument("--recompute-stats", action=flag, help="recompute normalisation stats, ignore the cache")
    p.add_argument("--num-workers", type=int, help="DataLoader workers (CPU recipes use 0)")
    p.add_argument("--prefetch-factor", type=int)
    p.add_argument("--device", choices=("cpu", "cuda", "auto"))
    p.add_argument("--precision", choices=("fp32", "bf16"))
    p.add_argument("--chunk-grad-allreduce", action=flag,
                   help="DDP: all-reduce only on the last backward chunk (no_sync on the others)")
    p.add_argument("--compile", action=flag, help="torch.compile the model")
    p.add_argument("--resume", choices=("latest",), help="continue from CHECKPOINTS/latest (fresh if none)")
    # `--log-path` is the same flag: under torchrun, `--log` is refused by torchrun's own parser as an
    # ambiguous prefix of its --log-dir/--logs-specs (or write `torchrun … -m trainer -- --log …`).
    p.add_argument("--log", "--log-path", type=Path, dest="log",
                   help="JSONL train log (default outputs/<recipe>/train_log.jsonl)")
    p.add_argument("--checkpoints", type=Path, help="checkpoint dir (default outputs/<recipe>/checkpoints)")
    p.add_argument("--data-cache", type=Path,
                   default=Path(os.environ.get("BABYSIT_TRAINER_CACHE", "~/.cache/babysit-trainer")).expanduser(),
                   help="where generated demos are cached (env BABYSIT_TRAINER_CACHE)")
    p.add_argument("--inject-nan-at-step", type=int, metavar="N",
                   help="TEST HOOK: make the loss non-finite at step N (exercises exit code 11)")
    p.add_argument("--inject-step-delay", type=float, metavar="S", default=0.0,
                   help="TEST HOOK: sleep S seconds each step (a long run from a tiny recipe; a slow node)")
    p.add_argument("--inject-delay-node", metavar="NODE",
                   help="TEST HOOK: only the ranks on this Slurm node ($SLURMD_NODENAME) sleep: a straggler")
    return p


def resolve(args: argparse.Namespace, world: int) -> Recipe:
    """Recipe plus overrides; the effective batch must split evenly into world x chunks."""
    recipe = load(args.recipe)
    for dest, (section, name) in OVERRIDES.items():
        value = getattr(args, dest, None)
        if value is not None:
            recipe = override(recipe, section, **{name: value})
    chunks = recipe.train.backward_chunks
    if args.micro_batch_size is not None:
        if args.micro_batch_size <= 0:
            raise RecipeError(f"<command line>: --micro-batch-size: expected a positive integer, "
                              f"got {args.micro_batch_size}")
        recipe = override(recipe, "train", batch_size=args.micro_batch_size * chunks * world)
    batch = recipe.train.batch_size
    if batch % (world * chunks):
        raise RecipeError(f"<command line>: train.batch_size: expected a multiple of world size x "
                          f"backward chunks ({world} x {chunks} = {world * chunks}), got {batch}")
    return recipe


def _is_oom(exc: BaseException) -> bool:
    torch = sys.modules.get("torch")  # an error raised before torch was imported is no CUDA OOM
    if isinstance(exc, MemoryError) or (torch is not None and isinstance(exc, torch.cuda.OutOfMemoryError)):
        return True
    text = str(exc)
    return isinstance(exc, RuntimeError) and ("can't allocate memory" in text or "out of memory" in text)


def _step_delay(args: argparse.Namespace) -> float:
    """--inject-step-delay, on every rank, or only on the ranks of --inject-delay-node."""
    node = os.environ.get("SLURMD_NODENAME")
    return args.inject_step_delay if args.inject_delay_node in (None, node) else 0.0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--"]:  # `torchrun … -m trainer -- FLAGS` passes the separator through
        argv = argv[1:]
    try:
        args = parser().parse_args(argv)
    except SystemExit as exc:  # argparse already printed usage and the error
        return exitcodes.BAD_INPUT if exc.code else exitcodes.COMPLETED
    world = int(os.environ.get("WORLD_SIZE", "1"))
    try:
        recipe = resolve(args, world)
        from trainer.train import RunConfig, run  # torch: only for a run that will start

        out = Path("outputs") / recipe.name
        config = RunConfig(recipe=recipe, log_path=args.log or out / "train_log.jsonl",
                           checkpoint_dir=args.checkpoints or out / "checkpoints", data_cache=args.data_cache,
                           resume=args.resume is not None, inject_nan_at_step=args.inject_nan_at_step,
                           inject_step_delay=_step_delay(args))
        return run(config)
    except RecipeError as exc:
        print(f"ERROR: {exc}", file=sys.stderr)
        return exitcodes.BAD_INPUT
    except BaseException as exc:
        if isinstance(exc, KeyboardInterrupt):  # a second Ctrl-C during start-up or saving
            traceback.print_exc()
            return exitcodes.STOPPED
        traceback.print_exc()  # the original error text, verbatim
        if _is_oom(exc):
            print("babysit-trainer: OOM", file=sys.stderr)
            return exitcodes.OUT_OF_MEMORY
        return exitcodes.CRASHED
