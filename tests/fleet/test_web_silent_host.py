"""The web page while the fleet's PostgreSQL host is silent (its packets dropped, not refused: a blackholed
host, a firewall that drops): a real listener on 127.0.0.1 that takes the TCP connection and never says a
word stands in for it. The page serves the box's mirror under its degraded banner after the reader's 2-s
connect timeout, not the daemon's 10 s, and the web server's threads share what one found: while the
outage is remembered none of them tries the host, and after it one thread at a time does while the others
serve the mirror at once (babysit/view/readstore.py, docs/web.md)."""

from __future__ import annotations

import socket
import threading
import time
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from babysit.db.postgres import PostgresStore
from babysit.web.data import MIRROR_RETRY_S
from babysit.web.server import Settings, WebServer
from tests.fleet.helpers import outage_spec

BANNER = "the database cannot be reached"
PAGE_TIMEOUT_S = 6  # the reader's connect timeout is 2 s; before, a page waited the daemon's 10 s


class SilentHost:
    """A TCP server that accepts every connection and never answers (nor closes it): what libpq meets at a
    host whose packets vanish, once past the handshake. Counts the connections it was offered."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0), backlog=64)
        self.port = self.sock.getsockname()[1]
        self.accepted: list[socket.socket] = []
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted.append(conn)

    def close(self) -> None:
        self.sock.close()
        for conn in self.accepted:
            conn.close()


@pytest.fixture
def silent() -> Iterator[SilentHost]:
    host = SilentHost()
    yield host
    host.close()


def _page(url: str) -> str:
    with urllib.request.urlopen(url, timeout=PAGE_TIMEOUT_S) as r:  # a page held past it: the test fails
        assert r.status == 200
        return r.read().decode()


def test_a_silent_postgres_host_gives_the_mirror_in_seconds_one_thread_trying_it_at_a_time(
        tmp_path: Path, pg_url: str, silent: SilentHost, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("BABYSIT_STORE_URL", "BABYSIT_HOST"):
        monkeypatch.delenv(name, raising=False)
    box = tmp_path / "box-a"
    box.mkdir()
    outage_spec(box, "r1", ["python", "train.py"])
    entry = '[[runs]]\nname = "r1"\nspec = "r1.toml"\nregistered_at = "2026-01-01T00:00:00Z"\n'
    daemon = PostgresStore(pg_url, host="box-a", state_dir=box / ".babysit", may_start_down=True)
    daemon.claim_run("r1", 1.0)
    daemon.start_journal()  # what `babysit up` does with the database up: the box's mirror
    daemon.set_run_state("r1", "running", time.time(), step=7)
    daemon.close()
    # the fleet's host goes silent: the box's url now reaches a listener that never speaks
    (box / "babysit.toml").write_text(f'[store]\nurl = "postgresql://box@127.0.0.1:{silent.port}/babysit"\n'
                                      f'[host]\nname = "box-a"\n\n{entry}')
    web = WebServer(box / "babysit.toml", Settings(port=0, workers=4)).start()
    try:
        page = _page(web.url)  # the threads that read first tried the host: 2 s, then the mirror
        assert BANNER in page and 'data-run="r1"' in page
        tries = len(silent.accepted)
        assert tries >= 1
        with ThreadPoolExecutor(8) as pool:  # every worker thread, the outage remembered: none tries it
            pages = list(pool.map(lambda _: _page(web.url), range(8)))
        assert all(BANNER in p and 'data-run="r1"' in p for p in pages)
        assert len(silent.accepted) == tries
        time.sleep(MIRROR_RETRY_S + 0.2)  # the outage is old enough to try the host again
        with ThreadPoolExecutor(8) as pool:
            pages = list(pool.map(lambda _: _page(web.url), range(8)))
        assert all(BANNER in p for p in pages)
        assert len(silent.accepted) == tries + 1  # one thread tried it; the others served the mirror
    finally:
        web.stop()
