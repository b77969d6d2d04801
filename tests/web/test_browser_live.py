"""Acceptance, live: a real `babysit up --accelerated --web 0` babysitting real CPU runs of the reference
trainer, watched in Debian's headless Chromium. The runs table shows a run advancing by itself (streamed,
no reload); /metrics parses with prometheus_client and its step moves; a run whose first profile
diverges (NaN injected at step 60) is retried to a FINAL verdict, and its page draws its curve against the
frozen bands and lists the incident. Slow: torch trainers on 2 shared cores (~1-2 min).

BABYSIT_WEB_SHOTS=DIR keeps the screenshots (docs/img/ has the ones docs/web.md shows).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.scenarios.conftest import PY, kill_runs, store_of, tiny_run
from tests.support import register, wait_for
from tests.web.conftest import fetch

pytestmark = pytest.mark.slow

LIVE, RETRIED = "live_tiny", "nan_retry"
PREREG = """
[retry]
max_attempts = 2
on = ["diverged"]

[prereg]
question = "Does the tiny recipe's eval error climb between steps 50 and 150?"
metric = "eval_chunk_mae"
baseline_step = 50
read_step = 150
train_metric = "train_chunk_mae"
[[prereg.bands]]
label = "HEALTHY"
max = 0.01
[[prereg.bands]]
label = "CLIMB"
min = 0.05
[prereg.otherwise]
label = "AMBIGUOUS"
"""
ATTEMPTS = """
[[attempts]]
profile = "fast-lr"
args = ["--lr-scale", "4", "--inject-nan-at-step", "60"]

[[attempts]]
profile = "stable-lr"
args = ["--lr-scale", "0.5"]
"""


class LiveDaemon:
    """`babysit up --accelerated --no-view --web 0` with its output drained (and kept) by a thread."""

    def __init__(self, root: Path) -> None:
        self.proc = subprocess.Popen([PY, "-m", "babysit", "up", "--accelerated", "--no-view", "--web", "0",
                                      "--registry", str(root / "babysit.toml")], cwd=root, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True)
        self.lines: list[str] = []
        threading.Thread(target=self._drain, daemon=True).start()

    def _drain(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line)

    def url(self) -> str:
        def found() -> str | None:
            hits = [m.group(1) for line in self.lines if (m := re.search(r"babysit web: serving (\S+)", line))]
            return hits[0] if hits else None
        return str(wait_for("the daemon's web URL", found, timeout=120))

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, str]]:
    root = tmp_path_factory.mktemp("web-live")
    # the live run is paced (50 steps a second at most): flat out it took a whole core for the module's
    # minute or two, away from the retried run, the browser and the other workers' tests
    live_run = tiny_run(root, LIVE, steps=1_000_000, args=("--inject-step-delay", "0.02"))
    for spec in (live_run, tiny_run(root, RETRIED, extra=PREREG, attempts=ATTEMPTS)):
        register(root, spec)
    daemon = LiveDaemon(root)
    try:
        yield root, daemon.url()
    finally:
        daemon.stop()
        kill_runs(root)


def step_of(page: Any, run: str) -> int:
    value = page.locator(f'tr[data-run="{run}"]').get_attribute("data-step")
    return int(value) if value else -1


def shot(page: Any, name: str, full_page: bool = True) -> None:
    where = os.environ.get("BABYSIT_WEB_SHOTS")
    if where:
        Path(where).mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(Path(where) / name), full_page=full_page)


def test_the_runs_table_shows_a_live_cpu_run_advancing(live: tuple[Path, str], page: Any) -> None:
    _root, url = live
    page.goto(url)
    page.wait_for_function(f"(document.querySelector('tr[data-run=\"{LIVE}\"]') || {{dataset: {{}}}})"
                           ".dataset.step > 5", timeout=180_000)
    first = step_of(page, LIVE)
    page.wait_for_function(f"Number(document.querySelector('tr[data-run=\"{LIVE}\"]').dataset.step) >= {first + 20}",
                           timeout=180_000)
    assert step_of(page, LIVE) >= first + 20
    assert page.evaluate("performance.getEntriesByType('navigation').length") == 1  # moved by the stream, no reload
    row = page.locator(f'tr[data-run="{LIVE}"]')
    assert row.locator("td.state").inner_text() == "running"
    assert row.locator("td.sps").inner_text() != "—"  # s/step from the log
    shot(page, "web-runs.png")
    assert page.errors == []


def test_a_metrics_scrape_parses_and_moves_as_the_run_advances(live: tuple[Path, str]) -> None:
    _, url = live

    def step() -> float | None:
        status, _, body = fetch(url + "metrics")
        assert status == 200
        fams = {f.name: f for f in text_string_to_metric_families(body.decode())}
        states = [s.labels["state"] for s in fams["babysit_run_state"].samples
                  if s.labels["run"] == LIVE and s.value == 1.0]
        if states in (["registered"], ["pending"]):
            return None  # scraped before the daemon launched it (the first test of the module to run)
        assert states == ["running"], f"{LIVE} is {states} in /metrics"
        hits = [s.value for s in fams["babysit_run_step"].samples if s.labels["run"] == LIVE]
        return hits[0] if hits else None

    first = wait_for("a step for the live run in /metrics", step, timeout=180)
    wait_for("the step in /metrics to move", lambda: (step() or 0) > first, timeout=180)


def test_a_retried_run_page_shows_its_curve_bands_and_incident(live: tuple[Path, str], page: Any) -> None:
    root, url = live
    store = store_of(root)
    try:
        wait_for("the retried run's FINAL verdict", lambda: store.final_verdict(RETRIED), timeout=400)
    finally:
        store.close()
    page.goto(url + f"run/{RETRIED}")
    assert page.locator("#curve svg.chart").is_visible()
    assert page.locator("#curve rect.band").count() == 2
    assert page.locator("#curve circle.point.metric").count() >= 3  # evals at 50, 100, 150
    assert page.locator("#curve .verdict-point").count() == 1
    incident = page.locator('#incidents li.incident[data-kind="diverged"]')
    assert incident.count() == 1 and "diverged" in incident.locator(".text").inner_text()
    assert page.locator("#attempts tbody tr").count() == 2
    assert page.locator('#attempts tr[data-attempt="1"] td.outcome').inner_text() == "diverged"
    assert page.locator("#verdict .badge.final").inner_text() == "FINAL"
    assert page.locator("img.verdict-chart").evaluate("i => i.complete && i.naturalWidth > 0")  # the daemon's PNG
    shot(page, "web-run.png", full_page=False)  # the top: facts and the curve against the bands
    page.locator("#incidents").scroll_into_view_if_needed()
    shot(page, "web-run-incidents.png", full_page=False)
    assert page.errors == []
