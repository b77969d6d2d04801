"""kind = "jsonl": the trainer's own JSONL log (`babysit.log`, `$BABYSIT_LOG`) is the record log.

Nothing is copied: the run's reader tails that file as it tails babysit's record log for every other kind
(`babysit/sources/logtail.py`, over the one tailer), so this kind's read only names the file whose growth
is the run's output, and its evidence is what that tail counted (records and garbage lines), not the pump's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from babysit.core.spec.source import SourceSpec
from babysit.sources.kind import Evidence, Kind, SourceRead


@dataclass(frozen=True)
class JsonlReader:
    log: Path | None

    def read(self, state: Mapping[str, Any], captured: Sequence[Path], budget: int, final: bool) -> SourceRead:
        return SourceRead((), None, state=dict(state), files=(self.log,) if self.log is not None else ())


class JsonlKind(Kind):
    name = "jsonl"
    reads = "bytes"
    counted = False
    sniffs = True  # an empty log while the run prints: sources/sniff.py says whether a preset reads the prints

    def reader(self, source: SourceSpec, run_dir: Path, run: str) -> JsonlReader:
        return JsonlReader(source.path)

    def evidence(self, pumped: Evidence, records: int, garbage: int) -> Evidence:
        """The tail's counts (TailState.records and .garbage): its lines are read by the tail, not the pump."""
        return Evidence(lines_seen=records + garbage, records_parsed=records, output_bytes=pumped.output_bytes)

    def unreadable(self, source: SourceSpec, evidence: Evidence, log: Path) -> str:
        if evidence.lines_seen:
            return (f"{log}: {evidence.lines_seen} lines read, 0 records parsed: each line must be a JSON object "
                    "with an integer \"step\" and a numeric \"ts\" (docs/spec.md, the record schema). If the "
                    "trainer prints its metrics instead, read them with [source] kind = \"stdout\".")
        return (f"{log}: no record yet while the run's output grew: does the trainer write its log there "
                "($BABYSIT_LOG)? If it prints its metrics instead, read them with [source] kind = \"stdout\".")


KIND = JsonlKind()
