"""The web server: aiohttp, read-only, on 127.0.0.1 unless a token guards it (docs/web.md).

aiohttp (imported inside functions: `babysit --help` stays fast) serves many readers at once on one
event loop and streams updates as server-sent events; pages are rendered in a small thread pool, each
thread with its own read-only SQLite connection, so a slow page never holds up the stream of another.
The same server runs in the foreground (`babysit web`) or in a thread of the daemon (`babysit up
--web PORT`), where a failure of it is logged and never stops babysitting.

Only GET and HEAD are answered (405 otherwise): no endpoint changes anything. A bind other than
127.0.0.1 / ::1 / localhost needs BABYSIT_WEB_TOKEN; the token is compared in constant time
(hmac.compare_digest) and taken from `Authorization: Bearer`, a cookie, or `?token=` once (which
sets the cookie and redirects to the same page without it).
"""

from __future__ import annotations

import asyncio
import hmac
import json
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from babysit.core.errors import BadInput, StateError
from babysit.web import campaign_page, metrics, pages
from babysit.web.data import Site, StoreFacts

TOKEN_ENV = "BABYSIT_WEB_TOKEN"
COOKIE = "babysit_web_token"
LOOPBACK = ("127.0.0.1", "::1", "localhost")
STATIC = {"app.js": "text/javascript", "app.css": "text/css"}
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
       "base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
HEARTBEAT_S = 15.0


@dataclass(frozen=True)
class Settings:
    host: str = "127.0.0.1"
    port: int = 8765
    token: str | None = None
    refresh_s: float = 2.0  # how often a streamed page is re-read
    workers: int = 4


def settings_for(host: str, port: int, environ: dict[str, str] | None = None, refresh_s: float = 2.0) -> Settings:
    """Validated settings: a bind other than loopback without BABYSIT_WEB_TOKEN is refused (exit 2)."""
    env = os.environ if environ is None else environ
    token = env.get(TOKEN_ENV) or None
    if not 0 <= port <= 65535:
        raise BadInput(f"--port: expected a TCP port 0-65535, got {port}", hint="the default is 8765")
    if host not in LOOPBACK and token is None:
        raise BadInput(f"--bind {host}: serving beyond this machine (127.0.0.1) needs {TOKEN_ENV} set",
                       hint=f"export {TOKEN_ENV}=$(python -c 'import secrets; print(secrets.token_urlsafe(32))') "
                            "and open the page once with ?token=… (docs/web.md), or drop --bind")
    if token is not None and len(token) < 16:
        raise BadInput(f"{TOKEN_ENV}: expected at least 16 characters, got {len(token)}",
                       hint="a random one: python -c 'import secrets; print(secrets.token_urlsafe(32))'")
    return Settings(host=host, port=port, token=token, refresh_s=refresh_s)


def token_ok(expected: str, given: str | None) -> bool:
    return given is not None and hmac.compare_digest(expected.encode(), given.encode())


class _Fragments:
    """Renders a page's live part at most once per half refresh, whoever asks (many tabs, one read)."""

    def __init__(self, max_age: float) -> None:
        self.max_age = max_age
        self._lock = threading.Lock()
        self._done: dict[str, tuple[float, str]] = {}

    def get(self, key: str, render: Callable[[], str]) -> str:
        now = time.monotonic()
        with self._lock:
            hit = self._done.get(key)
            if hit is not None and now - hit[0] < self.max_age:
                return hit[1]
        html = render()
        with self._lock:
            self._done[key] = (time.monotonic(), html)
            if len(self._done) > 256:
                self._done.pop(next(iter(self._done)))
        return html


def build_app(site: Site, settings: Settings) -> Any:
    """The aiohttp application (routes, auth, headers); serve it with `start` or `serve`."""
    from aiohttp import web

    pool = ThreadPoolExecutor(max_workers=settings.workers, thread_name_prefix="babysit-web")
    closing = asyncio.Event()
    fragments = _Fragments(settings.refresh_s / 2)
    footer = f"babysit web · {site.registry_path} · read-only · docs/web.md"

    async def off_loop(fn: Callable[..., Any], *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(pool, fn, *args)

    @web.middleware
    async def guard(request: Any, handler: Callable[[Any], Any]) -> Any:
        if request.method not in ("GET", "HEAD"):
            raise web.HTTPMethodNotAllowed(request.method, ["GET", "HEAD"], text="read-only: GET and HEAD only\n")
        if settings.token is not None:
            given = request.query.get("token")
            if given is not None:
                if not token_ok(settings.token, given):
                    raise web.HTTPUnauthorized(text="wrong token\n")
                rest = {k: v for k, v in request.query.items() if k != "token"}
                target = request.path + ("?" + urlencode(rest) if rest else "")
                response = web.HTTPSeeOther(target)
                response.set_cookie(COOKIE, given, httponly=True, samesite="Strict", path="/")
                raise response
            bearer = request.headers.get("Authorization", "")
            bearer = bearer[7:] if bearer.startswith("Bearer ") else None
            if not (token_ok(settings.token, bearer) or token_ok(settings.token, request.cookies.get(COOKIE))):
                raise web.HTTPUnauthorized(
                    text=f"this babysit web needs its token ({TOKEN_ENV}): open /?token=… once, or send "
                         "`Authorization: Bearer …` (docs/web.md)\n")
        elif request.host.rsplit(":", 1)[0].strip("[]") not in LOOPBACK:  # a DNS-rebinding page, not you
            raise web.HTTPForbidden(text="this babysit web answers requests for 127.0.0.1 and localhost only\n")
        response = await handler(request)
        response.headers.setdefault("Content-Security-Policy", CSP)
        response.headers.setdefault("X-Content-Type-Options", "nosniff")
        response.headers.setdefault("Referrer-Policy", "no-referrer")
        response.headers.setdefault("X-Frame-Options", "DENY")
        response.headers.setdefault("Cache-Control", "no-store")
        return response

    def html(body: str, status: int = 200) -> Any:
        return web.Response(text=body, status=status, content_type="text/html", charset="utf-8")

    def runs_view(now: float) -> str:
        """The runs page's live part, read on one thread (its banner is that thread's store's)."""
        try:
            rows, banner = site.rows_and_banner(now)
            return pages.runs_fragment(rows, now, site.campaign_names(), site.quarantined(), banner)
        except StateError as exc:  # PostgreSQL unreachable and no mirror on this box: said on the page
            return pages.unreachable_fragment(exc.message, exc.hint)

    async def runs(_: Any) -> Any:
        body = await off_loop(runs_view, time.time())
        return html(pages.layout("runs", body, stream="/events?page=runs", footer=footer))

    async def run(request: Any) -> Any:
        name, now = request.match_info["name"], time.time()
        try:
            detail = await off_loop(site.run, name, now)
        except StateError as exc:  # PostgreSQL unreachable and no mirror on this box
            return html(pages.layout(name, pages.unreachable_fragment(exc.message, exc.hint), footer=footer), 503)
        if detail is None:
            return html(pages.not_found(f"no run named {name!r} in the registry or the state database", footer), 404)
        return html(pages.run_page(detail, now, footer))

    async def verdict_png(request: Any) -> Any:
        path = await off_loop(site.chart_png, request.match_info["name"])
        if path is None:
            raise web.HTTPNotFound(text="no FINAL verdict chart for this run\n")
        return web.FileResponse(path, headers={"Content-Type": "image/png"})

    async def campaign(request: Any) -> Any:
        name = request.match_info["name"]
        view, note = await off_loop(site.campaign, name)
        if view is None:
            return html(pages.not_found(note or f"no campaign named {name!r} in the state database", footer), 404)
        png = await off_loop(site.saga_png, name)
        return html(campaign_page.campaign_page(view, png is not None, footer))

    async def saga_png(request: Any) -> Any:
        path = await off_loop(site.saga_png, request.match_info["name"])
        if path is None:
            raise web.HTTPNotFound(text="no saga chart drawn for this campaign yet\n")
        return web.FileResponse(path, headers={"Content-Type": "image/png"})

    def fragment(page: str, name: str | None) -> str:
        now = time.time()
        if page == "runs":
            return runs_view(now)
        if page == "campaign":
            view, note = site.campaign(name or "")
            return campaign_page.campaign_fragment(view, site.saga_png(name or "") is not None, now) \
                if view is not None else pages.error_fragment(note or f"no campaign named {name!r}")
        try:
            detail = site.run(name or "", now)
        except StateError as exc:
            return pages.unreachable_fragment(exc.message, exc.hint)
        return pages.run_fragment(detail, now) if detail is not None else pages.error_fragment(
            f"run {name!r} is no longer in the registry or the state database")

    async def events(request: Any) -> Any:
        page, name = request.query.get("page", "runs"), request.query.get("run")
        if page not in ("runs", "run", "campaign") or (page != "runs" and not name):
            raise web.HTTPBadRequest(text="expected ?page=runs, ?page=run&run=NAME or ?page=campaign&run=NAME\n")
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-store",
                                               "X-Accel-Buffering": "no"})
        await response.prepare(request)
        last, quiet_since = None, time.monotonic()
        key = f"{page}:{name}"
        try:
            while not closing.is_set():
                body = await off_loop(fragments.get, key, lambda: fragment(page, name))
                if body != last:
                    await response.write(sse("update", body))
                    last, quiet_since = body, time.monotonic()
                elif time.monotonic() - quiet_since > HEARTBEAT_S:
                    await response.write(b": keep-alive\n\n")
                    quiet_since = time.monotonic()
                try:
                    await asyncio.wait_for(closing.wait(), timeout=settings.refresh_s)
                except asyncio.TimeoutError:
                    pass
        except (ConnectionResetError, asyncio.CancelledError):
            pass  # the tab was closed, or the server is stopping
        return response

    async def scrape(_: Any) -> Any:
        def collect() -> bytes:
            now = time.time()
            try:
                rows = site.rows(now)
                fams = metrics.families(rows, site.incident_counts(), site.daemon_facts(), now, site.store_facts())
            except StateError:  # PostgreSQL unreachable, no mirror here: the scrape still answers, degraded
                fams = metrics.store_families(StoreFacts(degraded=True))
            return metrics.exposition(fams)
        body = await off_loop(collect)
        return web.Response(body=body, headers={"Content-Type": metrics.CONTENT_TYPE})

    async def api_runs(_: Any) -> Any:
        rows = await off_loop(site.rows, time.time())
        return web.Response(text=json.dumps([r.to_dict() for r in rows], indent=2), content_type="application/json")

    async def static(request: Any) -> Any:
        name = request.match_info["file"]
        if name not in STATIC:
            raise web.HTTPNotFound()
        text = resources.files("babysit.web").joinpath("static", name).read_text(encoding="utf-8")
        return web.Response(text=text, content_type=STATIC[name], charset="utf-8")

    async def healthz(_: Any) -> Any:
        return web.Response(text="ok\n")

    async def favicon(_: Any) -> Any:
        return web.Response(status=204)

    async def on_startup(_: Any) -> None:
        # read every run.toml and log tail once now, not on the first visitor's clock (1,000 runs: seconds)
        warm = asyncio.get_running_loop().run_in_executor(pool, site.rows)
        warm.add_done_callback(lambda f: f.cancelled() or f.exception())  # a failure shows on the first page

    async def on_shutdown(_: Any) -> None:
        closing.set()

    async def on_cleanup(_: Any) -> None:
        pool.shutdown(wait=False, cancel_futures=True)

    app = web.Application(middlewares=[guard])
    app.on_startup.append(on_startup)
    app.on_shutdown.append(on_shutdown)
    app.on_cleanup.append(on_cleanup)
    app.add_routes([
        web.get("/", runs), web.get("/metrics", scrape), web.get("/events", events), web.get("/api/runs", api_runs),
        web.get("/healthz", healthz), web.get("/favicon.ico", favicon), web.get("/static/{file}", static),
        web.get(r"/run/{name:.+}/verdict.png", verdict_png), web.get(r"/run/{name:.+}", run),
        web.get(r"/campaign/{name:.+}/saga.png", saga_png), web.get(r"/campaign/{name:.+}", campaign),
    ])
    return app


def sse(event: str, data: str) -> bytes:
    """One server-sent event; every line of `data` is its own `data:` field (a newline cannot end it)."""
    lines = "".join(f"data: {line}\n" for line in data.replace("\r\n", "\n").replace("\r", "\n").split("\n"))
    return f"event: {event}\n{lines}\n".encode()


class WebServer:
    """A running server (in a thread of its own with its own event loop); `url` once started."""

    def __init__(self, registry_path: Path, settings: Settings) -> None:
        self.registry_path = Path(registry_path)
        self.settings = settings
        self.url: str | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopped: asyncio.Event | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._main, name="babysit-web", daemon=True)

    def start(self, timeout: float = 30.0) -> WebServer:
        """Start serving; raises the bind's OSError (a port in use) or whatever stopped it from starting."""
        self._thread.start()
        if not self._ready.wait(timeout):
            raise TimeoutError(f"the web server did not start within {timeout:g} s")
        if self._error is not None:
            raise self._error
        return self

    def stop(self) -> None:
        if self._loop is not None and self._stopped is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._stopped.set)
            self._thread.join(timeout=10)

    def wait(self) -> None:
        while self._thread.is_alive():
            self._thread.join(0.5)

    def _main(self) -> None:
        try:
            asyncio.run(self._serve())
        except BaseException as exc:  # reported to start(); after start, the caller's log has it
            if not self._ready.is_set():
                self._error = exc
                self._ready.set()
            else:
                import structlog

                structlog.get_logger("babysit.web").error("web server stopped", error=repr(exc))

    async def _serve(self) -> None:
        from aiohttp import web

        self._loop = asyncio.get_running_loop()
        self._stopped = asyncio.Event()
        app = build_app(Site(self.registry_path), self.settings)
        runner = web.AppRunner(app, access_log=None, shutdown_timeout=2.0)
        await runner.setup()
        try:
            tcp = web.TCPSite(runner, self.settings.host, self.settings.port)
            await tcp.start()
            addresses = runner.addresses  # each bound socket's getsockname(): (host, port, ...)
            port = addresses[0][1] if addresses else self.settings.port  # --port 0: the one given
            host = f"[{self.settings.host}]" if ":" in self.settings.host else self.settings.host
            self.url = f"http://{host}:{port}/"
            self._ready.set()
            await self._stopped.wait()
        finally:
            await runner.cleanup()
