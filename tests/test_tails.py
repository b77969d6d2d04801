"""Output tails as a terminal shows them: a progress bar's carriage-return redraws collapse to their
last state, in the executor's tail, the classifier's, and the incident a channel shows."""

from __future__ import annotations

from pathlib import Path

from babysit.core import render
from babysit.core.reading import tails
from babysit.executors.local import tail_lines


def bar(n: int = 100) -> str:
    return "".join(f"\r{i:3d}%|{'█' * (i // 10):<10}| {i}/{n}" for i in range(0, n + 1, 10))


def test_a_redrawn_line_keeps_its_last_state_and_repeats_are_dropped():
    text = f"start\n{bar()}\n{bar()}\nTraceback (most recent call last):\r\n  boom\n\n"
    assert tails.collapse(text) == ["start", "100%|██████████| 100/100", "Traceback (most recent call last):",
                                    "  boom"]
    assert tails.last_lines(text, 2) == "Traceback (most recent call last):\n  boom"
    assert tails.collapse("a\rb\r\n") == ["b"]  # a bar left on a trailing \r, then CRLF
    assert tails.collapse("") == []
    assert tails.collapse("\r  0%| 0/2\x1b[A\r100%| 2/2\x1b[A\n") == ["100%| 2/2"]  # tqdm's nested bar
    assert tails.collapse("\r  0%| 0/2\x1b[A\r100%| 2/2\x1b[A\n") == ["100%| 2/2"]  # tqdm's nested bar


def test_the_executors_stderr_tail_is_collapsed(tmp_path: Path):
    log = tmp_path / "stderr.log"
    log.write_text("loading\n" + "".join(bar() + "\n" for _ in range(60)) + "RuntimeError: x\n")
    assert tail_lines(log, lines=40).splitlines() == ["loading", "100%|██████████| 100/100", "RuntimeError: x"]


def test_an_incident_shows_the_collapsed_tail_even_from_a_raw_detail():
    out = render.render("incident", {"run": "r", "attempt": 1, "incident": "crashed", "message": "crashed",
                                     "detail": {"stderr_tail": bar() + "\nValueError: bad\n"}})
    assert out.text.splitlines()[-3:] == ["last stderr lines:", "  100%|██████████| 100/100", "  ValueError: bad"]
