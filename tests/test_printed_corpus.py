"""The printed-output corpus (tests/fixtures/corpus/*.toml): what well-known trainers really print, each
sample with the records babysit must read from it with zero configuration (`preset = "auto"`, no
patterns) and the reader that must read it. A sample is written where the trainer writes it, the
run's captured `attempt-1/stdout.log` or `stderr.log`, and read there by the real stdout source.

A failure here is a real format a user would run that babysit misreads: fix the reader, not the sample
(the corpus README says how each sample was made and where its lines come from)."""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

import pytest
import tomllib

from babysit.core.reading import presets
from babysit.core.spec.source import SourceSpec, parse_source
from babysit.core.spec.tomlfile import Table
from babysit.sources import stdout

CORPUS = Path(__file__).parent / "fixtures" / "corpus"
STREAMS = {"stdout": "stdout.log", "stderr": "stderr.log"}
COMMIT = re.compile(r"\b[0-9a-f]{40}\b")
REL = 1e-6


def load_corpus() -> list[tuple[str, dict[str, Any], dict[str, Any]]]:
    """(file stem, the file's table, one sample) for every sample of every corpus file."""
    out = []
    for path in sorted(CORPUS.glob("*.toml")):
        with open(path, "rb") as f:
            table = tomllib.load(f)
        out += [(path.stem, table, sample) for sample in table["sample"]]
    return out


SAMPLES = load_corpus()


def auto_source() -> SourceSpec:
    return parse_source(Table({"kind": "stdout", "preset": "auto"}, "run.toml", "source"), workdir=Path("."),
                        name="corpus", log=None)


def same_value(got: float, want: float) -> bool:
    if math.isnan(want):
        return math.isnan(got)
    return got == want or math.isclose(got, want, rel_tol=REL)


def same_record(got: tuple[int, dict[str, float]], want: tuple[int, dict[str, float]]) -> bool:
    return got[0] == want[0] and got[1].keys() == want[1].keys() and \
        all(same_value(got[1][k], want[1][k]) for k in want[1])


@pytest.mark.parametrize("stem, table, sample", SAMPLES, ids=[f"{stem}-{s['name']}" for stem, _, s in SAMPLES])
def test_corpus_sample_reads_to_its_expected_records(tmp_path, stem, table, sample):
    attempt = tmp_path / "run" / "attempt-1"
    attempt.mkdir(parents=True)
    (attempt / STREAMS[sample["stream"]]).write_bytes(sample["text"].encode("utf-8"))
    if "stderr" in sample:  # captured apart, as babysit captures a run: read only at its exit, as after it
        (attempt / "stderr.log").write_bytes(sample["stderr"].encode("utf-8"))
    got = stdout.read(auto_source(), tmp_path / "run", {}, final=True)
    records = [(item.step, dict(item.metrics)) for item in got.items]
    want = [(e["step"], {k: float(v) for k, v in e["metrics"].items()}) for e in sample["expect"]]
    first_wrong = next((i for i, (g, w) in enumerate(zip(records, want, strict=False)) if not same_record(g, w)),
                       None if len(records) == len(want) else min(len(records), len(want)))
    assert first_wrong is None, (
        f"{stem}.toml sample {sample['name']!r} ({table['framework']}): {len(records)} records read, "
        f"{len(want)} expected; first difference at record {first_wrong}: read "
        f"{records[first_wrong] if first_wrong < len(records) else 'nothing'}, expected "
        f"{want[first_wrong] if first_wrong < len(want) else 'nothing'}")
    assert (got.state or {}).get("preset") == sample["reader"], \
        f"{stem}.toml sample {sample['name']!r}: read by {(got.state or {}).get('preset')!r}, expected {sample['reader']!r}"


def test_corpus_spans_twenty_frameworks_and_every_sample_says_where_it_comes_from():
    frameworks = {table["framework"] for _, table, _ in SAMPLES}
    assert len(frameworks) >= 20, sorted(frameworks)
    readers = set(presets.names()) | {"general"}
    for stem, _, sample in SAMPLES:
        where = f"{stem}.toml sample {sample.get('name')!r}"
        assert sample["how"] in ("captured", "format strings"), where
        if sample["how"] == "captured":
            assert sample["origin"].startswith("captured:"), where
        else:
            assert COMMIT.search(sample["origin"]), f"{where}: origin names no 40-hex commit"
        assert sample["reader"] in readers, where
        assert sample["stream"] in STREAMS, where
        assert "stderr" not in sample or sample["stream"] == "stdout", f"{where}: `stderr` is the other stream"
        assert sample["expect"], f"{where}: no expected record"
    assert sum(any(math.isnan(v) for e in s["expect"] for v in e["metrics"].values()) for _, _, s in SAMPLES) >= 3
