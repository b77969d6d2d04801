"""The effective batch is the unit of optimisation: splitting it (chunks, ranks) does not change gradients."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import once_per_session
from tests.trainer.conftest import REPO, read_log, train_losses, trainer_env


def _gradients(chunks: int, data_cache: Path) -> list[Any]:
    # torch and the trainer imported here, not at collection: every xdist worker collects this file
    import torch

    from trainer.batches import Batcher, Layout, StepData, samples
    from trainer.data import load_or_compute_stats, load_or_generate
    from trainer.model import build
    from trainer.recipe import load
    from trainer.train import backward_chunks, model_args

    recipe = load("tiny")
    corpus = load_or_generate(recipe.data, data_cache)
    stats = load_or_compute_stats(corpus, recipe.data, data_cache, recompute=False)
    data = StepData(Batcher(corpus, stats, recipe.data), samples(corpus, recipe.data.chunk_len, False),
                    Layout(global_batch=32, world=1, rank=0, chunks=chunks), seed=3, first_step=1, last_step=1)
    torch.manual_seed(0)
    model = build(model_args(recipe))
    backward_chunks(model, [data[i] for i in range(chunks)], torch.autocast("cpu", enabled=False), False)
    return [p.grad.clone() for p in model.parameters()]


def test_one_chunk_and_four_chunks_give_the_same_gradients(data_cache: Path) -> None:
    import torch

    whole, split = _gradients(1, data_cache), _gradients(4, data_cache)
    for g1, g4 in zip(whole, split, strict=True):
        torch.testing.assert_close(g4, g1, rtol=1e-5, atol=1e-7)


def _torchrun(flags: list[str], data_cache: Path) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           "-m", "trainer", *flags]
    return subprocess.run(cmd, cwd=REPO, env=trainer_env(data_cache), capture_output=True, text=True, timeout=180)


COMMON = ["--recipe", "tiny", "--steps", "30", "--batch-size", "32", "--device", "cpu", "--eval-every", "0",
          "--save-every", "0"]


@pytest.fixture(scope="session")
def one_process(data_cache: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[int, float]:
    """step -> train_loss of the one-process run both DDP splittings are compared with: the same run for
    both, so trained once a session (whichever xdist worker asks first), not once a parameter."""

    def run() -> dict[int, float]:
        out = tmp_path_factory.mktemp("one-process")
        single = subprocess.run([sys.executable, "-m", "trainer", *COMMON, "--checkpoints", str(out / "ck"), "--log",
                                 str(out / "one.jsonl")], cwd=REPO, env=trainer_env(data_cache), capture_output=True,
                                text=True, timeout=240)
        assert single.returncode == 0, single.stderr
        return train_losses(read_log(out / "one.jsonl"))

    return {int(step): loss for step, loss in once_per_session(tmp_path_factory, "ddp-one-process", run).items()}


@pytest.mark.parametrize("chunk_flags", [  # the second only where slow tests run (.ci/run): each is 3 torch processes
    pytest.param([], id="allreduce-every-chunk"),
    pytest.param(["--backward-chunks", "2", "--chunk-grad-allreduce"], id="chunk-grad-allreduce",
                 marks=pytest.mark.slow)])
def test_ddp_two_gloo_ranks_match_one_process_at_the_same_effective_batch(
        one_process: dict[int, float], data_cache: Path, tmp_path: Path, chunk_flags: list[str]) -> None:
    ddp = _torchrun([*COMMON, "--checkpoints", str(tmp_path / "ck"), *chunk_flags,
                     "--log-path", str(tmp_path / "two.jsonl")], data_cache)
    assert ddp.returncode == 0, ddp.stderr

    two_records = read_log(tmp_path / "two.jsonl")
    config = two_records[0]["config"]
    assert (config["world_size"], config["effective_batch"], config["micro_batch"]) == (
        2, 32, 8 if chunk_flags else 16)
    one, two = one_process, train_losses(two_records)
    assert one.keys() == two.keys() and len(one) == 30
    for step in one:
        assert two[step] == pytest.approx(one[step], rel=1e-4, abs=1e-6), f"step {step}"
