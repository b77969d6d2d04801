"""The chart is a real PNG for every status, drawn without a display, and matplotlib stays lazy."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from babysit.amendment import load_amendment, what_if
from babysit.chart import render_chart
from babysit.reading import read_series
from babysit.spec import load_spec
from babysit.verdict import evaluate

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
    code = "import sys, babysit.chart, babysit.commands.verdict, babysit.verdict; print('matplotlib' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_write_verdict_files_as_the_daemon_calls_it(tmp_path: Path, seed):
    from babysit.reading import write_verdict_files
    from babysit.store import Store

    spec, series, train, _ = seed
    store = Store.in_dir(tmp_path / "state")
    store.add_amendment(spec.name, "scale", (FIXTURES / "scale_amendment.toml").read_text(), "2026-08-17T21:35:00Z",
                        250)
    verdict = evaluate(spec.prereg, [], series, train_series=train)
    body = verdict.to_json(spec.name, spec.prereg.sha256, store.amendments(spec.name))  # store records work too
    json_path, png_path = write_verdict_files(spec, body, store, tmp_path / "verdicts")
    assert json_path == tmp_path / "verdicts" / f"{spec.name}.json"
    import json

    assert json.loads(json_path.read_text()) == body
    assert png_path.read_bytes().startswith(PNG_MAGIC)
    assert not list((tmp_path / "verdicts").glob("*.tmp"))
