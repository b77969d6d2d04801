"""kind = "tensorboard": records from the scalar events under a directory.

Read with the official `tensorboard` package (the optional extra `babysit[tensorboard]`, imported
only here and only when a run reads TensorBoard): its `RawEventFileLoader` frames and checks the
records (a record flushed in part is left for the next read), `event_pb2` parses them. Step and wall
time come from the events, so s/step is right however the writer flushes.

Every event file under the directory (recursively: HF and Lightning write into per-run subfolders) is
read in the order of the timestamp in its name, each incrementally by a loader kept in memory; a file
that appears while the run goes is picked up at the next read. Only the count of records taken from
each file is persisted: a restarted daemon re-frames (does not re-parse) that many and reads on.
Consecutive scalars of one step in one file become one record (loss, lr and grad norm of a step).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from babysit.core.errors import BadInput
from babysit.core.spec.source import RESERVED, SourceSpec
from babysit.sources.kind import Evidence, Kind, RowsAdapter, RowsRead, sample
from babysit.sources.records import Item

EXTRA_HINT = "pip install 'babysit[tensorboard]'  (the official tensorboard package reads the event files)"
MAX_EVENTS = 200_000  # parsed per read; the rest at the next read


class TensorBoardMissing(BadInput):
    """`[source] kind = "tensorboard"` without the tensorboard package."""

    def __init__(self) -> None:
        super().__init__('[source] kind = "tensorboard" needs the tensorboard package, which is not installed',
                         hint=EXTRA_HINT)


def require() -> None:
    """Raise TensorBoardMissing unless `tensorboard` can be imported (without importing it)."""
    import importlib.util

    try:
        found = importlib.util.find_spec("tensorboard") is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        raise TensorBoardMissing()


@dataclass
class _Open:
    file_id: tuple[int, int]
    loader: Any
    skip: int  # records still to re-frame after a restart
    taken: int  # records taken from the file so far
    size: int = -1  # the size at the last read: unchanged means nothing new to frame
    behind: bool = False  # the last read stopped at the budget, not at the end


@dataclass
class TensorBoardReader:
    """Holds the open loaders between reads (their file offsets live in them); `read` is the call."""

    source: SourceSpec
    _open: dict[str, _Open] = field(default_factory=dict)
    _plugins: dict[str, str] = field(default_factory=dict)  # tag -> plugin (named on a tag's first value)

    def read(self, state: Mapping[str, Any]) -> RowsRead:
        """The events written since the last read (its lines: the summary values seen, scalars or not; its
        files: the event files found, whose growth is the run's output)."""
        assert self.source.path is not None
        root = self.source.path
        files = event_files(root)
        if not files:
            what = "does not exist (yet)" if not root.exists() else "holds no TensorBoard event files (yet)"
            return RowsRead((), 0, (f"{root} {what}",), None, dict(state), (), False)
        try:
            tb = _import()
        except ImportError:
            return RowsRead((), 0, (str(TensorBoardMissing()) + ": " + EXTRA_HINT,), None, dict(state), tuple(files),
                            False)
        known: Mapping[str, Any] = state.get("files", {})
        new_files: dict[str, Any] = {}
        items: list[Item] = []
        seen = 0
        sample = None
        budget = MAX_EVENTS
        more = False
        for path in files:
            key = os.path.relpath(path, root)
            try:
                st = os.stat(path)
            except FileNotFoundError:
                continue
            file_id = (st.st_dev, st.st_ino)
            entry = self._open.get(key)
            if entry is None or entry.file_id != file_id:
                before = known.get(key, {})
                taken = int(before.get("events", 0)) if before.get("file_id") == list(file_id) else 0
                try:
                    entry = _Open(file_id, tb.loader(str(path)), skip=taken, taken=taken)
                except tb.errors:  # gone between the listing and the open: try again next read
                    if key in known:
                        new_files[key] = known[key]
                    continue
                self._open[key] = entry
            if st.st_size != entry.size or entry.skip or entry.behind:
                entry.size = st.st_size
                entry.behind = budget <= 0
                if not entry.behind:
                    got, values, tag, parsed = self._drain(tb, entry, budget)
                    items.extend(got)
                    seen += values
                    sample = tag or sample
                    budget -= parsed
                    entry.behind = budget <= 0
                more = more or entry.behind
            new_files[key] = {"events": entry.taken, "file_id": list(file_id)}
        for gone in set(self._open) - set(new_files):
            del self._open[gone]
        return RowsRead(tuple(items), seen, (), sample, {"files": new_files}, tuple(files), more)

    def _drain(self, tb: _Tb, entry: _Open, budget: int) -> tuple[list[Item], int, str | None, int]:
        """(items, values seen, a non-scalar tag, records parsed) from one file, up to `budget` records."""
        items: list[Item] = []
        seen = 0
        sample = None
        parsed = 0
        group: dict[str, float] = {}
        group_step: int | None = None
        group_ts = 0.0
        for raw in entry.loader.Load():
            entry.taken += 1
            if entry.skip:
                entry.skip -= 1
                continue
            parsed += 1
            event = tb.event_pb2.Event.FromString(raw)
            if event.HasField("summary"):
                step = int(event.step) + self.source.step_offset
                for value in event.summary.value:
                    seen += 1
                    scalar = self._scalar(tb, value)
                    if scalar is None:
                        sample = value.tag
                        continue
                    name = self.source.rename(value.tag)
                    if name in RESERVED:
                        continue
                    if group and (step != group_step or name in group):
                        items.append(Item(group_step, group, group_ts))  # type: ignore[arg-type]
                        group = {}
                    if not group:
                        group_step, group_ts = step, float(event.wall_time)
                    group[name] = scalar
            if parsed >= budget:
                break
        if group:
            items.append(Item(group_step, group, group_ts))  # type: ignore[arg-type]
        return items, seen, sample, parsed

    def _scalar(self, tb: _Tb, value: Any) -> float | None:
        """The value as a float if it is a scalar summary (TF1 `simple_value` or a TF2 scalar tensor)."""
        if value.HasField("metadata") and value.metadata.plugin_data.plugin_name:
            self._plugins[value.tag] = value.metadata.plugin_data.plugin_name
        kind = value.WhichOneof("value")
        if kind == "simple_value":
            return tb.as_logged(value.simple_value, 32)
        if kind != "tensor" or self._plugins.get(value.tag, "scalars") != "scalars":
            return None
        try:
            array = tb.tensor_util.make_ndarray(value.tensor)
        except (ValueError, TypeError):
            return None
        if array.size != 1 or array.dtype.kind not in "fiu":
            return None
        return tb.as_logged(array.reshape(()).item(), array.dtype.itemsize * 8)


def event_files(root: Path) -> list[Path]:
    """Event files under `root`, oldest first by the timestamp in their names."""
    found = []
    for folder, _dirs, names in os.walk(root):
        for name in names:
            if "tfevents" in name:
                found.append(Path(folder) / name)
    return sorted(found, key=lambda p: (_timestamp(p.name), str(p)))


def _timestamp(name: str) -> int:
    _, _, rest = name.partition("tfevents.")
    head = rest.split(".", 1)[0]
    return int(head) if head.isdigit() else 0


class _Tb:
    """The few tensorboard names this reader uses, imported once."""

    def __init__(self) -> None:
        import numpy
        from tensorboard.backend.event_processing.event_file_loader import RawEventFileLoader
        from tensorboard.compat import tf
        from tensorboard.compat.proto import event_pb2
        from tensorboard.util import tensor_util

        self.numpy = numpy
        self.loader = RawEventFileLoader
        self.event_pb2 = event_pb2
        self.tensor_util = tensor_util
        self.errors = (OSError, tf.errors.OpError)

    def as_logged(self, value: float, bits: int) -> float:
        """A float32 as the number the trainer logged (0.1, not 0.10000000149011612)."""
        if bits == 32:
            return float(str(self.numpy.float32(value)))
        return float(value)


_TB: _Tb | None = None


def _import() -> _Tb:
    global _TB
    if _TB is None:
        _TB = _Tb()
    return _TB


class TensorBoardKind(Kind):
    name = "tensorboard"
    reads = "rows"

    def reader(self, source: SourceSpec, run_dir: Path, run: str) -> RowsAdapter:
        return RowsAdapter(TensorBoardReader(source))  # one a run: its loaders kept open

    def require(self) -> None:
        require()

    def unreadable(self, source: SourceSpec, evidence: Evidence, log: Path) -> str:
        return (f"{source.path}: {evidence.lines_seen or 0} summary values read, 0 scalar records."
                + sample(evidence, "A non-scalar tag")
                + " Check that source.path is the trainer's TensorBoard log directory and that it logs scalars.")


KIND = TensorBoardKind()
