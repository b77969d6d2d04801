"""A local stand-in for Slack's Socket Mode side: a real websocket server (the `websockets` library) on
127.0.0.1, in its own thread and event loop, that talks to the real slack_sdk / slack_bolt clients.

What it does the way Slack does (api.slack.com/apis/connections/socket-implement, and the envelopes
slack_sdk's own tests replay):

* `apps.connections.open` (tests/slack/fake_slack.py) hands out `ws://127.0.0.1:PORT/link/?ticket=…`;
  a ticket opens one connection, an unknown or used one is refused at the handshake (401).
* Every connection starts with `hello` (num_connections, debug_info, connection_info.app_id).
* Envelopes: `slash_commands` (accepts_response_payload true), `interactive`, `events_api` (with
  retry_attempt / retry_reason), each with a fresh `envelope_id`, sent on the newest live connection —
  or, with `delivery="random"`, on any live connection drawn at random, as Slack does with several
  ("each payload may be sent to any of the connections": its Socket Mode docs; `seed` fixes the draw).
* The app acks with `{"envelope_id": …, "payload"?: …}` on any of its connections. An envelope not
  acked within `ack_timeout_s` (Slack: 3 s) is sent again, up to `max_retries` times. Slack retries
  Events API envelopes; for a slash command or a click it shows the user a timeout instead — the
  fake re-sends every type, which is stricter: a late ack shows up as a second delivery.
* `disconnect(reason)` sends `{"type": "disconnect", "reason": …}` (`refresh_requested`, `warning`,
  `link_disabled`), sends nothing more on that connection and closes it `close_after_s` later;
  `drop()` cuts the TCP connection without a close frame, with a FIN or (`reset=True`) an RST.
* `lose_next_ack()`: the next ack is lost in flight and its connection reset, so the envelope is
  re-sent on the app's next connection: the case that duplicates a command in a naive bot.

Everything is recorded (connections, deliveries, acks) for the tests to assert on.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import random
import socket
import struct
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, urlsplit

HOST = "applink-fake-1"


@dataclass
class Link:
    """One websocket connection of the app."""

    number: int
    ticket: str
    opened_at: float
    ws: Any = field(repr=False, default=None)
    draining: bool = False  # a disconnect was sent: nothing more is delivered on it
    closed: bool = False


@dataclass
class Delivery:
    envelope_id: str
    kind: str
    attempt: int  # 0 for the first send
    link: int


@dataclass
class Ack:
    envelope_id: str
    payload: dict[str, Any] | None
    link: int
    late: bool  # after its envelope's ack timeout


@dataclass
class Envelope:
    envelope_id: str
    kind: str
    payload: dict[str, Any]
    attempts: int = 0
    sent_at: float = 0.0
    acked: asyncio.Event = field(default_factory=asyncio.Event)

    def frame(self) -> dict[str, Any]:
        out: dict[str, Any] = {"envelope_id": self.envelope_id, "payload": self.payload, "type": self.kind,
                               "accepts_response_payload": self.kind == "slash_commands"}
        if self.kind == "events_api":
            out["retry_attempt"] = self.attempts
            out["retry_reason"] = "timeout" if self.attempts else ""
        return out


class FakeSocketMode:
    def __init__(self, *, ack_timeout_s: float = 3.0, max_retries: int = 3, close_after_s: float = 0.5,
                 app_id: str = "A0BABYSIT", delivery: str = "newest", seed: int | None = None) -> None:
        assert delivery in ("newest", "random"), delivery
        self.delivery = delivery
        self._random = random.Random(seed)
        self.ack_timeout_s = ack_timeout_s
        self.max_retries = max_retries
        self.close_after_s = close_after_s
        self.app_id = app_id
        self.links: list[Link] = []
        self.deliveries: list[Delivery] = []
        self.acks: list[Ack] = []
        self.refused: list[str] = []  # tickets refused at the handshake
        self.lock = threading.RLock()
        self._tickets: set[str] = set()
        self._numbers = itertools.count(1)
        self._envelopes: dict[str, Envelope] = {}
        self._lose_acks = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="fake-socket-mode", daemon=True)
        self._server: Any = None
        self._live = asyncio.Event()  # set while a non-draining link is open (touched on the loop only)

    # -- lifecycle ---------------------------------------------------------------------------------------
    def start(self) -> FakeSocketMode:
        self._thread.start()
        self._server = self._call(self._serve())
        return self

    def stop(self) -> None:
        """Close every connection and the listening socket: the app's reconnects are refused from now on."""
        if self._server is None:
            return
        self._call(self._shutdown())
        self._server = None
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)

    @property
    def port(self) -> int:
        return self._port

    def open_url(self) -> str:
        """A fresh one-use URL, as apps.connections.open returns it."""
        ticket = uuid.uuid4().hex
        with self.lock:
            self._tickets.add(ticket)
        return f"ws://127.0.0.1:{self._port}/link/?ticket={ticket}&app_id={self.app_id}"

    # -- what Slack sends --------------------------------------------------------------------------------
    def slash_command(self, command: str, text: str, *, user: str, channel: str, response_url: str,
                      trigger_id: str | None = None) -> str:
        return self.send("slash_commands", {
            "token": "legacy", "team_id": "T0001", "team_domain": "fake", "channel_id": channel,
            "channel_name": "runs", "user_id": user, "user_name": user.lower(), "command": command, "text": text,
            "api_app_id": self.app_id, "is_enterprise_install": "false", "response_url": response_url,
            "trigger_id": trigger_id or f"{time.time():.0f}.{uuid.uuid4().hex[:8]}"})

    def block_action(self, action_id: str, value: str, *, user: str, channel: str, response_url: str) -> str:
        """A click on a button of ours, as the `interactive` envelope of a block_actions payload."""
        return self.send("interactive", {
            "type": "block_actions", "user": {"id": user, "username": user.lower(), "team_id": "T0001"},
            "api_app_id": self.app_id, "token": "legacy", "team": {"id": "T0001", "domain": "fake"},
            "container": {"type": "message", "channel_id": channel, "is_ephemeral": True},
            "trigger_id": f"{time.time():.0f}.{uuid.uuid4().hex[:8]}", "channel": {"id": channel, "name": "runs"},
            "response_url": response_url,
            "actions": [{"type": "button", "action_id": action_id, "block_id": "b", "value": value,
                         "action_ts": f"{time.time():.6f}"}]})

    def event(self, event: dict[str, Any]) -> str:
        return self.send("events_api", {
            "token": "legacy", "team_id": "T0001", "api_app_id": self.app_id, "event": event,
            "type": "event_callback", "event_id": f"Ev{uuid.uuid4().hex[:10].upper()}", "event_time": int(time.time())})

    def send(self, kind: str, payload: dict[str, Any]) -> str:
        envelope_id = str(uuid.uuid4())
        self._loop.call_soon_threadsafe(self._deliver_soon, envelope_id, kind, payload)
        return envelope_id

    def disconnect(self, reason: str = "refresh_requested") -> None:
        """Ask the app to reconnect, as Slack does before it recycles a connection."""
        self._call(self._disconnect(reason))

    def drop(self, *, reset: bool = False) -> None:
        """Cut every live connection at the TCP level, no close frame: a FIN (a proxy or a server gone),
        or with `reset` an RST (a network or a load balancer that forgot the connection)."""
        self._call(self._drop(reset))

    def lose_next_ack(self) -> None:
        with self.lock:
            self._lose_acks += 1

    # -- what happened -----------------------------------------------------------------------------------
    def deliveries_of(self, envelope_id: str) -> list[Delivery]:
        with self.lock:
            return [d for d in self.deliveries if d.envelope_id == envelope_id]

    def acks_of(self, envelope_id: str) -> list[Ack]:
        with self.lock:
            return [a for a in self.acks if a.envelope_id == envelope_id]

    def open_links(self) -> list[Link]:
        with self.lock:
            return [link for link in self.links if not link.closed]

    def wait_ack(self, envelope_id: str, timeout: float = 10.0) -> Ack:
        self._wait(lambda: bool(self.acks_of(envelope_id)), timeout, f"an ack of {envelope_id}")
        return self.acks_of(envelope_id)[0]

    def wait_links(self, n: int, timeout: float = 10.0) -> Link:
        """Wait until the app has opened its nth connection (and it is still open); return it."""
        self._wait(lambda: len(self.links) >= n and not self.links[n - 1].closed, timeout, f"connection #{n}")
        return self.links[n - 1]

    def _wait(self, done: Any, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.lock:
                if done():
                    return
            time.sleep(0.02)
        raise AssertionError(f"no {what} within {timeout}s; connections: {self.links}, acks: {self.acks}")

    # -- the loop side -----------------------------------------------------------------------------------
    def _call(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(10)

    async def _serve(self) -> Any:
        from websockets.asyncio.server import serve

        server = await serve(self._handle, "127.0.0.1", 0, process_request=self._check_ticket,
                             ping_interval=None)
        self._port = server.sockets[0].getsockname()[1]
        return server

    async def _shutdown(self) -> None:
        self._server.close(close_connections=False)
        await self._drop()
        await self._server.wait_closed()
        for task in asyncio.all_tasks():
            if task is not asyncio.current_task():
                task.cancel()  # envelopes still waiting for a connection: nobody will take them now

    def _check_ticket(self, connection: Any, request: Any) -> Any:
        from http import HTTPStatus

        ticket = (parse_qs(urlsplit(request.path).query).get("ticket") or [""])[0]
        with self.lock:
            if ticket in self._tickets:
                self._tickets.discard(ticket)
                connection.babysit_ticket = ticket
                return None
            self.refused.append(ticket)
        return connection.respond(HTTPStatus.UNAUTHORIZED, "invalid or used Socket Mode ticket\n")

    async def _handle(self, ws: Any) -> None:
        from websockets.exceptions import ConnectionClosed

        with self.lock:
            link = Link(next(self._numbers), ws.babysit_ticket, time.time(), ws)
            self.links.append(link)
            live = sum(1 for k in self.links if not k.closed)
        await ws.send(json.dumps({"type": "hello", "num_connections": live,
                                  "debug_info": {"host": HOST, "build_number": 1, "approximate_connection_time": 18060},
                                  "connection_info": {"app_id": self.app_id}}))
        self._update_live()
        try:
            async for raw in ws:
                self._on_frame(link, raw)
        except ConnectionClosed:
            pass
        finally:
            with self.lock:
                link.closed = True
            self._update_live()

    def _on_frame(self, link: Link, raw: str | bytes) -> None:
        try:
            message = json.loads(raw)
            envelope_id = str(message["envelope_id"])
        except (ValueError, KeyError, TypeError):
            return  # not an ack: the app has nothing else to say on this socket
        envelope = self._envelopes.get(envelope_id)
        with self.lock:
            if self._lose_acks:
                self._lose_acks -= 1
                self._reset(link)  # the ack never arrives, and the connection is gone with it
                return
            late = envelope is None or time.monotonic() - envelope.sent_at > self.ack_timeout_s
            self.acks.append(Ack(envelope_id, message.get("payload"), link.number, late))
        if envelope is not None:
            envelope.acked.set()

    def _update_live(self) -> None:
        with self.lock:
            alive = any(not k.closed and not k.draining for k in self.links)
        if alive:
            self._live.set()
        else:
            self._live.clear()

    def _pick_live(self) -> Link | None:
        """The connection an envelope goes to: the newest live one, or (`delivery="random"`) any live one."""
        if self.delivery == "newest":
            return self._newest_live()
        with self.lock:
            live = [link for link in self.links if not link.closed and not link.draining]
            return self._random.choice(live) if live else None

    def _newest_live(self) -> Link | None:
        with self.lock:
            for link in reversed(self.links):
                if not link.closed and not link.draining:
                    return link
        return None

    def _deliver_soon(self, envelope_id: str, kind: str, payload: dict[str, Any]) -> None:
        envelope = Envelope(envelope_id, kind, payload)
        self._envelopes[envelope_id] = envelope
        self._loop.create_task(self._deliver(envelope))

    async def _deliver(self, envelope: Envelope) -> None:
        from websockets.exceptions import ConnectionClosed

        while envelope.attempts <= self.max_retries and not envelope.acked.is_set():
            await self._live.wait()
            link = self._pick_live()
            if link is None:
                await asyncio.sleep(0.01)
                continue
            try:
                await link.ws.send(json.dumps(envelope.frame()))
            except ConnectionClosed:
                continue  # gone under us: the next live connection gets it
            envelope.sent_at = time.monotonic()
            with self.lock:
                self.deliveries.append(Delivery(envelope.envelope_id, envelope.kind, envelope.attempts, link.number))
            try:
                await asyncio.wait_for(envelope.acked.wait(), self.ack_timeout_s)
            except asyncio.TimeoutError:
                envelope.attempts += 1

    async def _disconnect(self, reason: str) -> None:
        for link in self.open_links():
            if link.draining:
                continue
            with self.lock:
                link.draining = True
            self._update_live()
            try:
                await link.ws.send(json.dumps({"type": "disconnect", "reason": reason, "debug_info": {"host": HOST}}))
            except Exception:
                continue
            self._loop.call_later(self.close_after_s, lambda ws=link.ws: self._loop.create_task(ws.close(1000)))

    async def _drop(self, reset: bool = False) -> None:
        for link in self.open_links():
            if reset:
                self._reset(link)
            else:
                link.ws.transport.abort()

    def _reset(self, link: Link) -> None:
        sock = link.ws.transport.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        link.ws.transport.abort()
