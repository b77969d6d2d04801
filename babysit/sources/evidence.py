"""What a source has shown so far, and the `log-unreadable` message it earns.

A source that yields no record while the run's output grows is a misconfigured source, not a dead
run: babysit says so loudly (what it read, what it tried, what to fix) and does not stop the run. What
to say is the kind's (`SourceKind.unreadable`, found through the registry); the frame is said here.
"""

from __future__ import annotations

from pathlib import Path

from babysit.core.spec.source import SourceSpec
from babysit.sources import kinds
from babysit.sources.kind import Evidence

__all__ = ["Evidence", "unreadable"]


def unreadable(source: SourceSpec, evidence: Evidence, *, log: Path) -> str | None:
    """The `log-unreadable` message when the run's output grew but no record was parsed; else None.

    `log` is what babysit reads records from (`records_path`), named for jsonl.
    """
    if evidence.output_bytes <= 0 or evidence.records_parsed is None or evidence.records_parsed > 0:
        return None
    text = kinds.adapter(source.kind).unreadable(source, evidence, log)
    if evidence.problems:
        text += " Seen: " + "; ".join(evidence.problems) + "."
    return text + " The run is not stopped for this."
