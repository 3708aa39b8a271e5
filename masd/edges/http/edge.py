"""The HTTP application: every route module's routes on one aiohttp application, the
middleware that checks who is asking (:mod:`masd.edges.http.auth`), and the one that answers
every refusal (docs/protocol.md §9).

A handler, or the authentication before it, refuses by raising
:class:`~masd.edges.http.shared.HttpRefusal`; :func:`_refusals` answers it as JSON, and so
aiohttp's own 404 and 405 (never its HTML pages).  Nothing a client sends yields a 5xx: a
fault of masd's own is ``503 unavailable`` with ``Retry-After``, never a traceback.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Final

from aiohttp import hdrs, web
from aiohttp.typedefs import Handler as AioHandler
from aiohttp.typedefs import Middleware

from masd.clock import TestClock
from masd.edges.context import EdgeContext
from masd.edges.http import (
    apidoc,
    case,
    cases,
    clock,
    console,
    erase,
    events,
    healthz,
    intakes,
    message,
    messages,
    metrics,
    outbox,
    thread,
)
from masd.edges.http.auth import authenticate
from masd.edges.http.shared import (
    MAX_BODY,
    Handler,
    HttpRefusal,
    Route,
    Served,
    oversized_header,
)
from masd.edges.limits import Gate
from masd.metrics import Metrics
from masd.read.feed import FeedWatch

log = logging.getLogger("masd.http")

#: Every route masd serves, but the test clock's.
ROUTES: Final[tuple[Route, ...]] = (
    *messages.ROUTES,
    *healthz.ROUTES,
    *metrics.ROUTES,
    *case.ROUTES,
    *thread.ROUTES,
    *cases.ROUTES,
    *events.ROUTES,
    *outbox.ROUTES,
    *erase.ROUTES,
    *console.ROUTES,
    *message.ROUTES,
    *intakes.ROUTES,
    *apidoc.ROUTES,
)

AioExpect = Callable[[web.Request], Awaitable[web.StreamResponse | None]]
_FAILED: Final = "masd failed; retry later (see its log)"


class HttpEdge:
    """The edge's state; :meth:`app` builds the aiohttp application."""

    def __init__(self, ctx: EdgeContext, feed: FeedWatch | None = None) -> None:
        """``feed``: told of every commit (the app's); by default the event feed
        looks for new entries every second."""
        self.served = Served.of(ctx, feed or FeedWatch())
        self.metrics = ctx.metrics

    def routes(self) -> tuple[Route, ...]:
        """What this edge serves: :data:`ROUTES`, and the test clock with one."""
        if isinstance(self.served.clock, TestClock):
            # Only with `masd serve --test-clock`, which requires loopback listeners.
            return ROUTES + clock.ROUTES
        return ROUTES

    def app(self, gate: Gate | None = None) -> web.Application:
        """The application; ``gate`` (the listener's) is told when each request
        head has been read and when its answer is done."""
        served = self.served
        routes: dict[web.AbstractRoute, Route] = {}
        app = web.Application(
            client_max_size=MAX_BODY,
            middlewares=[
                _refusals(gate, routes, served.metrics),
                authenticate(served.rt, routes),
            ],
        )
        for r in self.routes():
            # A GET route answers HEAD too (aiohttp's add_get does the same).
            for method in (hdrs.METH_HEAD, r.method) if r.method == hdrs.METH_GET else (r.method,):
                added = app.router.add_route(
                    method, r.path, _bound(r.handler, served), expect_handler=_expecting(r, served)
                )
                routes[added] = r
        app.on_response_prepare.append(console.guard)
        app.on_shutdown.append(self._closing)
        return app

    async def _closing(self, app: web.Application) -> None:
        """masd is stopping: long polls answer and streams end now."""
        del app
        self.served.feed.close()


def _bound(handler: Handler, served: Served) -> AioHandler:
    async def handle(request: web.Request) -> web.StreamResponse:
        return await handler(request, served)

    return handle


def _expecting(r: Route, served: Served) -> AioExpect | None:
    if r.expect is None:
        return None
    expect = r.expect

    async def handle(request: web.Request) -> web.StreamResponse | None:
        return await expect(request, served)

    return handle


def _refusal_of(request: web.Request, exc: web.HTTPException) -> HttpRefusal:
    """aiohttp's own answer (no route, no such method, a body over the bound) as a refusal."""
    if isinstance(exc, web.HTTPNotFound):
        return HttpRefusal("not-found", f"path: {request.path} is not served here")
    if isinstance(exc, web.HTTPMethodNotAllowed):
        return HttpRefusal(
            "method-not-allowed",
            f"method: {request.method} is not allowed on {request.path}",
            headers={hdrs.ALLOW: exc.headers.get(hdrs.ALLOW, "")},
        )
    if exc.status >= 500:
        log.error("fault method=%s path=%s: %s", request.method, request.path, exc)
        return HttpRefusal("unavailable", _FAILED)
    kind = "too-large" if exc.status == 413 else "invalid-message"
    return HttpRefusal(kind, f"{exc.reason}: {exc.text or ''}".strip(), status=exc.status)


def _refusals(
    gate: Gate | None, routes: Mapping[web.AbstractRoute, Route], metrics: Metrics
) -> Middleware:
    """The outermost middleware: every refusal answered, a counted route's answers counted."""

    @web.middleware
    async def refusals(request: web.Request, handler: AioHandler) -> web.StreamResponse:
        transport = request.transport
        if gate is not None:
            gate.started(transport)
        try:
            if (oversized := oversized_header(request)) is not None:
                raise oversized
            try:
                response = await handler(request)
            except web.HTTPException as exc:
                raise _refusal_of(request, exc) from exc
        except HttpRefusal as refused:
            response = refused.response()
        except Exception:  # masd's own fault: JSON and 503, never a traceback
            log.exception("fault method=%s path=%s", request.method, request.path)
            return HttpRefusal("unavailable", _FAILED).response()
        finally:
            if gate is not None:
                gate.finished(transport)
        route = routes.get(request.match_info.route)
        if route is not None and route.counted:
            metrics.inc("masd_http_requests_total", status=str(response.status))
        return response

    return refusals
