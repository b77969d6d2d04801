"""docs/your-trainer.md cannot rot: every ```toml block on the page is a run.toml that babysit loads, and
every example line the stdout examples quote beside a pattern (`[[source.patterns]]   # "<line>"`) is read
by the patterns as one record — by its own pattern, not also by another."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from babysit.core.spec.run_toml import RunSpec, load_spec
from babysit.sources import patterns
from babysit.sources.records import Item

DOC = Path(__file__).resolve().parents[1] / "docs" / "your-trainer.md"
BLOCKS = re.findall(r"^```toml\n(.*?)^```", DOC.read_text(), flags=re.S | re.M)
EXAMPLE = re.compile(r'^\[\[source\.patterns\]\]\s*#\s*"([^"]+)"', re.M)


def load(tmp_path: Path, block: str) -> RunSpec:
    path = tmp_path / "run.toml"
    path.write_text(block)
    return load_spec(path, display="docs/your-trainer.md")


@pytest.mark.parametrize("index", range(len(BLOCKS)), ids=[f"toml-{i + 1}" for i in range(len(BLOCKS))])
def test_every_run_toml_on_the_page_loads(tmp_path: Path, index: int) -> None:
    spec = load(tmp_path, BLOCKS[index])  # a SpecError names the block's key and what was expected
    assert spec.name


def test_the_page_has_a_run_toml_for_every_kind_of_source(tmp_path: Path) -> None:
    kinds = {load(tmp_path, block).source.kind for block in BLOCKS}
    assert kinds == {"jsonl", "stdout", "tensorboard", "csv", "wandb", "mlflow"}, kinds


def test_each_quoted_line_is_one_record_of_the_patterns_beside_it(tmp_path: Path) -> None:
    checked = 0
    for block in BLOCKS:
        spec = load(tmp_path, block)
        if spec.source.kind != "stdout":
            continue
        if spec.source.preset is not None:
            continue  # a preset's patterns are tested on real output (tests/test_presets.py)
        examples = EXAMPLE.findall(block)
        assert len(examples) == len(spec.source.patterns), "quote an example line beside every pattern"
        ctx = patterns.LineContext()  # in order: a computed step may use what an earlier line printed
        ctx.track = True
        for line in examples:
            line = line.replace("…", "")
            items: list[Item] = []
            problems: list[str] = []
            patterns.parse_line(spec.source, patterns.matchers(spec.source), line, items, problems, ctx)
            assert not problems, (line, problems)
            assert len(items) == 1 and items[0].metrics, (spec.name, line, items)
            checked += 1
    assert checked >= 6  # nanoGPT's two lines, torchtitan's two, word_language_model's two
