"""Recipes and flags are refused loudly with exit 2, naming the file and the key."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.trainer.conftest import REPO
from trainer.recipe import RECIPES_DIR, RecipeError, load
from trainer.recipe import parse as parse_recipe


def test_unknown_recipe_key_exits_2_naming_file_and_key(run_trainer, tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text((RECIPES_DIR / "tiny.toml").read_text().replace("width = 64", "widht = 64"))
    result = run_trainer("--recipe", str(bad), "--log", str(tmp_path / "log.jsonl"))
    assert result.returncode == 2
    assert f"{bad}: model.widht: expected one of the known keys" in result.stderr


def test_wrong_type_exits_2_with_expected_and_got(run_trainer, tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text((RECIPES_DIR / "tiny.toml").read_text().replace("steps = 150", 'steps = "150"'))
    result = run_trainer("--recipe", str(bad), "--log", str(tmp_path / "log.jsonl"))
    assert result.returncode == 2
    assert f"{bad}: train.steps: expected an integer, got '150' (str)" in result.stderr


def test_batch_not_divisible_by_chunks_exits_2(run_trainer, tmp_path: Path) -> None:
    result = run_trainer("--recipe", "tiny", "--batch-size", "30", "--backward-chunks", "4",
                         "--log", str(tmp_path / "log.jsonl"))
    assert result.returncode == 2
    assert "train.batch_size: expected a multiple" in result.stderr


def test_batch_size_and_micro_batch_size_are_mutually_exclusive(run_trainer, tmp_path: Path) -> None:
    result = run_trainer("--recipe", "tiny", "--batch-size", "32", "--micro-batch-size", "8")
    assert result.returncode == 2
    assert "not allowed with argument" in result.stderr


def test_a_bad_input_exits_2_before_torch_is_imported(tmp_path: Path) -> None:
    """A typo costs a fraction of a second, not torch's import (2-3 CPU-s on two shared cores)."""
    bad = tmp_path / "bad.toml"
    bad.write_text((RECIPES_DIR / "tiny.toml").read_text().replace("width = 64", "widht = 64"))
    probe = ("import sys\nfrom trainer.cli import main\n"
             f"code = main(['--recipe', {str(bad)!r}])\n"
             "print(code, 'torch' in sys.modules)\n")
    result = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, timeout=120,
                            env={**os.environ, "PYTHONPATH": str(REPO)})
    assert result.stdout.split() == ["2", "False"], result.stdout + result.stderr
    assert f"{bad}: model.widht: expected one of the known keys" in result.stderr


@pytest.mark.parametrize("name", sorted(p.stem for p in RECIPES_DIR.glob("*.toml")))
def test_every_bundled_recipe_loads_by_bare_name(name: str) -> None:
    assert load(name).name == name


@pytest.mark.parametrize(("text", "message"), [
    ({"train": {"precision": "fp16"}}, "train.precision: expected one of fp32, bf16, got 'fp16' (str)"),
    ({"train": {"compile": 1}}, "train.compile: expected a boolean, got 1 (int)"),
    ({"train": {"lr": -1.0}}, "train.lr: expected a positive number, got -1.0 (float)"),
    ({"data": {"datasets": ["reach_v9"]}}, "data.datasets: expected names from"),
    ({"data": {"image_augment": 1.5}}, "data.image_augment: expected a probability in [0, 1]"),
    ({"model": "mlp"}, "model: expected a table, got 'mlp' (str)"),
    ({"optimiser": {}}, "optimiser: expected one of the known keys"),
])
def test_every_rejection_path_names_the_key(text: dict, message: str) -> None:
    with pytest.raises(RecipeError, match=None) as info:
        parse_recipe(text, "r.toml", "r")
    assert str(info.value).startswith("r.toml: ")
    assert message in str(info.value)
