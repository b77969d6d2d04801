"""The HTTP transport for `babysit bot --http PORT`: a threading http.server in front of `App.dispatch`.

Bolt does the rest — signature check against SLACK_SIGNING_SECRET, the 5-minute replay window (401
for either, before any listener runs), acks and lazy work. Only `/slack/events` is served; slash
commands and interactivity (the abort button) both post there. Put TLS in front of it (a reverse
proxy): Slack only calls https URLs.
"""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

EVENTS_PATH = "/slack/events"
MAX_BODY = 1 << 20


def make_server(app: Any, host: str, port: int) -> ThreadingHTTPServer:
    from slack_bolt.request import BoltRequest

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            return None  # request lines carry no secrets, but neither do they help: Bolt logs failures

        def do_POST(self) -> None:
            url = urlsplit(self.path)
            length = int(self.headers.get("Content-Length") or 0)
            if url.path != EVENTS_PATH or length > MAX_BODY:
                self._send(404 if url.path != EVENTS_PATH else 413, b"", {})
                return
            body = self.rfile.read(length).decode("utf-8")
            if not (self.headers.get("X-Slack-Request-Timestamp") or "0").strip().isdigit():
                self._send(401, b"", {})  # Bolt's verifier raises on a non-numeric timestamp: a 500, not a 401
                return
            headers = {k.lower(): [v] for k, v in self.headers.items()}
            response = app.dispatch(BoltRequest(body=body, query=parse_qs(url.query), headers=headers))
            self._send(response.status, (response.body or "").encode("utf-8"), response.headers)

        def _send(self, status: int, data: bytes, headers: dict[str, Any]) -> None:
            self.send_response(status)
            for key, values in headers.items():
                if key.lower() == "content-length":
                    continue
                for value in values if isinstance(values, (list, tuple)) else [values]:
                    self.send_header(key, value)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    server = ThreadingHTTPServer((host, port), Handler)
    server.daemon_threads = True
    return server


def serve_in_thread(server: ThreadingHTTPServer) -> threading.Thread:
    thread = threading.Thread(target=server.serve_forever, name="babysit-bot-http", daemon=True)
    thread.start()
    return thread
