"""The server over real HTTP on 127.0.0.1: pages, headers, read-only, the token, the event stream."""

from __future__ import annotations

import http.client
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import quote, urlparse

import pytest
from prometheus_client.parser import text_string_to_metric_families

from babysit.core.errors import EXIT_BAD_INPUT, BadInput
from babysit.db.store import Store
from babysit.web.server import Settings, WebServer, settings_for, sse
from tests.web.conftest import fetch
from tests.web.workspace import HOSTILE, RUN

TOKEN = "s3cret-token-0123456789"


def test_the_runs_page_is_served_with_a_strict_content_security_policy(server: WebServer) -> None:
    status, headers, body = fetch(server.url)
    assert status == 200 and headers["Content-Type"].startswith("text/html")
    assert "script-src 'self'" in headers["Content-Security-Policy"] and "default-src 'none'" in \
        headers["Content-Security-Policy"]
    assert headers["X-Content-Type-Options"] == "nosniff"
    assert b'data-run="drift_web"' in body and b"<script>window" not in body


@pytest.mark.parametrize("method", ["POST", "PUT", "DELETE", "PATCH"])
def test_nothing_but_get_and_head_is_answered(server: WebServer, method: str) -> None:
    for path in ("", "metrics", f"run/{RUN}", "events"):
        status, headers, _ = fetch(server.url + path, method=method)
        assert status == 405 and headers["Allow"] == "GET,HEAD"


def test_a_run_page_a_hostile_name_and_an_unknown_run(server: WebServer) -> None:
    assert fetch(server.url + f"run/{RUN}")[0] == 200
    status, _, body = fetch(server.url + "run/%3Cscript%3Ewindow.pwned%3D1%3C%2Fscript%3E%3Cimg%20src%3Dx%20onerror"
                                         "%3D%22window.pwned%3D2%22%3E")
    assert status == 200 and b"&lt;script&gt;window.pwned=1" in body and b"<script>window" not in body
    assert fetch(server.url + "run/nosuch")[0] == 404


def test_the_final_chart_png_is_served_only_when_the_daemon_drew_it(server: WebServer, site_root: Path) -> None:
    assert fetch(server.url + f"run/{RUN}/verdict.png")[0] == 404
    (site_root / ".babysit" / "verdicts").mkdir()
    (site_root / ".babysit" / "verdicts" / f"{RUN}.png").write_bytes(b"\x89PNG\r\n\x1a\nfake")
    status, headers, body = fetch(server.url + f"run/{RUN}/verdict.png")
    assert status == 200 and headers["Content-Type"] == "image/png" and body.startswith(b"\x89PNG")
    assert fetch(server.url + f"run/{quote(HOSTILE, safe='')}/verdict.png")[0] == 404  # no FINAL verdict


def test_static_files_are_a_fixed_list(server: WebServer) -> None:
    assert fetch(server.url + "static/app.js")[0] == 200
    assert fetch(server.url + "static/..%2F__init__.py")[0] == 404
    assert fetch(server.url + "static/data.py")[0] == 404


def test_a_page_asked_for_another_host_name_is_refused(server: WebServer) -> None:
    """DNS rebinding: a web page of evil.example resolving to 127.0.0.1 reads nothing."""
    assert fetch(server.url, headers={"Host": "evil.example"})[0] == 403
    assert fetch(server.url, headers={"Host": f"localhost:{urlparse(server.url).port}"})[0] == 200


def test_metrics_parse_and_move_when_the_store_changes(server: WebServer, site_root: Path) -> None:
    def incidents() -> float:
        status, headers, body = fetch(server.url + "metrics")
        assert status == 200 and headers["Content-Type"].startswith("text/plain; version=0.0.4")
        fams = {f.name: f for f in text_string_to_metric_families(body.decode())}
        return sum(s.value for s in fams["babysit_run_incidents"].samples if s.labels["run"] == RUN)

    before = incidents()
    store = Store.in_dir(site_root / ".babysit")
    store.add_incident(RUN, 2, time.time(), "stalled", {})
    store.close()
    assert incidents() == before + 1


def read_events(url: str, want: int, timeout: float = 60) -> list[str]:
    """The data of the first `want` server-sent events of `url`."""
    u = urlparse(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=timeout)
    conn.request("GET", u.path + ("?" + u.query if u.query else ""))
    response = conn.getresponse()
    assert response.status == 200 and response.getheader("Content-Type") == "text/event-stream"
    events, data = [], []
    while len(events) < want:
        line = response.fp.readline().decode()
        if line.startswith("data: "):
            data.append(line[6:].rstrip("\n"))
        elif line == "\n" and data:
            events.append("\n".join(data))
            data = []
    conn.close()
    return events


def test_the_event_stream_sends_the_table_again_when_it_changes(server: WebServer) -> None:
    first, second = read_events(server.url + "events?page=runs", 2)
    assert 'data-run="drift_web"' in first and 'data-run="drift_web"' in second
    assert first != second  # the "as of" time moved at least: the page is re-read every refresh


def test_sse_data_lines_cannot_end_the_event_early() -> None:
    assert sse("update", "a\n\nb\r\nc") == b"event: update\ndata: a\ndata: \ndata: b\ndata: c\n\n"


def test_a_token_guards_every_page_and_is_compared_whole(site_root: Path) -> None:
    web = WebServer(site_root / "babysit.toml", Settings(port=0, token=TOKEN)).start()
    try:
        assert fetch(web.url)[0] == 401
        assert fetch(web.url + "metrics", {"Authorization": "Bearer " + TOKEN[:-1]})[0] == 401
        assert fetch(web.url + "metrics", {"Authorization": "Bearer " + TOKEN + "x"})[0] == 401
        assert fetch(web.url + "metrics", {"Authorization": "Bearer " + TOKEN})[0] == 200
        u = urlparse(web.url)
        conn = http.client.HTTPConnection(u.hostname, u.port, timeout=30)
        conn.request("GET", f"/run/{RUN}?token={TOKEN}")
        response = conn.getresponse()
        assert response.status == 303 and response.getheader("Location") == f"/run/{RUN}"  # the token leaves the URL
        cookie = response.getheader("Set-Cookie")
        assert "HttpOnly" in cookie and "SameSite=Strict" in cookie
        conn.close()
        assert fetch(web.url, {"Cookie": cookie.split(";")[0]})[0] == 200
        assert fetch(web.url + "?token=wrong")[0] == 401
    finally:
        web.stop()


def test_a_bind_beyond_loopback_needs_a_token() -> None:
    with pytest.raises(BadInput, match="BABYSIT_WEB_TOKEN"):
        settings_for("0.0.0.0", 8765, environ={})
    with pytest.raises(BadInput, match="at least 16 characters"):
        settings_for("0.0.0.0", 8765, environ={"BABYSIT_WEB_TOKEN": "short"})
    assert settings_for("0.0.0.0", 8765, environ={"BABYSIT_WEB_TOKEN": TOKEN}).token == TOKEN
    assert settings_for("127.0.0.1", 8765, environ={}).token is None
    with pytest.raises(BadInput, match="--port"):
        settings_for("127.0.0.1", 70000, environ={})


def test_babysit_web_refuses_another_bind_without_the_token_exit_2(site_root: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "BABYSIT_WEB_TOKEN"}
    res = subprocess.run([sys.executable, "-m", "babysit", "web", "--bind", "127.0.0.2", "--registry",
                          str(site_root / "babysit.toml")], env=env, capture_output=True, text=True, timeout=60)
    assert res.returncode == EXIT_BAD_INPUT
    assert "ERROR: --bind 127.0.0.2" in res.stderr and "HINT: export BABYSIT_WEB_TOKEN" in res.stderr


def test_babysit_web_serves_another_bind_with_the_token(site_root: Path) -> None:
    proc = subprocess.Popen([sys.executable, "-m", "babysit", "web", "--bind", "127.0.0.2", "--port", "0",
                             "--registry", str(site_root / "babysit.toml")],
                            env={**os.environ, "BABYSIT_WEB_TOKEN": TOKEN}, stdout=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert "token required" in line
        url = line.split("serving ", 1)[1].split(" ", 1)[0]
        assert url.startswith("http://127.0.0.2:")
        assert fetch(url)[0] == 401
        assert fetch(url, {"Authorization": "Bearer " + TOKEN})[0] == 200
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_a_port_in_use_is_bad_input_naming_it(site_root: Path) -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        res = subprocess.run([sys.executable, "-m", "babysit", "web", "--port", str(port), "--registry",
                              str(site_root / "babysit.toml")], capture_output=True, text=True, timeout=60)
    assert res.returncode == EXIT_BAD_INPUT and f"--port {port}: cannot listen" in res.stderr
