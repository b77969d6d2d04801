"""Where a run's records come from (`[source]`): its JSONL log, its stdout, TensorBoard, a CSV.

`SourcePump(spec, state_dir, state).pump(now)` is the daemon's one call per tick; `records_path`
names the file everything downstream reads. Importing this package imports no framework: the
tensorboard extra is imported only by a pump that reads TensorBoard.
"""

from babysit.core.spec.source import KINDS, SourcePattern, SourceSpec, preset_line
from babysit.sources.evidence import Evidence, unreadable
from babysit.sources.kinds import adapter
from babysit.sources.pump import PumpResult, SourcePump, records_path, run_dir
from babysit.sources.tensorboard import TensorBoardMissing, require

__all__ = [
    "KINDS",
    "Evidence",
    "PumpResult",
    "SourcePattern",
    "SourcePump",
    "SourceSpec",
    "TensorBoardMissing",
    "adapter",
    "preset_line",
    "records_path",
    "require",
    "run_dir",
    "unreadable",
]
