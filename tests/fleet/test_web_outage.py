"""The web page (`babysit web`, `up --web`) while a real PostgreSQL is stopped under it (`pg_ctl stop`, then
start): it serves what `babysit status` serves then — this box's runs from its local mirror, through the same
reader (babysit/view/readstore.py) — under a banner saying the shared database cannot be reached, since when,
and that other boxes' runs are not shown; /metrics keeps answering with `babysit_store_degraded 1`; once the
server is back the page shows the shared view again, the web server never restarted (docs/web.md)."""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from babysit.db.postgres import PostgresStore
from babysit.web.server import Settings, WebServer
from tests.fleet.helpers import fleet_box
from tests.support import wait_for
from tests.web.conftest import fetch

BANNER = "the database cannot be reached"


def _metrics(url: str) -> dict[str, list[Any]]:
    status, _, body = fetch(url + "metrics")
    assert status == 200, body
    return {f.name: f.samples for f in text_string_to_metric_families(body.decode())}


def _gauge(fams: dict[str, list[Any]], name: str, **labels: str) -> float | None:
    hits = [s.value for s in fams.get(name, []) if all(s.labels.get(k) == v for k, v in labels.items())]
    return hits[0] if hits else None


def _page(url: str, path: str = "") -> str:
    status, _, body = fetch(url + path)
    assert status == 200, body
    return body.decode()


@pytest.fixture
def box(tmp_path: Path, pg_url: str, monkeypatch: pytest.MonkeyPatch) -> Path:
    for name in ("BABYSIT_STORE_URL", "BABYSIT_HOST"):
        monkeypatch.delenv(name, raising=False)
    root = fleet_box(tmp_path, pg_url)
    return root


def test_the_page_serves_this_box_from_its_mirror_while_postgres_is_down_and_the_fleet_once_back(
        box: Path, pg_url: str, outage: Callable[[], None], postgres: Any) -> None:
    other = PostgresStore(pg_url, host="box-b")  # another box's run: in the shared view only
    other.claim_run("rb", 1.0)
    other.set_run_state("rb", "running", time.time(), step=3)
    other.close()
    web = WebServer(box / "babysit.toml", Settings(port=0, refresh_s=0.3)).start()
    daemon = None
    try:
        outage()  # no daemon ever ran here: no mirror, the page says the database cannot be reached
        page = _page(web.url)
        assert "cannot open the state database" in page and 'data-run="r1"' not in page
        fams = _metrics(web.url)
        assert _gauge(fams, "babysit_store_degraded") == 1.0 and "babysit_run_state" not in fams
        postgres.start()

        daemon = PostgresStore(pg_url, host="box-a", state_dir=box / ".babysit", may_start_down=True)
        daemon.claim_run("r1", 1.0)
        daemon.start_journal()  # what `babysit up` does: the mirror
        attempt = daemon.begin_attempt("r1", 1, "base", ["python"], "local", 1, "a1", time.time())
        daemon.mark_running(attempt.id, started_at=time.time(), pid=os.getpid())
        daemon.set_run_state("r1", "running", time.time(), step=7)
        shared = wait_for("the shared view", lambda: (p := _page(web.url)) and 'data-run="rb"' in p and p)
        assert 'data-run="r1"' in shared and BANNER not in shared
        assert _gauge(_metrics(web.url), "babysit_store_degraded") == 0.0

        outage()  # under the page's open connections: their reads fail, and fall back
        down_at = time.time()
        daemon.add_incident("r1", 1, time.time(), "while-down", {"message": "seen while down"})  # journaled
        page = _page(web.url)
        assert BANNER in page and "local mirror" in page and "runs are not shown" in page
        assert 'class="degraded"' in page
        assert 'data-run="r1"' in page and 'data-run="rb"' not in page  # this box's runs only
        since = re.search(r"in step with the database until (\d\d:\d\d:\d\d) UTC", page)
        assert since is not None, page  # since when: the daemon's mirror, as it lost the database
        assert since.group(1) in {time.strftime("%H:%M:%S", time.gmtime(at)) for at in range(int(down_at) - 1,
                                                                                             int(time.time()) + 1)}
        assert [(r["run"], r["status"]) for r in json.loads(_page(web.url, "api/runs"))] == [("r1", "running")]
        run_page = _page(web.url, "run/r1")
        assert BANNER in run_page and "while-down" in run_page  # the incident journaled while down
        fams = _metrics(web.url)
        assert _gauge(fams, "babysit_store_degraded") == 1.0
        assert (_gauge(fams, "babysit_store_mirror_age_seconds") or -1) >= 0
        assert _gauge(fams, "babysit_run_state", run="r1", state="running") == 1.0
        assert _gauge(fams, "babysit_run_state", run="rb", state="running") is None

        postgres.start()  # the same server process of the page: back to the shared view by itself
        back = wait_for("the shared view again", lambda: (p := _page(web.url)) and 'data-run="rb"' in p and p,
                        timeout=30)
        assert BANNER not in back and 'data-run="r1"' in back
        assert wait_for("the gauge back to 0", lambda: _gauge(_metrics(web.url), "babysit_store_degraded") == 0.0)
    finally:
        web.stop()
        if daemon is not None:
            if not postgres.running():
                postgres.start()
            daemon.close()


def test_the_live_view_s_reader_falls_back_when_postgres_goes_away_under_it_and_comes_back(
        box: Path, pg_url: str, outage: Callable[[], None], postgres: Any) -> None:
    """`status --watch` and `babysit up`'s live view keep one reader across refreshes: a PostgreSQL stopped
    under its open connection gives the mirror's rows and banner at the next refresh (before: the read's
    error), and the refresh after the server is back the fleet again."""
    from babysit.view.runview import Reader

    other = PostgresStore(pg_url, host="box-b")
    other.claim_run("rb", 1.0)
    other.close()
    daemon = PostgresStore(pg_url, host="box-a", state_dir=box / ".babysit", may_start_down=True)
    daemon.claim_run("r1", 1.0)
    daemon.start_journal()
    daemon.set_run_state("r1", "running", time.time(), step=7)
    reader = Reader(box / "babysit.toml")
    try:
        assert [r.run for r in reader.rows()] == ["r1", "rb"] and reader.banner() is None
        outage()
        daemon.add_incident("r1", None, time.time(), "while-down", {})  # the daemon notices, journals
        assert [(r.run, r.status) for r in reader.rows()] == [("r1", "running")]
        assert BANNER in (reader.banner() or "")
        postgres.start()
        assert [r.run for r in reader.rows()] == ["r1", "rb"] and reader.banner() is None
    finally:
        reader.close()
        if not postgres.running():
            postgres.start()
        daemon.close()
