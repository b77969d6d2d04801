"""The printed-log presets: `[source] kind = "stdout"` with `preset = "NAME"` instead of regexes.

Each preset is data, one TOML file a printer (`babysit/sources/presets/NAME.toml`: a `description`, the
`origin` it was written from, an optional `detect` regex that a line must match for `auto` to choose
it (default: any of its patterns), and `[[patterns]]` of the same schema as `[[source.patterns]]`), shipped
as package data. They are read once per process; `spec.source_spec` validates them by the rules of a
user's patterns. `auto` tries every preset, in `ORDER`, on the run's first printed lines.
"""

from __future__ import annotations

from functools import cache
from importlib import resources
from typing import Any

from babysit.core.spec.tomlfile import loads

AUTO = "auto"
# Most specific first: the first preset that matches a printed line is the run's. tqdm is last: a
# progress bar is printed by trainers whose own lines say more.
ORDER = ("nanogpt", "word_language_model", "torchtitan", "lightning", "huggingface", "tqdm")
# What `auto` tries, in order, before the general reader (core/reading/printed.py), which reads what the rest do
# not. tqdm is left to `preset = "tqdm"`: the general reader reads a bar's step and its postfix metrics too.
AUTO_ORDER = tuple(n for n in ORDER if n != "tqdm")
GENERAL = "general"  # the reader `auto` falls back on: not a preset file, core/reading/printed.py


def _folder() -> Any:
    return resources.files("babysit").joinpath("sources", "presets")


@cache
def names() -> tuple[str, ...]:
    """The presets shipped, in the order `auto` tries them (any not in ORDER after, by name)."""
    found = sorted(e.name[:-5] for e in _folder().iterdir() if e.name.endswith(".toml"))
    return tuple(n for n in ORDER if n in found) + tuple(n for n in found if n not in ORDER)


def auto_names() -> tuple[str, ...]:
    """The presets `auto` tries on a line before the general reader, in order."""
    return tuple(n for n in names() if n in AUTO_ORDER)


def display(name: str) -> str:
    return f"babysit/sources/presets/{name}.toml"


@cache
def load(name: str) -> dict[str, Any]:
    """The preset's table, as parsed from its file."""
    return loads(_folder().joinpath(f"{name}.toml").read_text(encoding="utf-8"), display(name))
