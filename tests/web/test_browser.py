"""The pages in a real browser (Debian's headless Chromium through Playwright) over a workspace with
history: HTML in a run's name is text and runs nothing, a run page draws its curve and bands and lists
its incident, and the runs table changes by itself when the run's log does. The same against a live
daemon on a real CPU run: test_browser_live.py (slow)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from babysit.web.server import Settings, WebServer
from tests.web.workspace import HOSTILE, HOSTILE_PROFILE, RUN, build


def test_html_in_a_run_name_renders_as_text_and_runs_nothing(server: WebServer, page: Any) -> None:
    page.goto(server.url)
    link = page.locator(f'tr[data-run="{HOSTILE.replace(chr(34), chr(92) + chr(34))}"] td.run a')
    assert link.inner_text() == HOSTILE
    page.goto(server.url + "run/" + quote(HOSTILE, safe=""))
    assert page.locator("h1 .run-name").inner_text() == HOSTILE
    assert HOSTILE_PROFILE in page.locator("#attempts").inner_text()
    assert page.locator("#incidents .text").inner_text() == HOSTILE  # the incident's own text
    page.wait_for_function("Number(document.body.dataset.updates || 0) >= 1")  # streamed in again: still text
    assert page.locator("h1 .run-name").inner_text() == HOSTILE
    assert page.evaluate("window.pwned") is None and page.locator("img").count() == 0
    assert page.errors == []


def test_a_run_page_shows_its_curve_bands_and_incident(server: WebServer, page: Any) -> None:
    page.goto(server.url + f"run/{RUN}")
    chart = page.locator("#curve svg.chart")
    assert chart.is_visible()
    assert page.locator("#curve rect.band").count() == 2
    assert page.locator("#curve polyline.curve.metric").count() == 1
    assert page.locator("#curve polyline.curve.train").count() == 1
    assert page.locator("#curve .step-line.baseline").count() == 2
    assert page.locator("#curve .amendment-mark").count() == 2
    incident = page.locator('#incidents li.incident[data-kind="diverged"]')
    assert "attempt 1 diverged: <b>NaN</b> loss at step 60" in incident.inner_text()
    assert page.locator("#verdict .badge.final").inner_text() == "FINAL"
    assert page.locator("#prereg").get_by_text("chain ok").count() == 1
    assert page.errors == []


def test_the_runs_table_updates_itself_when_the_log_moves(tmp_path: Path, page: Any) -> None:
    build(tmp_path, final=False)  # a running attempt at step 120
    web = WebServer(tmp_path / "babysit.toml", Settings(port=0, refresh_s=0.3)).start()
    try:
        page.goto(web.url)
        row = page.locator(f'tr[data-run="{RUN}"]')
        assert row.get_attribute("data-step") == "120"
        assert "PROVISIONAL" in row.locator("td.verdict .badge").inner_text()
        log = tmp_path / "outputs" / RUN / "train_log.jsonl"
        with log.open("a") as f:
            for step in range(121, 131):
                f.write(json.dumps({"step": step, "ts": time.time(), "train_loss": 0.1}) + "\n")
        page.wait_for_function(f"document.querySelector('tr[data-run=\"{RUN}\"]').dataset.step === '130'",
                               timeout=60_000)
        assert "130/150" in row.locator("td.step").inner_text()
        assert page.evaluate("performance.getEntriesByType('navigation').length") == 1  # no reload: streamed
    finally:
        web.stop()


@pytest.mark.parametrize("path", ["", f"run/{RUN}"])
def test_no_request_leaves_the_machine(server: WebServer, page: Any, path: str) -> None:
    """No CDN, no font, no script from elsewhere: every request the page makes is to the server."""
    seen: list[str] = []
    page.on("request", lambda r: seen.append(r.url))
    page.goto(server.url + path)
    page.wait_for_function("Number(document.body.dataset.updates || 0) >= 1")
    assert seen and all(u.startswith(server.url) for u in seen), seen


def test_a_run_across_nodes_shows_one_row_a_node_from_its_latest_poll(tmp_path: Path, page: Any) -> None:
    """The latest poll of a 2-node job holds a row a node (its ranks, step, pace, GPU util, free RAM): the run
    page shows them as a table, a quiet node saying so."""
    from babysit.core.snapshot import Snapshot
    from babysit.db.store import Store

    build(tmp_path, final=False)
    nodes = [{"node": "n1", "ranks": [0], "step": 120, "seconds_per_step": 0.41, "quiet_seconds": 0.2,
              "available_ram_bytes": 310 * 2**30, "gpus": 1, "gpu_util_pct": 93.4},
             {"node": "n2", "ranks": [1], "step": 118, "seconds_per_step": 0.41, "quiet_seconds": 61.0,
              "available_ram_bytes": 12 * 2**30, "gpus": 1, "gpu_util_pct": None}]
    Store.in_dir(tmp_path / ".babysit").add_poll(RUN, 2, time.time(), "poll", Snapshot.from_dict(
        {"step": 120, "gpus": [{"index": 0, "util_pct": 93.4}], "nodes": nodes}))
    web = WebServer(tmp_path / "babysit.toml", Settings(port=0, refresh_s=0.3)).start()
    try:
        page.goto(web.url + f"run/{RUN}")
        rows = page.locator("#nodes table.nodes tbody tr")
        assert rows.count() == 2
        assert [rows.nth(i).get_attribute("data-node") for i in range(2)] == ["n1", "n2"]
        cells = [[c.strip() for c in rows.nth(i).inner_text().split("\t")] for i in range(2)]
        assert cells[0][:6] == ["n1", "0", "120", "0.41", "93 %", "310.0 GiB"], cells
        assert cells[1][:6] == ["n2", "1", "118", "0.41", "—", "12.0 GiB"], cells
        assert rows.nth(1).locator("td.note").inner_text() == "no step for 1m01s"
        assert "attempt 2, poll of" in page.locator("#nodes p.note").inner_text()
        assert page.errors == []
    finally:
        web.stop()
