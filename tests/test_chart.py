"""The chart is a real PNG for every status, drawn without a display, and matplotlib stays lazy."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from babysit.core.spec.amendment import load_amendment, what_if
from babysit.core.spec.run_toml import load_spec
from babysit.core.verdict import evaluate
from babysit.verdict.chart import render_chart
from babysit.verdict.reading import read_series

FIXTURES = Path(__file__).parent / "fixtures" / "verdict"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def seed():
    spec = load_spec(FIXTURES / "run.toml")
    series, train, _ = read_series(spec.log, spec.prereg)
    amendment = what_if(load_amendment(FIXTURES / "scale_amendment.toml"), 1)
    return spec, series, train, amendment


@pytest.mark.parametrize("at_step", [None, 800, 300])
def test_chart_is_a_png_for_final_provisional_and_no_read(tmp_path: Path, seed, at_step):
    spec, series, train, amendment = seed
    verdict = evaluate(spec.prereg, [amendment], series, train_series=train, at_step=at_step)
    comp = read_series(spec.prereg.fixture.log, spec.prereg)[0]
    out = render_chart(tmp_path / "sub" / "v.png", run=spec.name, prereg=spec.prereg, series=series,
                       verdict=verdict, amendments=verdict.amendments, comparators={"rigonly": comp},
                       train_series=train)
    data = out.read_bytes()
    assert data.startswith(PNG_MAGIC) and len(data) > 20_000


def test_chart_with_no_data_at_all(tmp_path: Path, seed):
    spec, _, _, _ = seed
    verdict = evaluate(spec.prereg, (), ())
    out = render_chart(tmp_path / "empty.png", run=spec.name, prereg=spec.prereg, series=(), verdict=verdict)
    assert out.read_bytes().startswith(PNG_MAGIC)


def test_importing_the_cli_and_chart_does_not_import_matplotlib():
    code = "import sys, babysit.verdict.chart, babysit.commands.verdict, babysit.core.verdict; print('matplotlib' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_write_verdict_files_as_the_daemon_calls_it(tmp_path: Path, seed):
    from babysit.db.store import Store
    from babysit.verdict.reading import write_verdict_files

    spec, series, train, _ = seed
    store = Store.in_dir(tmp_path / "state")
    store.add_amendment(spec.name, "scale", (FIXTURES / "scale_amendment.toml").read_text(), "2026-08-17T21:35:00Z",
                        250)
    verdict = evaluate(spec.prereg, [], series, train_series=train)
    body = verdict.to_json(spec.name, spec.prereg.sha256, store.amendments(spec.name))  # store records work too
    json_path, png_path, error = write_verdict_files(spec, body, store, tmp_path / "verdicts")
    assert error is None and png_path == tmp_path / "verdicts" / f"{spec.name}.png"
    assert json_path == tmp_path / "verdicts" / f"{spec.name}.json"
    import json

    assert json.loads(json_path.read_text()) == body
    assert png_path.read_bytes().startswith(PNG_MAGIC)
    assert not list((tmp_path / "verdicts").glob("*.tmp"))


@pytest.mark.parametrize("at_step", [None, 800])
def test_values_no_axis_can_hold_are_clipped_and_the_chart_is_drawn(tmp_path: Path, seed, at_step):
    spec, _, _, amendment = seed
    series = ((500, 1.7e308), (600, 1e-320), (750, -1.7e308), (900, 1.0), (1000, 1.7e308))
    verdict = evaluate(spec.prereg, [amendment], series, at_step=at_step)
    assert verdict.status == ("FINAL" if at_step is None else "NO-READ")  # at 800: -1.7e308 - 1.7e308
    out = render_chart(tmp_path / "poison.png", run=spec.name, prereg=spec.prereg, series=series, verdict=verdict,
                       amendments=verdict.amendments, train_series=((500, -1.7e308), (1000, float("inf"))),
                       comparators={"odd": ((500, 1.0), (750, float("nan")), (1000, 10**400)),
                                    "tiny": ((500, 1e-320), (1000, 2e-320))})
    assert out.read_bytes().startswith(PNG_MAGIC)


def test_a_no_read_of_an_overflowing_delta_still_draws(tmp_path: Path, seed):
    spec, _, _, _ = seed
    series = ((500, -1.7e308), (1000, 1.7e308))
    verdict = evaluate(spec.prereg, (), series)
    assert verdict.status == "NO-READ"
    out = render_chart(tmp_path / "nr.png", run=spec.name, prereg=spec.prereg, series=series, verdict=verdict)
    assert out.read_bytes().startswith(PNG_MAGIC)


def test_a_chart_that_cannot_be_written_is_reported_never_raised(tmp_path: Path, seed):
    from babysit.verdict.reading import draw_chart

    spec, series, train, _ = seed
    verdict = evaluate(spec.prereg, (), series, train_series=train)
    (tmp_path / "taken.png").mkdir()
    path, error = draw_chart(spec, verdict.to_json(spec.name, None), None, tmp_path / "taken.png", verdict=verdict)
    assert path is None and isinstance(error, IsADirectoryError)


CHILD_DRAW = """
import sys
from pathlib import Path
from babysit.core.spec.amendment import load_amendment, what_if
from babysit.core.spec.run_toml import load_spec
from babysit.core.verdict import evaluate
from babysit.verdict.reading import draw_chart, read_series
fixtures, out = Path(sys.argv[1]), Path(sys.argv[2])
spec = load_spec(fixtures / "run.toml")
series, train, _ = read_series(spec.log, spec.prereg)
verdict = evaluate(spec.prereg, [what_if(load_amendment(fixtures / "scale_amendment.toml"), 1)], series,
                   train_series=train)
body = verdict.to_json(spec.name, spec.prereg.sha256)
drawn, error = draw_chart(spec, body, None, out / "child.png", verdict=verdict, child=True)
assert error is None and drawn == out / "child.png", error
(out / "taken.png").mkdir()
drawn, error = draw_chart(spec, body, None, out / "taken.png", verdict=verdict, child=True)
print(type(error).__name__, drawn, 'matplotlib' in sys.modules)
print("NOTE", "in the chart child" in "".join(getattr(error, "__notes__", [])))
"""


def test_the_daemons_chart_is_drawn_in_a_child_the_same_png_and_the_same_error(tmp_path: Path, seed):
    """The daemon draws through `child=True` so matplotlib never enters it (its RSS: bench/README §4b):
    the PNG is the one drawn in process, a failure the same exception type (a said, non-fatal error)."""
    out = subprocess.run([sys.executable, "-c", CHILD_DRAW, str(FIXTURES), str(tmp_path)], capture_output=True,
                         text=True, check=True)
    assert out.stdout.splitlines() == ["IsADirectoryError None False", "NOTE True"]
    spec, series, train, amendment = seed
    verdict = evaluate(spec.prereg, [amendment], series, train_series=train)
    here = render_chart(tmp_path / "here.png", run=spec.name, prereg=spec.prereg, series=series, verdict=verdict,
                        amendments=verdict.amendments, train_series=train)
    assert (tmp_path / "child.png").read_bytes() == here.read_bytes()
