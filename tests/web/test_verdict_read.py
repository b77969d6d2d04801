"""The web page's chart shows the verdict the daemon reads: the same series, the store's amendments, one
evaluation (`reading.verdict_of`), so the page's label, delta and amended bands are never its own."""

from __future__ import annotations

from pathlib import Path

import pytest

from babysit.core.spec.run_toml import load_spec
from babysit.db.store import Store
from babysit.runtime import registry
from babysit.verdict.reading import read_registered_verdict
from babysit.web.data import Site
from babysit.web.svg import as_float
from tests.web.workspace import RUN, build


@pytest.mark.parametrize("final", [True, False], ids=["final", "provisional"])
def test_the_pages_chart_reads_the_verdict_the_daemon_reads(tmp_path: Path, final: bool) -> None:
    reg_path = build(tmp_path, final=final)
    reg = registry.load(reg_path)
    entry = reg.get(RUN)
    store = Store.in_dir(tmp_path / ".babysit")
    try:
        daemon = read_registered_verdict(load_spec(reg.spec_path(entry)), entry.prereg_sha256, store)
    finally:
        store.close()
    detail = Site(reg_path).run(RUN)
    assert detail is not None and detail.chart is not None and detail.chart_note is None
    chart = detail.chart
    assert (chart.status, chart.at_step, chart.delta, chart.label) == (
        daemon.status, daemon.at_step, as_float(daemon.delta), daemon.label)
    assert [(a.name, a.scale) for a in chart.amended] == [(r.name, as_float(r.scale)) for r in daemon.rules[1:]]
    assert chart.amended, "the stored amendment is read by both"
