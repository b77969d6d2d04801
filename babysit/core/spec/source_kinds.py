"""The registry of `[source]` kinds: one line a kind, what run.toml may say for it and which adapter reads it.

Everything that depends on the kind asks here (or the adapter named here) instead of comparing strings:
`core.source_spec.parse_source` checks a `[source]` table by its kind's `KindRules`; the shell's
`babysit.sources.kinds.adapter(name)` imports the kind's module (`adapter`) and takes its `KIND`, the
`babysit.sources.kind.SourceKind` that reads the source, says its evidence and checks its package. Adding a
kind is one module in `babysit/sources/` (its `KIND`) and one line below. Pure: the adapter is named by its
module path, imported by the shell only when a run reads that kind.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

MLFLOW_STORE = "mlflow.db"  # kind = "mlflow": MLflow 3's default store (sqlite:///mlflow.db in the workdir)
WANDB_DIR = "outputs/{name}/wandb"  # kind = "wandb": where babysit tells wandb to write ($WANDB_DIR)

PathRule = Literal["log", "none", "required", "default"]


@dataclass(frozen=True)
class KindRules:
    """What a kind's `[source]` table may hold. `path`: "log" (the trainer's JSONL log: `[run].log`, or
    `path` naming the same file), "none" (no path: the run's captured output), "required" (`path` must be
    written; `expected` says what it names), "default" (`default_path` under the run's workdir unless
    written). `patterns`: it takes `[[source.patterns]]` and `preset`; `step_column`: it names a CSV
    column; `renames`: `metrics` and `step_offset` apply; `copies`: babysit writes a record log of its own
    from what the adapter reads (every kind but the one whose file already is babysit's JSONL). `offline`:
    what `babysit verdict run.toml --log PATH` may name for this kind (read through the adapter into a record
    log of its own; None: PATH is a record log); `directory`: that path is a directory."""

    name: str
    adapter: str  # the module whose `KIND` reads it, e.g. "babysit.sources.csvfile"
    path: PathRule = "required"
    expected: str = "a path"
    default_path: str | None = None  # "default": relative to the workdir, `{name}` the run's name
    patterns: bool = False
    step_column: bool = False
    renames: bool = True
    copies: bool = True
    offline: str | None = None
    directory: bool = False


TB_DIR = "the directory the trainer writes TensorBoard event files to"
CSV_FILE = "the CSV file the trainer writes (e.g. Lightning's metrics.csv)"

KINDS: dict[str, KindRules] = {rules.name: rules for rules in (
    KindRules("jsonl", "babysit.sources.jsonl", path="log", renames=False, copies=False),
    KindRules("stdout", "babysit.sources.stdout", path="none", patterns=True),
    KindRules("tensorboard", "babysit.sources.tensorboard", expected=TB_DIR, offline="an event directory",
              directory=True),
    KindRules("csv", "babysit.sources.csvfile", expected=CSV_FILE, step_column=True, offline="a CSV file"),
    KindRules("wandb", "babysit.sources.wandbfile", path="default", default_path=WANDB_DIR),
    KindRules("mlflow", "babysit.sources.mlflowstore", path="default", default_path=MLFLOW_STORE),
)}


def rules(kind: str) -> KindRules:
    """The rules of a registered kind (a SourceSpec's kind was checked against KINDS when it was parsed)."""
    return KINDS[kind]
