"""Fixtures of the web tests: a real server on 127.0.0.1 over a workspace, and Debian's headless Chromium
driven by Playwright (skipped, saying why, where either is missing: `apt-get install chromium`)."""

from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from babysit.web.server import Settings, WebServer
from tests.web import workspace

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--no-first-run", "--disable-sync"]


def fetch(url: str, headers: dict[str, str] | None = None, method: str = "GET") -> tuple[int, dict[str, str], bytes]:
    """(status, headers, body) of one real HTTP request; an error status is returned, not raised."""
    request = urllib.request.Request(url, headers=headers or {}, method=method)
    try:
        with urllib.request.urlopen(request, timeout=30) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


@pytest.fixture
def site_root(tmp_path: Path) -> Path:
    workspace.build(tmp_path)
    return tmp_path


@pytest.fixture
def server(site_root: Path) -> Iterator[WebServer]:
    """`babysit web` over the workspace, in this process (its own thread and event loop), any free port."""
    web = WebServer(site_root / "babysit.toml", Settings(port=0, refresh_s=0.3)).start()
    yield web
    web.stop()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if not Path(CHROMIUM).exists():
        pytest.skip(f"{CHROMIUM} is absent: `apt-get install -y chromium` (.ci/run does)")
    playwright = pytest.importorskip("playwright.sync_api", reason="pip install playwright (the dev extra)")
    with playwright.sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    # bypass_csp: Playwright's waits evaluate strings, which the page's CSP forbids; with the CSP off, an
    # unescaped <script> in a run's name WOULD run, so the escaping is what the tests see (the CSP header
    # itself is pinned in test_server.py)
    context = browser.new_context(viewport={"width": 1400, "height": 900}, bypass_csp=True)
    tab = context.new_page()
    tab.errors = []  # type: ignore[attr-defined]
    tab.on("pageerror", lambda e: tab.errors.append(str(e)))
    yield tab
    context.close()
