"""The user docs read in one breath: the mean sentence of README.md and of each page under docs/ stays at
25 words or fewer (issue 42). How it is measured: prose only (code blocks, tables, headings and HTML left
out); a list item is a sentence of its own; `.`, `!`, `?` and `;` end a sentence; inline code counts as
one word and a link as its text."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
MEAN_WORDS = 25


def prose_blocks(text: str) -> list[str]:
    """Paragraphs and list items, each as one line of text."""
    text = re.sub(r"```.*?```", "\n\n", text, flags=re.S)
    blocks: list[str] = []
    current: list[str] = []
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith(("|", "#", "<")):
            if current:
                blocks.append(" ".join(current))
                current = []
            continue
        if re.match(r"^([-*]|\d+\.)\s", stripped):
            if current:
                blocks.append(" ".join(current))
            current = [re.sub(r"^([-*]|\d+\.)\s+", "", stripped)]
        else:
            current.append(stripped)
    if current:
        blocks.append(" ".join(current))
    return blocks


def sentences(text: str) -> list[str]:
    out = []
    for block in prose_blocks(text):
        block = re.sub(r"`[^`]*`", "X", block)
        block = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", block)
        out += [s for s in re.split(r"(?<=[.!?;])\s+(?=[A-Z`(*\[X])", block) if len(s.split()) >= 3]
    return out


def test_the_measure_splits_sentences_lists_and_leaves_code_out() -> None:
    text = "One two three. Four five six!\n\n- a list item here\n\n```\nnot prose at all here\n```\n| a | table |"
    assert sentences(text) == ["One two three.", "Four five six!", "a list item here"]


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_a_page_reads_in_one_breath(page: Path) -> None:
    words = [len(s.split()) for s in sentences(page.read_text())]
    mean = sum(words) / len(words)
    assert mean <= MEAN_WORDS, f"{page.name}: mean sentence {mean:.1f} words (at most {MEAN_WORDS}): split long ones"


def test_the_readme_is_read_in_minutes() -> None:
    """README.md: what it is, the two commands, a quickstart, the command table, links; 150 lines at most
    (issue 42). Detail belongs in docs/."""
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 150, f"README.md has {len(lines)} lines; move detail to a page under docs/"
