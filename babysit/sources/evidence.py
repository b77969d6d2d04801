"""What a source has shown so far, and the `log-unreadable` message it earns. Pure.

A source that yields no record while the run's output grows is a misconfigured source, not a dead
run: babysit says so loudly (what it read, what it tried, what to fix) and does not stop the run.
"Not counted" (None) is kept apart from "counted, none".
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from babysit.core.source_spec import AUTO, SourceSpec
from babysit.core.suggest import suggest


@dataclass(frozen=True)
class Evidence:
    """Running totals since the run's first read (they survive a daemon restart)."""

    lines_seen: int | None  # stdout/stderr lines, CSV rows, TensorBoard summary values; None: not counted
    records_parsed: int | None
    output_bytes: int  # bytes the run's stdout, stderr and source files grew by
    sample: str | None = None  # the newest line, row or tag that gave no record
    problems: tuple[str, ...] = ()  # the newest read's conditions (a missing file, a missing column)


def jsonl_evidence(records: int, garbage: int, output_bytes: int) -> Evidence:
    """Evidence for kind = "jsonl", whose lines the supervisor's tail counts (TailState.records and
    .garbage), not the pump."""
    return Evidence(lines_seen=records + garbage, records_parsed=records, output_bytes=output_bytes)


def unreadable(source: SourceSpec, evidence: Evidence, *, log: Path) -> str | None:
    """The `log-unreadable` message when the run's output grew but no record was parsed; else None.

    `log` is what babysit reads records from (`records_path`), named for jsonl.
    """
    if evidence.output_bytes <= 0 or evidence.records_parsed is None or evidence.records_parsed > 0:
        return None
    lines = evidence.lines_seen or 0
    if source.kind == "stdout" and source.preset == AUTO and not source.patterns:
        would = suggest(evidence.sample) if evidence.sample else None
        text = (f"{lines} lines of the run's stdout/stderr read, 0 records parsed: no preset matched them (tried "
                + ", ".join(name for name, _ in source.candidates) + ")."
                + _sample(evidence, "A line none matched")
                + (f" A pattern that would read it: [[source.patterns]] regex = '{would}'." if would else "")
                + " Write [source] kind = \"stdout\" with [[source.patterns]] in run.toml (docs/your-trainer.md), "
                "or log with babysit.log(step, loss=…).")
    elif source.kind == "stdout":
        tried = "; ".join(f"{i}) {p.regex}" for i, p in enumerate(source.patterns, start=1))
        text = (f"{lines} lines of the run's stdout/stderr read, 0 records parsed. Patterns tried: {tried}."
                + _sample(evidence, "A line none matched")
                + " Fix [[source.patterns]] in run.toml: each regex needs a named group (?P<step>\\d+) and one "
                "named group per metric, matching the lines the trainer prints.")
    elif source.kind == "csv":
        text = (f"{source.path}: {lines} rows read, 0 records parsed (step column \"{source.step_column}\")."
                + _sample(evidence, "A row without a step")
                + " Check source.path and source.step_column in run.toml.")
    elif source.kind == "wandb":
        text = (f"{source.path}: {lines} wandb.log records read, 0 with a step and a number."
                + _sample(evidence, "The keys of one")
                + " Check that the trainer calls wandb.init() without its own dir= (babysit sets $WANDB_DIR to "
                "source.path) and logs numbers.")
    elif source.kind == "mlflow":
        text = (f"{source.path}: {lines} MLflow metric points read, 0 records."
                + _sample(evidence, "Skipped")
                + " Check that source.path is the tracking store the trainer logs to (MLflow 3's default: mlflow.db "
                "in its working directory; a file store: its mlruns folder) and that the trainer starts its runs "
                "with mlflow.start_run() (babysit finds them by the tag babysit.run it sets in $MLFLOW_RUN_CONTEXT).")
    elif source.kind == "tensorboard":
        text = (f"{source.path}: {lines} summary values read, 0 scalar records."
                + _sample(evidence, "A non-scalar tag")
                + " Check that source.path is the trainer's TensorBoard log directory and that it logs scalars.")
    else:
        if lines:
            text = (f"{log}: {lines} lines read, 0 records parsed: each line must be a JSON object with an "
                    "integer \"step\" and a numeric \"ts\" (docs/spec.md, the record schema). If the trainer "
                    "prints its metrics instead, read them with [source] kind = \"stdout\".")
        else:
            text = (f"{log}: no record yet while the run's output grew: does the trainer write its log there "
                    "($BABYSIT_LOG)? If it prints its metrics instead, read them with [source] kind = \"stdout\".")
    if evidence.problems:
        text += " Seen: " + "; ".join(evidence.problems) + "."
    return text + " The run is not stopped for this."


def _sample(evidence: Evidence, label: str) -> str:
    return f" {label}: {evidence.sample!r}." if evidence.sample else ""
