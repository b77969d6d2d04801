"""The pages over a real workspace (a registered run, its store rows and log): what each shows, and that
every value from a run is escaped."""

from __future__ import annotations

import html
import time
from pathlib import Path

from babysit.web import pages
from babysit.web.data import Site
from tests.web.workspace import HOSTILE, HOSTILE_PROFILE, RUN, build


def test_the_runs_table_shows_every_column_with_the_verdict_marked_final(site_root: Path) -> None:
    rows = Site(site_root / "babysit.toml").rows()
    assert [r.run for r in rows] == [RUN, HOSTILE]  # the registry's runs, then the store's others
    text = pages.runs_fragment(rows, time.time())
    for header in ("state", "attempt · profile", "step", "s/step", "ETA", "GPU util", "GPU-hours / cap", "last poll",
                   "last incident / end", "verdict"):
        assert f">{html.escape(header)}</th>" in text
    assert '<span class="badge final">FINAL</span> SAME-DRIFT Δ +0.0600' in text
    assert "2/2 stable-lr" in text and "150/150" in text and "87%" in text and "0.03/2.00" in text


def test_a_provisional_read_is_marked_provisional(tmp_path: Path) -> None:
    build(tmp_path, final=False)
    text = pages.runs_fragment(Site(tmp_path / "babysit.toml").rows(), time.time())
    assert '<span class="badge provisional">PROVISIONAL</span>@100 AMBIGUOUS' in text


def test_html_in_a_run_name_a_profile_or_an_incident_is_text(site_root: Path) -> None:
    site = Site(site_root / "babysit.toml")
    now = time.time()
    runs = pages.runs_page(site.rows(now), now, "footer")
    hostile = pages.run_page(site.run(HOSTILE, now), now, "footer")
    drift = pages.run_page(site.run(RUN, now), now, "footer")
    for text in (runs, hostile, drift):
        assert "<script>window" not in text and "<img src=x" not in text and "<b onmouseover" not in text
    assert html.escape(HOSTILE) in runs and html.escape(HOSTILE_PROFILE) in drift
    assert "/run/%3Cscript%3E" in runs  # the link is quoted too
    assert "attempt 1 diverged: &lt;b&gt;NaN&lt;/b&gt; loss at step 60" in drift


def test_a_run_page_has_its_curve_incidents_attempts_verdict_and_prereg_chain(site_root: Path) -> None:
    site = Site(site_root / "babysit.toml")
    detail = site.run(RUN)
    assert detail is not None and detail.chart is not None and detail.chart_note is None
    assert [i.kind for i in detail.incidents] == ["diverged", "retrying"]
    assert detail.incidents[0].text == "attempt 1 diverged: <b>NaN</b> loss at step 60"  # the message's text
    text = pages.run_fragment(detail, time.time())
    assert 'class="band"' in text and 'class="amendment-mark"' in text
    assert text.count('<tr data-attempt=') == 2 and "diverged" in text and "exit 3" in text
    assert "loss is NaN at step 60" in text  # the attempt's own reason
    assert "FROZEN" in text and "chain ok" in text and "amendment 1: scale &lt;calibration&gt;" in text
    assert "Does &lt;eval&gt; error climb after step 50? &amp; why" in text
    assert "&quot;label&quot;: &quot;SAME-DRIFT&quot;" in text  # the verdict JSON


def test_an_edited_prereg_shows_tampered_and_draws_no_bands(site_root: Path) -> None:
    spec = site_root / f"{RUN}.toml"
    spec.write_text(spec.read_text().replace("baseline_step = 50", "baseline_step = 100"))
    detail = Site(site_root / "babysit.toml").run(RUN)
    assert detail is not None and detail.chart is not None and not detail.chart.bands
    assert "edited after registration" in (detail.chart_note or "")
    assert "TAMPERED" in pages.run_fragment(detail, time.time())


def test_an_unknown_run_has_no_page(site_root: Path) -> None:
    assert Site(site_root / "babysit.toml").run("nosuch") is None


def test_no_state_database_yet_is_not_created_by_looking(tmp_path: Path) -> None:
    site = Site(tmp_path / "babysit.toml")
    assert pages.runs_fragment(site.rows(), time.time()).count("no runs registered yet") == 1
    assert not (tmp_path / ".babysit").exists()


def test_the_batched_store_reads_equal_the_per_run_ones(site_root: Path) -> None:
    """The page reads every run at once (Store.latest_*); each must say what the per-run read says."""
    from babysit.db.store import Store

    store = Store.in_dir(site_root / ".babysit")
    try:
        store.save_verdict(RUN, {"run": RUN, "status": "PROVISIONAL", "at_step": 160}, time.time(), final=False)
        for name in (RUN, HOSTILE):
            assert store.latest_verdicts().get(name) == store.latest_verdict(name)  # the FINAL one wins
            assert store.latest_polls().get(name) == next(iter(store.polls(name, 1)), None)
            assert store.latest_incidents().get(name) == next(iter(store.incidents(name, 1)), None)
        assert store.latest_verdicts()[RUN].kind == "FINAL"
        assert store.incident_counts() == {RUN: {"diverged": 1, "retrying": 1}, HOSTILE: {"crashed": 1}}
    finally:
        store.close()


def test_a_final_ambiguous_by_instrument_read_is_not_shown_green(tmp_path: Path) -> None:
    """The FINAL badge was green (the colour of a conclusion) for AMBIGUOUS-BY-INSTRUMENT, whose rules
    disagree and which concludes nothing: grey now, in the runs table and on the run's page, and said on hover."""
    from babysit.db.store import Store

    build(tmp_path, final=False)
    site_root = tmp_path
    store = Store.in_dir(site_root / ".babysit")
    try:
        store.save_verdict(RUN, {"run": RUN, "status": "FINAL", "at_step": 150, "label": "AMBIGUOUS-BY-INSTRUMENT",
                                 "delta": 0.06, "interpretation": "the rules disagree"}, time.time(), final=True)
    finally:
        store.close()
    site, now = Site(site_root / "babysit.toml"), time.time()
    table = pages.runs_fragment(site.rows(now), now)
    page = pages.run_page(site.run(RUN, now), now, "footer")
    for text in (table, page):
        assert '<span class="badge final undecided" title="the FINAL read: the rules disagree' in text, text
        assert '<span class="badge final">FINAL' not in text  # before: green
    assert "AMBIGUOUS-BY-INSTRUMENT Δ +0.0600" in table
    assert "<strong>AMBIGUOUS-BY-INSTRUMENT</strong> at step 150 · Δ +0.0600</p>" in page  # before: Δ 0.06
