"""Recipes: frozen, validated TOML. A typo or a wrong type is refused loudly (exit 2), never defaulted.

A recipe has three tables, `[data]`, `[model]`, `[train]`, plus top-level `name` and `description`.
Every key is a field of the dataclasses below; the dataclass default applies only to keys the recipe
does not write.
"""

from __future__ import annotations

import dataclasses
import sys
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10 only
    import tomli as tomllib

RECIPES_DIR = Path(__file__).parent / "recipes"


class RecipeError(Exception):
    """A recipe or flag the trainer refuses; the message is `FILE: key.path: expected …, got …`."""


@dataclass(frozen=True)
class DataConfig:
    """The demonstration corpus: which scripted experts, how many episodes, how observations look."""

    datasets: tuple[str, ...] = ("reach_v1", "push_v2", "rig_demos")
    episodes_per_dataset: int = 64
    eval_episodes_per_dataset: int = 16
    episode_len: int = 48
    image_size: int = 16
    channels: int = 1
    chunk_len: int = 8
    label_noise: float = 0.0  # extra Gaussian noise on the recorded expert actions (noisy demos)
    image_augment: float = 0.0  # probability per sample of brightness jitter + 1-pixel shift
    train_slice: int = 512  # fixed train samples scored as train_chunk_mae
    data_seed: int = 0


@dataclass(frozen=True)
class ModelConfig:
    """Policy network: `mlp` (CPU recipes) or `transformer` over image patches (GPU recipe)."""

    kind: str = "mlp"
    width: int = 256
    depth: int = 3
    dropout: float = 0.0
    patch: int = 4
    heads: int = 4
    grad_checkpointing: bool = False


@dataclass(frozen=True)
class TrainConfig:
    """Optimisation and run-time knobs; every one also has a command-line flag."""

    steps: int = 1000
    batch_size: int = 64  # EFFECTIVE batch: the same at any world size
    backward_chunks: int = 1
    lr: float = 1e-3
    lr_scale: float = 1.0
    schedule: str = "cosine"
    warmup_steps: int = 20
    min_lr_frac: float = 0.1
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    seed: int = 0
    log_every: int = 10
    eval_every: int = 100
    save_every: int = 0
    eval_dataset_breakdown: bool = False
    recompute_stats: bool = False
    precision: str = "fp32"
    device: str = "auto"
    num_workers: int = 0
    prefetch_factor: int = 2
    chunk_grad_allreduce: bool = False
    compile: bool = False


@dataclass(frozen=True)
class Recipe:
    name: str
    description: str = ""
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)


CHOICES: dict[str, tuple[str, ...]] = {
    "model.kind": ("mlp", "transformer"),
    "train.schedule": ("cosine", "constant"),
    "train.precision": ("fp32", "bf16"),
    "train.device": ("cpu", "cuda", "auto"),
}
POSITIVE = {
    "data.episodes_per_dataset", "data.eval_episodes_per_dataset", "data.episode_len", "data.image_size",
    "data.chunk_len", "data.train_slice", "model.width", "model.depth", "model.patch", "model.heads",
    "train.steps", "train.batch_size", "train.backward_chunks", "train.lr", "train.lr_scale",
    "train.log_every", "train.prefetch_factor",
}
NON_NEGATIVE = {
    "data.label_noise", "data.image_augment", "model.dropout", "train.warmup_steps", "train.min_lr_frac",
    "train.weight_decay", "train.grad_clip", "train.eval_every", "train.save_every", "train.num_workers",
}
KNOWN_DATASETS = ("reach_v1", "push_v2", "rig_demos")


def _describe(value: object) -> str:
    if isinstance(value, dict):
        return "a table"
    return f"{value!r} ({type(value).__name__})"


def _check_type(file: str, key: str, hint: Any, value: object) -> object:
    """Return the value converted to the field's type, or raise naming file, key, expectation, value."""
    if hint is bool:
        if isinstance(value, bool):
            return value
        raise RecipeError(f"{file}: {key}: expected a boolean, got {_describe(value)}")
    if hint is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise RecipeError(f"{file}: {key}: expected an integer, got {_describe(value)}")
    if hint is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        raise RecipeError(f"{file}: {key}: expected a number, got {_describe(value)}")
    if hint is str:
        if isinstance(value, str):
            return value
        raise RecipeError(f"{file}: {key}: expected a string, got {_describe(value)}")
    if typing.get_origin(hint) is tuple:
        if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
            return tuple(value)
        raise RecipeError(f"{file}: {key}: expected a non-empty list of strings, got {_describe(value)}")
    raise TypeError(f"unsupported field type {hint!r}")  # pragma: no cover - programming error


def check_value(file: str, key: str, value: object) -> None:
    """Range and choice checks shared by recipe keys and command-line overrides."""
    if key in CHOICES and value not in CHOICES[key]:
        raise RecipeError(f"{file}: {key}: expected one of {', '.join(CHOICES[key])}, got {_describe(value)}")
    if key in POSITIVE and not value > 0:  # type: ignore[operator]
        raise RecipeError(f"{file}: {key}: expected a positive number, got {_describe(value)}")
    if key in NON_NEGATIVE and not value >= 0:  # type: ignore[operator]
        raise RecipeError(f"{file}: {key}: expected a number >= 0, got {_describe(value)}")
    if key == "data.image_augment" and not value <= 1:  # type: ignore[operator]
        raise RecipeError(f"{file}: {key}: expected a probability in [0, 1], got {_describe(value)}")
    if key == "data.channels" and value not in (1, 3):
        raise RecipeError(f"{file}: {key}: expected 1 or 3, got {_describe(value)}")
    if key == "data.datasets":
        for name in value:  # type: ignore[attr-defined]
            if name not in KNOWN_DATASETS:
                raise RecipeError(f"{file}: {key}: expected names from {', '.join(KNOWN_DATASETS)}, "
                                  f"got {name!r}")


def _build(cls: type, table: object, file: str, path: str) -> Any:
    if not isinstance(table, dict):
        raise RecipeError(f"{file}: {path}: expected a table, got {_describe(table)}")
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    values: dict[str, object] = {}
    for name, value in table.items():
        key = f"{path}.{name}"
        if name not in names:
            raise RecipeError(f"{file}: {key}: expected one of the known keys ({', '.join(sorted(names))}), "
                              f"got an unknown key")
        values[name] = _check_type(file, key, hints[name], value)
        check_value(file, key, values[name])
    return cls(**values)


def parse(data: dict[str, Any], file: str, default_name: str) -> Recipe:
    """Validate a parsed TOML document into a Recipe."""
    sections = {"data": DataConfig, "model": ModelConfig, "train": TrainConfig}
    values: dict[str, Any] = {"name": default_name}
    for key, value in data.items():
        if key in sections:
            values[key] = _build(sections[key], value, file, key)
        elif key in ("name", "description"):
            values[key] = _check_type(file, key, str, value)
        else:
            raise RecipeError(f"{file}: {key}: expected one of the known keys "
                              f"(data, description, model, name, train), got an unknown key")
    return Recipe(**values)


def resolve_path(recipe: str) -> Path:
    """A bare name (`drift`) means the bundled `trainer/recipes/drift.toml`; anything else is a path."""
    path = Path(recipe)
    if path.suffix != ".toml" and "/" not in recipe:
        bundled = RECIPES_DIR / f"{recipe}.toml"
        if bundled.exists():
            return bundled
        known = ", ".join(sorted(p.stem for p in RECIPES_DIR.glob("*.toml")))
        raise RecipeError(f"{recipe}: <recipe>: expected a bundled recipe name ({known}) or a .toml path, "
                          f"got {recipe!r}")
    return path


def load(recipe: str) -> Recipe:
    path = resolve_path(recipe)
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise RecipeError(f"{path}: <file>: expected an existing TOML file, got no such file")
    except tomllib.TOMLDecodeError as exc:
        raise RecipeError(f"{path}: <file>: expected valid TOML, got a syntax error ({exc})")
    return parse(data, str(path), default_name=path.stem)


def override(recipe: Recipe, section: str, **changes: object) -> Recipe:
    """Apply command-line overrides (already typed by argparse) with the same range checks."""
    for name, value in changes.items():
        check_value("<command line>", f"{section}.{name}", value)
    updated = dataclasses.replace(getattr(recipe, section), **changes)
    return dataclasses.replace(recipe, **{section: updated})
