"""The console's HTTP server: static page, JSON reads, server-sent events, and writes as CLI commands.

Defences, since any web page the user visits can send requests to 127.0.0.1:
- the Host header must be one the console answers to (a DNS-rebinding page sends its own name);
- everything but the page's static files and the login needs the session cookie (HttpOnly,
  SameSite=Strict: never sent by another site's requests);
- a write also needs the page's own Origin and the session's CSRF token in a header;
- a strict Content-Security-Policy (scripts and styles only from the console, no inline script), so
  text an agent wrote can never run even if it reached the page as markup (it does not: the page sets
  text as text);
- the login token is spent on first use and never logged (the access log has no query strings).

Behind an authenticating proxy (in a cluster, `--proxy-token-header`), there is no login URL and no
cookie of the console's: each request carries its person's bearer token in the proxy's header, and is
read and written with that token alone (seats.ProxySeats); a request without one is refused. Origin and
a CSRF token bound to the person still guard every write (the proxy's own cookie rides along with any
site's request).
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web
from aiohttp.abc import AbstractAccessLogger

from agentrun.api import Run
from agentrun.cli.cluster import Cluster
from agentrun.cli.console import actions, runpage
from agentrun.cli.console.seats import ProxySeats, Seat, token_from
from agentrun.cli.console.sessions import Session, Sessions, csrf_matches
from agentrun.cli.console.watchcache import WatchCache
from agentrun.cli.controls import schema_problem
from agentrun.clock import Clock, SystemClock
from agentrun.kubeapi import ApiError, KubeApi

log = logging.getLogger("agentrun.console")
STATIC = Path(__file__).parent / "static"
COOKIE = "agentrun-console"
CSRF_HEADER = "X-CSRF-Token"
HEARTBEAT_SECONDS = 15.0
READY_SECONDS = 10.0  # how long the inbox waits for the first lists before it says they are late
MAX_BODY = 512 * 1024  # an answer is bounded by the Run's budget (256 KiB) anyway
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
    "form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
SECURITY_HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Cross-Origin-Opener-Policy": "same-origin",
    "Cross-Origin-Resource-Policy": "same-origin",
}
STATIC_FILES = {"console.js": "text/javascript", "console.css": "text/css", "favicon.svg": "image/svg+xml"}
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass
class Console:
    """Everything a request handler needs. On a laptop: the kubeconfig user's api, cache and user (one
    seat) and the login sessions; behind a proxy (`proxy` set): a seat per person's token instead."""

    api: KubeApi | None
    cache: WatchCache | None
    sessions: Sessions
    hosts: set[str]  # Host header values the console answers to, e.g. 127.0.0.1:8765
    user: str | None
    parse: actions.Parse
    kubeconfig: str | None = None
    clock: Clock = field(default_factory=SystemClock)
    proxy: ProxySeats | None = None
    token_header: str = "Authorization"  # behind a proxy: where the person's bearer token comes
    local: Seat | None = field(init=False)

    def __post_init__(self) -> None:
        if self.proxy is None and (self.api is None or self.cache is None):
            raise ValueError("a console without a proxy acts with its kubeconfig: api and cache needed")
        self.local = (
            None
            if self.api is None or self.cache is None
            else Seat(self.api, self.cache, self.user, self.clock)
        )

    def origins(self) -> set[str]:
        return {f"http://{host}" for host in self.hosts} | {f"https://{host}" for host in self.hosts}


CONSOLE: web.AppKey[Console] = web.AppKey("console", Console)
# The request's seat and its page's CSRF token, set by the guard for the handler (the same task).
CALLER: ContextVar[tuple[Seat, str]] = ContextVar("console_caller")
HEALTH = "/healthz"  # for probes, which know no Host name of the console's


def _seat(request: web.Request) -> Seat:
    return CALLER.get()[0]


def cookie_name(request: web.Request) -> str:
    """The session cookie's name, one per port: cookies do not tell the ports of 127.0.0.1 apart, and
    two consoles (two clusters, two identities) may run side by side."""
    return f"{COOKIE}-{request.url.port}"


def _session(request: web.Request) -> Session:
    """The request's session (the guard let only requests with a live one through)."""
    session = request.app[CONSOLE].sessions.find(request.cookies.get(cookie_name(request)))
    if session is None:
        raise web.HTTPUnauthorized(text="the session expired")
    return session


class AccessLogger(AbstractAccessLogger):
    """Method, path (never the query string: the login token travels in it) and status."""

    def log(self, request: web.BaseRequest, response: web.StreamResponse, time: float) -> None:
        self.logger.info("%s %s %s %.0fms", request.method, request.path, response.status, time * 1000)


def _problem(status: int, message: str, **extra: Any) -> web.Response:
    return web.json_response({"error": message, **extra}, status=status)


@web.middleware
async def guard(request: web.Request, handler: Handler) -> web.StreamResponse:
    console = request.app[CONSOLE]
    if request.path == HEALTH and request.method == "GET":
        response: web.StreamResponse = await handler(request)  # no session, no Host name, no data
    elif request.host not in console.hosts:
        # A page served under another name (DNS rebinding) reaches this port with its own Host.
        response = _problem(421, f"this console does not answer to {request.host!r}")
    else:
        try:
            response = await _authorised(request, handler, console)
        except web.HTTPException as exc:  # a redirect or refusal a handler raised: same headers
            _secure(request, exc)
            raise
    _secure(request, response)
    return response


def _secure(request: web.Request, response: web.StreamResponse | web.HTTPException) -> None:
    for name, value in SECURITY_HEADERS.items():
        response.headers.setdefault(name, value)
    if request.path.startswith(("/api/", "/login")):
        response.headers["Cache-Control"] = "no-store"


async def _authorised(request: web.Request, handler: Handler, console: Console) -> web.StreamResponse:
    public = request.path in ("/login", "/") or request.path.startswith(("/static/", "/runs/"))
    if public and request.method == "GET":
        return await handler(request)
    if console.proxy is not None:
        return await _proxied(request, handler, console, console.proxy)
    session = console.sessions.find(request.cookies.get(cookie_name(request)))
    if session is None or console.local is None:
        return _problem(401, "not signed in, or the session expired: open the login URL the console printed")
    if request.method not in ("GET", "HEAD"):
        if request.headers.get("Origin") not in console.origins():
            return _problem(403, "a write must come from the console's own page (Origin)")
        if not csrf_matches(session, request.headers.get(CSRF_HEADER)):
            return _problem(403, "missing or wrong CSRF token: reload the page")
    CALLER.set((console.local, session.csrf))
    return await handler(request)


async def _proxied(
    request: web.Request, handler: Handler, console: Console, proxy: ProxySeats
) -> web.StreamResponse:
    """A request the proxy sent: it acts as the person whose token it carries, or not at all."""
    header = console.token_header
    token = token_from(request.headers.get(header), header)
    if token is None:
        message = (
            f"no user token in the {header} header: this console acts only as the person the proxy "
            "signed in, never as itself (is the proxy set to pass the user's access token?)"
        )
        return _problem(401, message, proxied=True)
    try:
        seat = await proxy.of(token)
    except ApiError as exc:
        status = 401 if exc.status == 401 else 502
        refused = f"the API server refuses the token the proxy sent: {exc.message}"
        return _problem(status, refused, proxied=True)
    csrf = proxy.csrf(seat, token)
    if request.method not in ("GET", "HEAD"):
        if request.headers.get("Origin") not in console.origins():
            return _problem(403, "a write must come from the console's own page (Origin)")
        sent = request.headers.get(CSRF_HEADER)
        if sent is None or not hmac.compare_digest(csrf.encode(), sent.encode()):
            return _problem(403, "missing or wrong CSRF token: reload the page")
    CALLER.set((seat, csrf))
    return await handler(request)


# ---- pages and sign-in -------------------------------------------------------------------------------


async def index(request: web.Request) -> web.StreamResponse:
    return web.FileResponse(STATIC / "index.html", headers={"Content-Type": "text/html; charset=utf-8"})


async def health(request: web.Request) -> web.StreamResponse:
    return web.Response(text="ok")


async def static(request: web.Request) -> web.StreamResponse:
    name = request.match_info["name"]
    if name not in STATIC_FILES:
        raise web.HTTPNotFound()
    return web.FileResponse(STATIC / name, headers={"Content-Type": STATIC_FILES[name]})


async def login(request: web.Request) -> web.StreamResponse:
    console = request.app[CONSOLE]
    session = console.sessions.exchange(request.query.get("token", ""))
    if session is None:
        message = (
            "This login link was used already or is wrong. Each link works once: ask the console for a "
            "new one (restart `kubectl agentrun console`)."
        )
        return web.Response(status=403, text=message, content_type="text/plain")
    # A redirect drops the token from the address bar (and from what the page could leak).
    response = web.HTTPSeeOther("/")
    response.set_cookie(
        cookie_name(request),
        session.id,
        httponly=True,
        samesite="Strict",
        path="/",
        max_age=int(console.sessions.lifetime),
        secure=request.secure,
    )
    raise response


async def logout(request: web.Request) -> web.StreamResponse:
    if request.app[CONSOLE].proxy is not None:
        return _problem(400, "this console has no session of its own: sign out at the proxy", proxied=True)
    session = _session(request)
    request.app[CONSOLE].sessions.end(session.id)
    response = web.json_response({"ok": True})
    response.del_cookie(cookie_name(request), path="/")
    return response


async def who(request: web.Request) -> web.StreamResponse:
    console, seat = request.app[CONSOLE], _seat(request)
    left = None if console.proxy is not None else int(console.sessions.seconds_left(_session(request)))
    return web.json_response(
        {
            "user": seat.user,
            "csrf": CALLER.get()[1],
            "scopes": ["(all namespaces)" if s is None else s for s in seat.cache.scopes],
            "sessionSeconds": left,
            "proxied": console.proxy is not None,
        }
    )


# ---- reads -------------------------------------------------------------------------------------------


async def _ready(cache: WatchCache) -> bool:
    """Whether every watch has listed once, waiting up to READY_SECONDS for it."""
    if not cache.ready:
        try:
            async with asyncio.timeout(READY_SECONDS):
                await cache.wait_newer(-1)
        except TimeoutError:
            return False
    return True


async def inbox(request: web.Request) -> web.StreamResponse:
    console, seat = request.app[CONSOLE], _seat(request)
    if not await _ready(seat.cache):
        # The page hears from the event stream once the lists arrive, and loads again then.
        message = (
            "the API server has not answered the console's list of Runs yet: is the cluster reachable? "
            "(the console's terminal says what goes wrong)"
        )
        return _problem(503, message)
    items = seat.cache.inbox()
    permissions = await seat.permissions.of(sorted({str(i["namespace"]) for i in items}))
    return web.json_response(
        {
            "now": console.clock.now().isoformat().replace("+00:00", "Z"),
            "version": seat.cache.version,
            "items": items,
            "may": permissions,
            "problems": sorted(seat.cache.problems.values()),
            "namespaces": seat.cache.namespaces(),
        },
        dumps=_dumps,
    )


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


async def run_page(request: web.Request) -> web.StreamResponse:
    console, seat = request.app[CONSOLE], _seat(request)
    namespace, name = request.match_info["namespace"], request.match_info["name"]
    try:
        page = await runpage.load(Cluster(seat.api, namespace, console.clock), name, console.clock.now())
    except ApiError as exc:
        return _problem(exc.status if exc.status in (401, 403) else 502, f"reading run {name}: {exc.message}")
    if page is None:
        return _problem(404, f"run {name} not found in namespace {namespace}: it may have been deleted")
    page["may"] = (await seat.permissions.of([namespace]))[namespace]
    page["version"] = seat.cache.version
    page["pending"] = next(
        (i for i in seat.cache.inbox() if i["namespace"] == namespace and i["run"] == name), None
    )
    return web.json_response(page, dumps=_dumps)


async def events(request: web.Request) -> web.StreamResponse:
    """Server-sent events: `changed` with the cache's version whenever a watched object changes."""
    console, seat = request.app[CONSOLE], _seat(request)
    session = None if console.proxy is not None else _session(request)
    response = web.StreamResponse(
        headers={"Content-Type": "text/event-stream", "Cache-Control": "no-store", "X-Accel-Buffering": "no"}
    )
    for name, value in SECURITY_HEADERS.items():
        response.headers[name] = value
    await response.prepare(request)
    try:  # the version the page has loaded: changes after it are announced at once
        version = int(request.query.get("since", "-1"))
    except ValueError:
        version = -1
    seat.streams += 1  # a seat with a page listening is never closed as idle
    try:
        while session is None or console.sessions.find(session.id) is not None:
            try:
                async with asyncio.timeout(HEARTBEAT_SECONDS):
                    version = await seat.cache.wait_newer(version)
                message = f"event: changed\ndata: {version}\n\n"
            except TimeoutError:
                message = ": still here\n\n"  # keeps proxies and the browser from giving up
            await response.write(message.encode())
        await response.write(b"event: expired\ndata: sign in again\n\n")
    except ConnectionResetError:  # the page went away
        pass
    finally:
        seat.streams -= 1
    return response


# ---- writes ------------------------------------------------------------------------------------------


async def _body(request: web.Request) -> dict[str, Any]:
    if request.content_type != "application/json":
        raise web.HTTPUnsupportedMediaType(text="send JSON")
    raw = await request.read()
    if len(raw) > MAX_BODY:
        raise web.HTTPRequestEntityTooLarge(max_size=MAX_BODY, actual_size=len(raw))
    try:
        body = json.loads(raw)
    except ValueError:
        raise web.HTTPBadRequest(text="the body is not JSON") from None
    if not isinstance(body, dict) or not isinstance(body.get("namespace"), str):
        raise web.HTTPBadRequest(text="a JSON object with a namespace is required")
    return body


async def check(request: web.Request) -> web.StreamResponse:
    """The server's verdict on an answer before it is sent: the check `resume` makes (schema_problem)."""
    body = await _body(request)
    stored = _seat(request).cache.run(body["namespace"], str(body.get("run")))
    if stored is None:
        return _problem(404, "no such Run in the console's view")
    pending = Run.model_validate(stored).status.pending_request
    if pending is None or pending.request_id != body.get("requestId"):
        return web.json_response({"problem": "the Run no longer waits for this request"})
    return web.json_response({"problem": schema_problem(body.get("value"), pending.accepted_schema)})


async def act(request: web.Request) -> web.StreamResponse:
    console, seat = request.app[CONSOLE], _seat(request)
    action = request.match_info["action"]
    body = await _body(request)
    try:
        argv = actions.command_line(action, body)
    except actions.BadAction as exc:
        return _problem(400, str(exc))
    if action == "approve" and body.get("approved") is True and (why := _unverified(seat.cache, body)):
        return web.json_response({"ok": False, "message": f"not approved: {why}; nothing sent"}, status=409)
    kubeconfig = console.kubeconfig if console.proxy is None else None
    outcome = await actions.perform(
        seat.api, console.parse, body["namespace"], kubeconfig, argv, clock=console.clock
    )
    log.info("%s in %s: %s", action, body["namespace"], "done" if outcome.ok else "refused")
    return web.json_response(
        {"ok": outcome.ok, "message": outcome.message}, status=200 if outcome.ok else 409
    )


def _unverified(cache: WatchCache, body: dict[str, Any]) -> str | None:
    """Why the console will not approve this request: it must be the pending approval, whose action it
    shows and whose digest it recomputed (inbox.approval_check)."""
    item = next(
        (
            i
            for i in cache.inbox()
            if i["namespace"] == body["namespace"] and i["run"] == body.get("run") and i["kind"] == "approval"
        ),
        None,
    )
    if item is None or item["requestId"] != body.get("requestId"):
        return "the Run does not wait for this approval (any more)"
    verdict: dict[str, Any] = item["approval"]
    return None if verdict["verified"] else str(verdict["problem"])


def application(console: Console) -> web.Application:
    app = web.Application(middlewares=[guard], client_max_size=MAX_BODY)
    app[CONSOLE] = console
    app.router.add_get(HEALTH, health)
    app.router.add_get("/", index)
    app.router.add_get("/runs/{namespace}/{name}", index)
    app.router.add_get("/static/{name}", static)
    app.router.add_get("/login", login)
    app.router.add_post("/api/logout", logout)
    app.router.add_get("/api/session", who)
    app.router.add_get("/api/inbox", inbox)
    app.router.add_get("/api/runs/{namespace}/{name}", run_page)
    app.router.add_get("/api/events", events)
    app.router.add_post("/api/check", check)
    app.router.add_post("/api/{action}", act)
    return app
