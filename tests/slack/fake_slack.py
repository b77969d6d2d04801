"""A local stand-in for Slack's Web API: a real HTTP server on 127.0.0.1, an ephemeral port, a thread.

It speaks what babysit uses — auth.test, chat.postMessage/update/postEphemeral, conversations.history
/replies (with message metadata), conversations.info/join over the channels a test declares (with the
bot's membership: a post to a declared channel the bot is not in is `not_in_channel`), the granted
scopes in every answer's `x-oauth-scopes` header and `missing_scope` for a method they do not cover, the three-step file upload (each completion recorded as a post of
the file in `shares`), files.info, apps.connections.open (the URL of a tests/slack/fake_socket.py
server, under the app-level token), and response_url posts — records every
request with its parsed body, and injects faults on demand: 5xx for the next N calls or for T seconds,
429 with Retry-After, slow answers, and connection resets before or AFTER the call took effect (the
case that makes a naive retry post twice).
"""

from __future__ import annotations

import itertools
import json
import socket
import struct
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs

# the manifest's bot scopes (docs/slack.md) and the two `babysit slack check` may use
ALL_SCOPES = ("chat:write", "files:write", "files:read", "commands", "channels:history", "groups:history",
              "channels:read", "channels:join")
NEEDS = {"chat.postMessage": "chat:write", "chat.update": "chat:write", "conversations.info": "channels:read",
         "conversations.join": "channels:join", "conversations.history": "channels:history",
         "files.getUploadURLExternal": "files:write", "files.info": "files:read"}


@dataclass
class Call:
    path: str
    method: str  # the Web API method ("chat.postMessage"), or "upload" / "response"
    body: dict[str, Any]
    raw: bytes
    headers: dict[str, str]
    outcome: str = "ok"  # ok | 503 | 429 | reset | reset-after | slow


@dataclass
class Faults:
    fail_next: int = 0
    fail_until: float = 0.0
    fail_status: int = 503
    limit_next: int = 0
    retry_after: float = 1.0
    slow_next: int = 0
    slow_seconds: float = 0.0
    reset_next: int = 0
    reset_after_next: int = 0
    only: frozenset[str] = field(default_factory=frozenset)  # restrict faults to these methods (empty: all)


class FakeSlack:
    def __init__(self, token: str = "xoxb-test-token", app_token: str = "xapp-test-token") -> None:
        self.token = token
        self.app_token = app_token  # apps.connections.open answers to this one only, as Slack does
        self.socket_mode: Any = None  # a started FakeSocketMode; None: apps.connections.open fails
        self.shares: list[dict[str, Any]] = []  # each files.completeUploadExternal into a channel or thread
        self.file_ids: set[str] = set()  # every id files.getUploadURLExternal handed out
        self.calls: list[Call] = []
        self.messages: list[dict[str, Any]] = []  # every accepted post, with channel, ts, thread_ts, metadata
        self.uploads: dict[str, bytes] = {}
        self.faults = Faults()
        self.scopes: list[str] = list(ALL_SCOPES)  # what the token was granted (x-oauth-scopes)
        self.channels: dict[str, dict[str, Any]] = {}  # declared by a test: id -> name, is_private, is_member, …
        self.lock = threading.RLock()
        self._ts = itertools.count(1)
        self._files = itertools.count(1)
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    # -- lifecycle ---------------------------------------------------------------------------------------
    @property
    def port(self) -> int:
        return self.server.server_address[1]

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def api_url(self) -> str:
        return f"{self.base}/api/"

    def start(self) -> FakeSlack:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    # -- fault switches ----------------------------------------------------------------------------------
    def fail(self, n: int = 0, *, seconds: float = 0.0, status: int = 503, only: set[str] | None = None) -> None:
        with self.lock:
            self.faults.fail_next, self.faults.fail_status = n, status
            self.faults.fail_until = time.time() + seconds if seconds else 0.0
            self.faults.only = frozenset(only or ())

    def rate_limit(self, n: int, retry_after: float) -> None:
        with self.lock:
            self.faults.limit_next, self.faults.retry_after = n, retry_after

    def slow(self, n: int, seconds: float) -> None:
        with self.lock:
            self.faults.slow_next, self.faults.slow_seconds = n, seconds

    def reset(self, n: int = 1, *, after_handling: bool = False, only: set[str] | None = None) -> None:
        with self.lock:
            if after_handling:
                self.faults.reset_after_next = n
            else:
                self.faults.reset_next = n
            self.faults.only = frozenset(only or ())

    # -- what happened -----------------------------------------------------------------------------------
    def calls_to(self, method: str, outcome: str | None = "ok") -> list[Call]:
        with self.lock:
            return [c for c in self.calls if c.method == method and (outcome is None or c.outcome == outcome)]

    def posts(self) -> list[dict[str, Any]]:
        with self.lock:
            return list(self.messages)

    def wait_calls(self, method: str, n: int = 1, timeout: float = 10.0) -> list[Call]:
        """The calls to `method` once there are `n` of them; on a timeout, every call this fake got."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            calls = self.calls_to(method)
            if len(calls) >= n:
                return calls
            time.sleep(0.02)
        raise AssertionError(f"expected {n} {method} call(s) within {timeout}s, got {len(self.calls_to(method))}: "
                             f"{[c.method for c in self.calls]}")

    # -- the API -----------------------------------------------------------------------------------------
    def answer(self, method: str, body: dict[str, Any], auth: str | None) -> dict[str, Any]:
        expected = self.app_token if method == "apps.connections.open" else self.token
        if method not in ("response", "upload") and auth != f"Bearer {expected}":
            return {"ok": False, "error": "invalid_auth"}
        handler = getattr(self, "_" + method.replace(".", "_"), None)
        if handler is None:
            return {"ok": False, "error": "unknown_method"}
        needed = NEEDS.get(method)
        if needed is not None and needed not in self.scopes:
            return {"ok": False, "error": "missing_scope", "needed": needed, "provided": ",".join(self.scopes)}
        return handler(body)

    def _auth_test(self, body: dict[str, Any]) -> dict[str, Any]:
        return {"ok": True, "url": "https://fake.slack/", "team": "fake", "user": "babysit", "team_id": "T0001",
                "user_id": "UBOT0001", "bot_id": "BBOT0001"}

    def _conversations_info(self, body: dict[str, Any]) -> dict[str, Any]:
        found = self.channels.get(str(body.get("channel")))
        if found is None:
            return {"ok": False, "error": "channel_not_found"}
        if found.get("is_private") and not found.get("is_member"):
            return {"ok": False, "error": "channel_not_found"}  # Slack hides a private channel from outsiders
        return {"ok": True, "channel": {"id": body.get("channel"), "is_channel": True, "is_archived": False,
                                        **found}}

    def _conversations_join(self, body: dict[str, Any]) -> dict[str, Any]:
        found = self.channels.get(str(body.get("channel")))
        if found is None or found.get("is_private"):
            return {"ok": False, "error": "channel_not_found" if found is None else "method_not_supported_for_channel_type"}
        found["is_member"] = True
        return {"ok": True, "channel": {"id": body.get("channel"), **found}}

    def _chat_postMessage(self, body: dict[str, Any]) -> dict[str, Any]:
        channel = str(body.get("channel") or "")
        if channel in ("", "C-MISSING", "#missing"):
            return {"ok": False, "error": "channel_not_found"}
        declared = self.channels.get(channel)
        if declared is not None and not declared.get("is_member"):
            return {"ok": False, "error": "not_in_channel"}
        cid = channel if channel.startswith("C") else "C" + channel.lstrip("#").upper().replace("-", "")
        ts = f"{int(time.time())}.{next(self._ts):06d}"
        metadata = body.get("metadata")
        if isinstance(metadata, str):
            metadata = json.loads(metadata)
        message = {"channel": cid, "ts": ts, "text": body.get("text"), "blocks": body.get("blocks"),
                   "thread_ts": body.get("thread_ts"), "metadata": metadata}
        self.messages.append(message)
        return {"ok": True, "channel": cid, "ts": ts, "message": {"ts": ts, "text": body.get("text")}}

    def _chat_update(self, body: dict[str, Any]) -> dict[str, Any]:
        return {"ok": True, "channel": body.get("channel"), "ts": body.get("ts"), "text": body.get("text")}

    def _chat_postEphemeral(self, body: dict[str, Any]) -> dict[str, Any]:
        return {"ok": True, "message_ts": f"{int(time.time())}.{next(self._ts):06d}"}

    def _conversations_history(self, body: dict[str, Any]) -> dict[str, Any]:
        if not str(body.get("channel", "")).startswith("C"):
            return {"ok": False, "error": "channel_not_found"}  # like Slack: an ID, never a "#name"
        oldest = float(body.get("oldest") or 0)
        found = [m for m in self.messages if m["channel"] == body.get("channel") and float(m["ts"]) >= oldest
                 and m["thread_ts"] in (None, m["ts"])]
        return {"ok": True, "messages": list(reversed(found)), "has_more": False}

    def _conversations_replies(self, body: dict[str, Any]) -> dict[str, Any]:
        oldest = float(body.get("oldest") or 0)
        found = [m for m in self.messages if m["channel"] == body.get("channel") and float(m["ts"]) >= oldest
                 and (m["thread_ts"] == body.get("ts") or m["ts"] == body.get("ts"))]
        return {"ok": True, "messages": found, "has_more": False}

    def _files_getUploadURLExternal(self, body: dict[str, Any]) -> dict[str, Any]:
        file_id = f"F{next(self._files):05d}"
        self.file_ids.add(file_id)
        return {"ok": True, "upload_url": f"{self.base}/upload/{file_id}", "file_id": file_id}

    def _files_completeUploadExternal(self, body: dict[str, Any]) -> dict[str, Any]:
        files = json.loads(body.get("files") or "[]")
        channel = body.get("channel_id") or body.get("channels")
        for f in files:  # every completion is one more post of the file: calling it twice shows twice
            if channel:
                self.shares.append({"file": f["id"], "channel": channel, "thread_ts": body.get("thread_ts"),
                                    "comment": body.get("initial_comment"), "title": f.get("title"),
                                    "ts": f"{int(time.time())}.{next(self._ts):06d}"})
        return {"ok": True, "files": [{"id": f["id"], "title": f.get("title")} for f in files]}

    def _files_info(self, body: dict[str, Any]) -> dict[str, Any]:
        """Where a file is shared, in Slack's shape: shares.public[channel] = [{ts, thread_ts}]."""
        file_id = body.get("file")
        if file_id not in self.file_ids:
            return {"ok": False, "error": "file_not_found"}
        public: dict[str, list[dict[str, Any]]] = {}
        for s in self.shares:
            if s["file"] == file_id:
                public.setdefault(s["channel"], []).append({"ts": s["ts"], "thread_ts": s["thread_ts"]})
        return {"ok": True, "file": {"id": file_id, "channels": sorted(public), "shares": {"public": public}}}

    def _apps_connections_open(self, body: dict[str, Any]) -> dict[str, Any]:
        if self.socket_mode is None:
            return {"ok": False, "error": "internal_error"}
        return {"ok": True, "url": self.socket_mode.open_url()}


def _parse(raw: bytes, content_type: str) -> dict[str, Any]:
    if "json" in content_type:
        try:
            return json.loads(raw or b"{}")
        except ValueError:
            return {}
    if "x-www-form-urlencoded" in content_type:
        try:
            raw.decode("utf-8")
        except UnicodeDecodeError:
            return {}  # the upload step posts raw file bytes under a form content type
        return {k: v[0] if len(v) == 1 else v for k, v in parse_qs(raw.decode("utf-8")).items()}
    return {}


def _handler(fake: FakeSlack) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: Any) -> None:
            return None

        def finish(self) -> None:
            try:
                super().finish()
            except (OSError, ValueError):
                pass  # the socket was reset on purpose

        def do_GET(self) -> None:
            self.do_POST()

        def do_POST(self) -> None:
            raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            path = self.path.split("?")[0]
            if path.startswith("/api/"):
                method = path[len("/api/"):]
            elif path.startswith("/upload/"):
                method = "upload"
            else:
                method = "response"
            body = _parse(raw, self.headers.get("Content-Type", ""))
            call = Call(path, method, body, raw, {k.lower(): v for k, v in self.headers.items()})
            with fake.lock:
                fake.calls.append(call)
                fault = self._fault(method)
                call.outcome = fault or "ok"
                if fault == "slow":
                    delay = fake.faults.slow_seconds
            if fault == "slow":
                time.sleep(delay)
                call.outcome = "ok"
            if fault == "reset":
                return self._reset()
            if fault == "503":
                return self._send(fake.faults.fail_status, {"ok": False, "error": "service_unavailable"})
            if fault == "429":
                return self._send(429, {"ok": False, "error": "ratelimited"},
                                  {"Retry-After": f"{fake.faults.retry_after:g}"})
            with fake.lock:
                if method == "upload":
                    fake.uploads[path.rsplit("/", 1)[-1]] = raw
                    result: Any = "OK - uploaded"
                elif method == "response":
                    result = "ok"
                else:
                    result = fake.answer(method, body, self.headers.get("Authorization"))
                scopes = {"x-oauth-scopes": ",".join(fake.scopes)} if path.startswith("/api/") else {}
            if fault == "reset-after":
                return self._reset()
            self._send(200, result, scopes)

        def _fault(self, method: str) -> str | None:
            f = fake.faults
            if f.only and method not in f.only:
                return None
            if method == "response":
                return None
            if f.reset_next:
                f.reset_next -= 1
                return "reset"
            if f.fail_next or time.time() < f.fail_until:
                f.fail_next = max(0, f.fail_next - 1)
                return "503"
            if f.limit_next:
                f.limit_next -= 1
                return "429"
            if f.slow_next:
                f.slow_next -= 1
                return "slow"
            if f.reset_after_next:
                f.reset_after_next -= 1
                return "reset-after"
            return None

        def _send(self, status: int, body: Any, headers: dict[str, str] | None = None) -> None:
            data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "text/plain" if isinstance(body, str) else "application/json")
            self.send_header("Content-Length", str(len(data)))
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            self.end_headers()
            try:
                self.wfile.write(data)
            except OSError:
                self.close_connection = True  # the client gave up (a timeout test): nothing to answer

        def _reset(self) -> None:
            """Close with RST: the client sees `connection reset`, not a clean empty answer."""
            self.close_connection = True
            try:
                self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                self.connection.close()
            except OSError:
                pass

    return Handler
