"""kind = "wandb": records from the run's own `wandb.log` calls, read from the transaction log wandb
writes locally (offline mode, and online too: `<WANDB_DIR>/wandb/{offline-,}run-<date>-<id>/run-<id>.wandb`).

Why these files, and why they are stable: the `.wandb` file is what `wandb sync` uploads later, so
every `wandb.log` is in it, in order, whether or not the run is online; it is versioned by its header
(`:W&B`, magic 0xBEE1, version 0) and framed as LevelDB's log format (32 KiB blocks; physical records
of crc32, length, type FULL/FIRST/MIDDLE/LAST, the crc seeded by the type byte), which wandb has kept
since its Python writer (`wandb/sdk/internal/datastore.py`, 0.12–0.17) was moved into `wandb-core`.
Each record is a `wandb.proto.wandb_internal_pb2.Record`, parsed with wandb's own protobuf classes
(protobuf's rules keep old fields readable); a `history` record is one `wandb.log`: its step
(`history.step.num`), `_timestamp` (the record's time) and every key's JSON value. wandb 0.31 ships no
Python reader of the framing any more (its reader is in Go), so the framing is read here.

The `wandb` package is imported only by a run that reads this kind (`require()` checks it first).
State: each file's cursor (the one tailer's, `sources/tailer.py`) after its last whole record; a record
written in part waits, a file replaced or truncated is read again from its header.
"""

from __future__ import annotations

import json
import math
import os
import struct
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from babysit.core.errors import BadInput
from babysit.core.spec.source import RESERVED, SourceSpec
from babysit.sources import tailer
from babysit.sources.kind import Evidence, Kind, SourceRead, sample
from babysit.sources.records import Item

HEADER = struct.pack("<4sHB", b":W&B", 0xBEE1, 0)
BLOCK = 32768
RECORD_HEADER = 7  # crc32 (4), length (2), type (1)
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4
TYPE_CRC = {t: zlib.crc32(bytes([t])) for t in (FULL, FIRST, MIDDLE, LAST)}
MAX_BYTES = 8 << 20  # read per file per pump; the rest at the next


class WandbMissing(BadInput):
    def __init__(self) -> None:
        super().__init__('[source] kind = "wandb" needs the wandb package, which is not installed',
                         hint="pip install wandb  (its protobuf classes decode the .wandb files)")


def require() -> None:
    import importlib.util

    try:
        found = importlib.util.find_spec("wandb") is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        raise WandbMissing()


@dataclass(frozen=True)
class WandbRead:
    items: tuple[Item, ...]
    records: int  # history records seen: the "lines" of this source
    problems: tuple[str, ...]
    sample: str | None
    state: dict[str, Any]
    files: tuple[Path, ...]
    more: bool


def run_files(root: Path) -> list[Path]:
    """Every run's transaction log under `root`, oldest first (wandb names run folders by their start)."""
    found = []
    for dirpath, _, names in os.walk(root):
        found += [Path(dirpath) / n for n in names if n.endswith(".wandb")]
    return sorted(found, key=lambda p: (p.parent.name.split("-", 1)[-1], p.name))


def frames(data: bytes, start: int) -> tuple[list[bytes], int, str | None]:
    """The whole logical records in `data` (the file's bytes from offset `start`, a record boundary),
    the offset after the last of them, and a problem (a bad header or crc: reading stops there)."""
    out: list[bytes] = []
    pos = 0
    if start == 0:
        if len(data) < len(HEADER):
            return out, 0, None
        if data[:len(HEADER)] != HEADER:
            return out, 0, f"not a wandb transaction log version 0 (header {data[:7]!r})"
        pos = len(HEADER)
    done = pos
    pending: list[bytes] = []
    while True:
        left = BLOCK - (start + pos) % BLOCK
        if left < RECORD_HEADER:
            pos += left  # the block's trailer: zeros
            continue
        if pos + RECORD_HEADER > len(data):
            break
        crc, length, kind = struct.unpack_from("<IHB", data, pos)
        if pos + RECORD_HEADER + length > len(data):
            break  # written in part: the next read
        if kind == 0 and length == 0 and crc == 0:  # zero padding at the end of a block
            pos += left
            continue
        body = data[pos + RECORD_HEADER:pos + RECORD_HEADER + length]
        if kind not in TYPE_CRC or zlib.crc32(body, TYPE_CRC[kind]) != crc:
            return out, start + done, f"a corrupt record at byte {start + pos} (crc or type {kind})"
        pos += RECORD_HEADER + length
        if kind == FULL:
            out.append(body)
            done = pos
        elif kind == FIRST:
            pending = [body]
        elif kind == MIDDLE:
            pending.append(body)
        else:
            out.append(b"".join([*pending, body]))
            pending = []
            done = pos
    return out, start + done, None


def read(source: SourceSpec, state: Mapping[str, Any]) -> WandbRead:
    """Read every run file under `source.path` on from its offset."""
    from wandb.proto import wandb_internal_pb2 as pb

    assert source.path is not None
    cursors: dict[str, Any] = dict(state.get("cursors", {}))
    for key, offset in state.get("offsets", {}).items():  # a state before the one tailer: offsets only
        cursors.setdefault(key, {"offset": int(offset)})
    items: list[Item] = []
    problems: list[str] = []
    sample = None
    seen = 0
    more = False
    files = run_files(source.path)
    for path in files:
        key = str(path)
        try:  # the one tailer: a file replaced or truncated is read again from its header
            got = tailer.read(path, tailer.Cursor.from_dict(cursors.get(key)), MAX_BYTES)
        except OSError as exc:
            problems.append(f"{path}: {exc.strerror}")
            continue
        if got is None:
            problems.append(f"{path}: No such file or directory")
            continue
        more = more or got.more
        start = got.cursor.offset
        bodies, end, problem = frames(got.data, start)
        cursors[key] = got.advance(end - start).to_dict()
        if problem:
            problems.append(f"{path}: {problem}")
        for body in bodies:
            record = pb.Record()
            try:
                record.ParseFromString(body)
            except Exception:  # protobuf's DecodeError: a record this wandb's classes cannot read
                problems.append(f"{path}: a record wandb's protobuf classes cannot parse")
                continue
            if record.WhichOneof("record_type") != "history":
                continue
            seen += 1
            item, skipped = _item(source, record.history)
            if item is None:
                sample = skipped or sample
                continue
            items.append(item)
    return WandbRead(tuple(items), seen, tuple(problems), sample, {"cursors": cursors}, tuple(files), more)


def _item(source: SourceSpec, history: Any) -> tuple[Item | None, str | None]:
    """One `wandb.log` as a record: its numbers (wandb's own `_…` keys left out but `_timestamp`, its time)."""
    step = history.step.num if history.HasField("step") else None
    ts = None
    metrics: dict[str, float] = {}
    for entry in history.item:
        key = entry.key or "/".join(entry.nested_key)
        try:
            value = json.loads(entry.value_json)
        except ValueError:
            continue
        if key == "_step" and step is None and isinstance(value, int):
            step = value
        if key == "_timestamp" and isinstance(value, (int, float)):
            ts = float(value)
        if key.startswith("_") or isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        name = source.rename(key)
        if name not in RESERVED:
            metrics[name] = float(value)
    if step is None or not metrics:
        return None, ", ".join(e.key or "/".join(e.nested_key) for e in history.item)[:200] or None
    if ts is not None and not math.isfinite(ts):
        ts = None
    return Item(int(step) + source.step_offset, metrics, ts), None


class WandbReader:
    def __init__(self, source: SourceSpec) -> None:
        self.source = source

    def read(self, state: Mapping[str, Any], captured: Sequence[Path], budget: int, final: bool) -> SourceRead:
        got = read(self.source, state)
        return SourceRead(got.items, got.records, got.problems, got.sample, got.state, got.more, files=got.files)


class WandbKind(Kind):
    name = "wandb"
    reads = "bytes"

    def reader(self, source: SourceSpec, run_dir: Path, run: str) -> WandbReader:
        return WandbReader(source)

    def require(self) -> None:
        require()

    def attempt_env(self, source: SourceSpec, run: str, attempt: int, env: Mapping[str, str],
                    user_env: Mapping[str, str]) -> dict[str, str]:
        if "WANDB_DIR" in user_env:
            return {}
        assert source.path is not None  # wandb writes its run folders under $WANDB_DIR/wandb
        return {"WANDB_DIR": str(source.path)}

    def before_launch(self, env: Mapping[str, str], user_env: Mapping[str, str]) -> None:
        if "WANDB_DIR" not in user_env:
            Path(env["WANDB_DIR"]).mkdir(parents=True, exist_ok=True)  # wandb writes its run folders under it

    def unreadable(self, source: SourceSpec, evidence: Evidence, log: Path) -> str:
        return (f"{source.path}: {evidence.lines_seen or 0} wandb.log records read, 0 with a step and a number."
                + sample(evidence, "The keys of one")
                + " Check that the trainer calls wandb.init() without its own dir= (babysit sets $WANDB_DIR to "
                "source.path) and logs numbers.")


KIND = WandbKind()
