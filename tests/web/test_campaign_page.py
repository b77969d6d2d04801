"""A campaign's page (docs/campaigns.md), over a campaign registered through the real CLI: the runs page
links it, its page has the suspect table, the banked references and the saga (SVG) drawing them."""

from __future__ import annotations

import shutil
import xml.etree.ElementTree as ET
from pathlib import Path

from babysit.cli import main
from babysit.web.server import Settings, WebServer
from tests.web.conftest import fetch

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def test_a_campaign_page_has_its_suspects_runs_and_saga(tmp_path: Path) -> None:
    shutil.copytree(FIXTURES, tmp_path / "fixtures")
    here = tmp_path / "fixtures" / "campaign"
    registry = tmp_path / "babysit.toml"
    assert main(["campaign", "register", str(here / "campaign.toml"), "--registry", str(registry)]) == 0
    web = WebServer(registry, Settings(port=0)).start()
    try:
        status, _, runs = fetch(web.url)
        assert status == 200 and b'<a href="/campaign/sft_drift">sft_drift</a>' in runs
        status, _, body = fetch(web.url + "campaign/sft_drift")
        assert status == 200
        text = body.decode()
        assert "Why do the v2-corpus SFT runs drift after step 500?" in text
        assert "<td>distributed</td><td>live</td>" in text  # the suspect table
        assert '<section id="runs"><h2>Runs</h2><p class="empty">none</p>' in text  # none has joined yet
        assert "<td>demosonly</td><td>+2.0317</td>" in text  # the banked references
        saga = text[text.index("<svg"):text.index("</svg>") + 6]
        banked = [e for e in ET.fromstring(saga).iter() if e.get("class") == "banked"]
        assert len(banked) == 4  # demosonly, mixedv2, run2_pooled, rigonly
        assert fetch(web.url + "campaign/nosuch")[0] == 404
        assert fetch(web.url + "campaign/sft_drift/saga.png")[0] == 404  # not drawn yet
        assert b"event: update" in _first_event(web.url + "events?page=campaign&run=sft_drift")
    finally:
        web.stop()


def _first_event(url: str) -> bytes:
    import urllib.request

    with urllib.request.urlopen(url, timeout=30) as r:
        return r.readline() + r.readline()
