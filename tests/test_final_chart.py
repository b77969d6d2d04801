"""The FINAL verdict's chart is the one its verdict row names (`chart_path`, saved by the daemon with the
verdict): the web page, the bot's /babysit chart and `babysit verdict` each read it there
(`reading.final_chart`), none rebuilds `<state>/verdicts/<run>.png` from the run's name. A chart drawn
elsewhere (a daemon whose state directory moved, a filesystem the fleet's boxes share) is found by all
three; a stale PNG at the usual place is shown by none."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from babysit.db.store import Store
from babysit.runtime import registry
from babysit.web.data import Site
from bot.reads import chart_file
from tests.web.workspace import RUN, build

PNG = b"\x89PNG\r\n\x1a\n"


def surfaces(root: Path, reg_path: Path) -> dict[str, object]:
    reg = registry.load(reg_path)
    store = Store.in_dir(root / ".babysit")
    try:
        bot_path, bot_verdict = chart_file(reg, reg.get(RUN), store)
    finally:
        store.close()
    cli = subprocess.run([sys.executable, "-m", "babysit", "verdict", RUN, "--registry", str(reg_path)],
                         capture_output=True, text=True, timeout=120)
    assert cli.returncode == 0, cli.stderr
    said = [line for line in cli.stdout.splitlines() if line.startswith("chart: ")]
    return {"web": Site(reg_path).chart_png(RUN), "bot": (bot_path, bot_verdict["status"]), "cli": said}


def test_every_surface_shows_the_chart_its_verdict_row_names(tmp_path: Path) -> None:
    drawn = tmp_path / "shared" / f"{RUN}.png"  # where the daemon that read it drew it
    reg_path = build(tmp_path, final=True, chart=drawn)
    drawn.parent.mkdir()
    drawn.write_bytes(PNG + b"the one of record")
    stale = tmp_path / ".babysit" / "verdicts" / f"{RUN}.png"  # the usual place holds another PNG
    stale.parent.mkdir(parents=True, exist_ok=True)
    stale.write_bytes(PNG + b"stale")
    assert surfaces(tmp_path, reg_path) == {
        "web": drawn, "bot": (drawn, "FINAL"), "cli": [f"chart: {drawn} (the FINAL verdict's, as the daemon drew it)"]}


def test_a_chart_drawn_where_the_daemon_draws_it_is_shown_there(tmp_path: Path) -> None:
    reg_path = build(tmp_path, final=True)
    drawn = tmp_path / ".babysit" / "verdicts" / f"{RUN}.png"
    assert Site(reg_path).chart_png(RUN) is None  # not drawn (yet): no chart, never a 500
    drawn.parent.mkdir(parents=True, exist_ok=True)
    drawn.write_bytes(PNG)
    got = surfaces(tmp_path, reg_path)
    assert got["web"] == drawn and got["bot"] == (drawn, "FINAL")
