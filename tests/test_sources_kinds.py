"""One registry of kinds drives everything a `[source]` kind means (core/spec/source_kinds.py, sources/kinds.py), and
one tailer (sources/tailer.py) reads every file a file-reading kind reads.

The first tests register a kind of their own — "tally", whose module is this file (its `KIND` below) — with
one line in the registry, and find it checked by run.toml's validation, read into babysit's record log by
the pump, judged unreadable in its own words, its package checked at registration: pump.py, evidence.py and
registration untouched. The others drive the real kinds' readers over a partial last record, a file
truncated in place and a file replaced by another, and count that each went through the one tailer.
"""

from __future__ import annotations

import json
import os
import struct
import zlib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from babysit.core.errors import BadInput, SpecError
from babysit.core.spec import source_kinds
from babysit.core.spec.run_toml import load_spec
from babysit.core.spec.source import SourcePattern, SourceSpec
from babysit.core.spec.source_kinds import KindRules
from babysit.sources import kinds, lines, logtail, records, tailer
from babysit.sources.kind import Evidence, Kind, RowsAdapter, SourceRead, sample

# -- a kind of the test's own: "tally" lines `STEP VALUE` in a file, read through the one tailer -----------


class TallyReader:
    def __init__(self, source: SourceSpec) -> None:
        self.path = source.path

    def read(self, state: Mapping[str, Any], captured: Sequence[Path], budget: int, final: bool) -> SourceRead:
        assert self.path is not None
        got = lines.read_lines(self.path, tailer.Cursor.from_dict(state.get("cursor")), window=budget, final=final)
        items, skipped = [], None
        for raw in got.lines:
            step, _, value = raw.decode().partition(" ")
            if step.isdigit():
                items.append(records.Item(int(step), {"tally": float(value)}))
            else:
                skipped = raw.decode()
        return SourceRead(tuple(items), len(got.lines), sample=skipped, state={"cursor": got.cursor.to_dict()},
                          more=got.more, files=(self.path,))


class TallyKind(Kind):
    name = "tally"
    reads = "bytes"
    missing_package = False

    def reader(self, source: SourceSpec, run_dir: Path, run: str) -> TallyReader:
        return TallyReader(source)

    def require(self) -> None:
        if self.missing_package:
            raise BadInput('[source] kind = "tally" needs the tally package', hint="pip install tally")

    def unreadable(self, source: SourceSpec, evidence: Evidence, log: Path) -> str:
        return f"{source.path}: {evidence.lines_seen} tally lines, none `STEP VALUE`." + sample(evidence, "One")


KIND = TallyKind()


@pytest.fixture
def tally(monkeypatch: pytest.MonkeyPatch) -> TallyKind:
    """The one line that adds the kind (its module: this file)."""
    monkeypatch.setitem(source_kinds.KINDS, "tally", KindRules("tally", __name__, expected="the tally file"))
    return KIND


def write_run(tmp_path: Path, source: str) -> Path:
    (tmp_path / "run.toml").write_text('[run]\nname = "r"\ncommand = ["python", "train.py"]\n\n' + source)
    return tmp_path / "run.toml"


def test_a_kind_registered_by_one_line_is_validated_by_its_rules(tmp_path: Path, tally: TallyKind) -> None:
    spec = load_spec(write_run(tmp_path, '[source]\nkind = "tally"\npath = "t.txt"\n'))
    assert spec.source.kind == "tally" and spec.source.path == tmp_path / "t.txt" and spec.source.copies
    with pytest.raises(SpecError, match=r"source\.path: expected a value"):  # a "required" path
        load_spec(write_run(tmp_path, '[source]\nkind = "tally"\n'))
    with pytest.raises(SpecError, match="the tally file"):  # in its own words
        load_spec(write_run(tmp_path, '[source]\nkind = "tally"\npath = ""\n'))
    with pytest.raises(SpecError, match='no preset for kind = "tally"'):
        load_spec(write_run(tmp_path, '[source]\nkind = "tally"\npath = "t.txt"\npreset = "nanogpt"\n'))
    with pytest.raises(SpecError, match='"tally"'):  # the kinds offered are the registry's
        load_spec(write_run(tmp_path, '[source]\nkind = "talley"\npath = "t.txt"\n'))


def test_a_kind_registered_by_one_line_reaches_records_and_evidence(tmp_path: Path, tally: TallyKind) -> None:
    from babysit import sources

    spec = load_spec(write_run(tmp_path, '[source]\nkind = "tally"\npath = "t.txt"\n'))
    (tmp_path / "t.txt").write_text("1 0.5\n2 0.25\nwarming up\n3 0.125\n4 0.0")  # the last: not ended yet
    pump = sources.SourcePump(spec, tmp_path / "sd")
    got = pump.pump(now=100.0)
    assert pump.kind is tally and got.records_added == 3 and got.lines_seen == 4
    written = [json.loads(line) for line in sources.records_path(spec, tmp_path / "sd").read_text().splitlines()]
    assert [(r["step"], r["tally"]) for r in written] == [(1, 0.5), (2, 0.25), (3, 0.125)]
    assert got.evidence == Evidence(4, 3, len("1 0.5\n2 0.25\nwarming up\n3 0.125\n4 0.0"), "warming up")
    assert sources.unreadable(spec.source, got.evidence, log=tmp_path / "x") is None  # records were parsed

    (tmp_path / "u.txt").write_text("warming up\nstill warming\n")
    lost = load_spec(write_run(tmp_path, '[source]\nkind = "tally"\npath = "u.txt"\n'))
    told = sources.unreadable(lost.source, sources.SourcePump(lost, tmp_path / "sd2").pump(now=1.0).evidence,
                              log=tmp_path / "x")
    assert told == (f"{tmp_path / 'u.txt'}: 2 tally lines, none `STEP VALUE`. One: 'still warming'. "
                    "The run is not stopped for this.")


def test_registration_checks_the_package_of_a_registered_kind(tmp_path: Path, tally: TallyKind,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    from babysit.register import registration

    (tmp_path / "t.txt").write_text("")
    run = write_run(tmp_path, '[source]\nkind = "tally"\npath = "t.txt"\n')
    monkeypatch.setattr(KIND, "missing_package", True)
    with pytest.raises(BadInput, match="needs the tally package"):
        registration.register(run, tmp_path / "babysit.toml")


def test_every_registered_kind_has_an_adapter_module_with_its_kind() -> None:
    for name, rules in source_kinds.KINDS.items():
        kind = kinds.adapter(name)
        assert kind.name == name and rules.adapter.startswith("babysit.sources.")
        assert kind.reads in ("bytes", "rows")


def test_every_rows_kind_is_read_through_the_one_rows_adapter(tmp_path: Path) -> None:
    """TensorBoard's and MLflow's readers return one type (`RowsRead`), made the pump's read by one adapter:
    a read of a source not written yet passes its problem and its count through it."""
    rows = [name for name in source_kinds.KINDS if kinds.adapter(name).reads == "rows"]
    assert sorted(rows) == ["mlflow", "tensorboard"]
    said = {}
    for name in rows:
        spec = load_spec(write_run(tmp_path, f'[source]\nkind = "{name}"\npath = "not-yet"\n'))
        reader = kinds.adapter(name).reader(spec.source, tmp_path, "r")
        assert isinstance(reader, RowsAdapter)
        got = reader.read({}, (), 1 << 20, False)
        assert isinstance(got, SourceRead) and got.items == () and got.lines == 0 and not got.more
        said[name] = got.problems
    assert said == {"tensorboard": (f"{tmp_path / 'not-yet'} does not exist (yet)",), "mlflow": ()}


# -- the one tailer, under every file-reading kind -------------------------------------------------------


def _wandb_frame(step: int) -> bytes:
    from wandb.proto import wandb_internal_pb2 as pb

    from babysit.sources import wandbfile

    record = pb.Record()
    record.history.step.num = step
    item = record.history.item.add()
    item.key, item.value_json = "loss", json.dumps(1.0 / step)
    body = record.SerializeToString()
    return struct.pack("<IHB", zlib.crc32(body, wandbfile.TYPE_CRC[wandbfile.FULL]), len(body), wandbfile.FULL) + body


class FileKind:
    """How each file-reading kind's file is written and read (through its own reader)."""

    def __init__(self, name: str, tmp_path: Path) -> None:
        self.name, self.tmp = name, tmp_path
        self.state: dict[str, Any] = {}
        run_dir = tmp_path / "sd" / "runs" / "r"
        if name == "stdout":
            self.path = run_dir / "attempt-1" / "stdout.log"
            self.source = SourceSpec(kind="stdout", patterns=(SourcePattern(r"iter (?P<step>\d+): loss (?P<loss>[.\d]+)"),))
        elif name == "csv":
            self.path = tmp_path / "metrics.csv"
            self.source = SourceSpec(kind="csv", path=self.path)
        elif name == "wandb":
            self.path = tmp_path / "wandb" / "wandb" / "run-20261202_000000-abc" / "run-abc.wandb"
            self.source = SourceSpec(kind="wandb", path=tmp_path / "wandb")
        else:
            self.path = tmp_path / "train.jsonl"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if name == "stdout":
            (self.path.parent / "stderr.log").write_text("")
        self.reader = kinds.adapter(name).reader(self.source, run_dir, "r") if name != "jsonl" else None
        self.tail = logtail.TailState()

    def content(self, steps: list[int]) -> tuple[bytes, bytes]:
        """(the file holding these records whole, the bytes of one more record written in part)."""
        if self.name == "stdout":
            return b"".join(b"iter %d: loss 0.5\n" % s for s in steps), b"iter 99: lo"
        if self.name == "csv":
            return b"step,loss\n" + b"".join(b"%d,0.5\n" % s for s in steps), b"99,0."
        if self.name == "wandb":
            from babysit.sources import wandbfile

            return wandbfile.HEADER + b"".join(_wandb_frame(s) for s in steps), _wandb_frame(99)[:9]
        return b"".join(b'{"step": %d, "ts": 1.0, "loss": 0.5}\n' % s for s in steps), b'{"step": 99, "ts'

    def read(self) -> list[int]:
        if self.reader is None:
            got = logtail.read_new(self.path, self.tail)
            self.tail = got.state
            return [r.step for r in got.records]
        run_dir = self.tmp / "sd" / "runs" / "r"
        captured = [run_dir / "attempt-1" / "stdout.log", run_dir / "attempt-1" / "stderr.log"]
        got = self.reader.read(self.state, captured if self.name == "stdout" else [], 2**20, False)
        self.state = dict(got.state)
        return [it.step for it in records.items_of(got.items)]


@pytest.mark.parametrize("name", ["jsonl", "stdout", "csv", "wandb"])
def test_the_one_tailer_reads_every_file_kind_past_a_partial_record_a_truncation_and_a_replacement(
        tmp_path: Path, name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    if name == "wandb":
        pytest.importorskip("wandb")
    tailed: list[Path] = []
    real = tailer.read
    monkeypatch.setattr(tailer, "read", lambda path, *a, **k: tailed.append(Path(path)) or real(path, *a, **k))
    kind = FileKind(name, tmp_path)
    whole, part = kind.content([1, 2])
    kind.path.write_bytes(whole + part)
    assert kind.read() == [1, 2]  # the record written in part waits
    rest, _ = kind.content([1, 2, 99])
    kind.path.write_bytes(rest)
    assert kind.read() == [99]  # and is read once it is whole
    assert kind.read() == []  # nothing twice

    shorter, _ = kind.content([10])
    with open(kind.path, "r+b") as f:  # truncated in place (the same inode), shorter than what was read
        f.truncate(0)
        f.write(shorter)
    assert kind.read() == [10]

    longer, _ = kind.content([20, 21, 22, 23, 24, 25, 26, 27])
    new = kind.path.with_name(kind.path.name + ".new")
    new.write_bytes(longer)
    os.replace(new, kind.path)  # another file in its place, longer than the offset: only its inode tells
    assert kind.read() == [20, 21, 22, 23, 24, 25, 26, 27]
    assert kind.path in tailed  # every read of it went through the one tailer


def test_the_tailer_keeps_the_cursor_of_a_missing_file_and_reads_a_rewritten_head_again(tmp_path: Path) -> None:
    path = tmp_path / "f"
    assert tailer.read(path, tailer.Cursor(offset=5), 100) is None
    path.write_bytes(b"abcdef\n")
    first = tailer.read(path, tailer.Cursor(), 100)
    assert first is not None and first.data == b"abcdef\n" and not first.reset
    cursor = first.advance(7)
    with open(path, "r+b") as f:  # the same inode, longer, but its first bytes rewritten
        f.write(b"XYZdef\nmore\n")
    again = tailer.read(path, cursor, 100)
    assert again is not None and again.reset and again.data == b"XYZdef\nmore\n" and again.grown(cursor) == 12


def test_babysit_runs_pass_through_follows_a_captured_file_replaced_or_truncated(tmp_path: Path) -> None:
    """The foreground of `babysit run` tails the captured files through the one tailer too: a file put in
    the old one's place (or cut short) is shown from its start, not from the old offset (where it showed
    nothing until the new file grew past it)."""
    import io

    from babysit.view.follow import _Stream

    path, out = tmp_path / "stdout.log", io.StringIO()
    stream = _Stream(path, out)
    path.write_text("step 1\nstep 2\nhalf")
    stream.pump(0.0)
    assert out.getvalue() == "step 1\nstep 2\n"
    new = tmp_path / "new.log"
    new.write_text("again 1\n")
    os.replace(new, path)
    stream.pump(1.0)
    assert out.getvalue() == "step 1\nstep 2\nagain 1\n"  # the old file's partial line is not glued on
    with open(path, "r+b") as f:
        f.truncate(0)
        f.write(b"x\n")
    stream.pump(2.0)
    assert out.getvalue().endswith("again 1\nx\n")


def test_the_tailers_looks_close_their_descriptor_whatever_happens_and_say_none_for_a_missing_file(
        tmp_path: Path) -> None:
    """read, at and identity each open the file once and close it, also when the look raises (a directory
    where the file was: pread says EISDIR), and say None for a file that is not there."""
    path = tmp_path / "f.jsonl"
    path.write_bytes(b'{"step": 1}\n')
    fds = len(os.listdir("/proc/self/fd"))
    window = tailer.read(path, tailer.Cursor(), 1 << 20)
    assert window is not None and window.data == b'{"step": 1}\n'
    moved = tailer.at(path, window.advance(len(window.data)), path.stat().st_size)
    assert moved is not None and moved.offset == 12 and moved.file_id == window.file_id
    assert tailer.identity(path) == (window.file_id, 12, b'{"step": 1}\n')
    gone = tmp_path / "none"
    assert tailer.read(gone, tailer.Cursor(), 10) is None and tailer.at(gone, tailer.Cursor(), 0) is None
    assert tailer.identity(gone) is None
    folder = tmp_path / "dir"
    folder.mkdir()
    with pytest.raises(IsADirectoryError):
        tailer.read(folder, tailer.Cursor(), 10)
    with pytest.raises(IsADirectoryError):
        tailer.identity(folder)
    assert len(os.listdir("/proc/self/fd")) == fds
