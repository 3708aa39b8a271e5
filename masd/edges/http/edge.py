"""The HTTP application: every route module's routes on one aiohttp application, and the
middleware that answers in JSON whatever a handler did not (docs/protocol.md §9).

Nothing a client sends yields a 5xx: aiohttp's own 404 and 405 become JSON refusals, and a
fault of masd's own is ``503 unavailable`` with ``Retry-After`` (never a traceback).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable
from typing import Final

from aiohttp import hdrs, web
from aiohttp.typedefs import Middleware

from masd.clock import TestClock
from masd.edges.context import EdgeContext
from masd.edges.http import (
    case,
    cases,
    clock,
    events,
    healthz,
    messages,
    metrics,
    outbox,
    thread,
)
from masd.edges.http.shared import MAX_BODY, Handler, Route, Served, refusal
from masd.edges.limits import Gate
from masd.feed import FeedWatch

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
)

AioHandler = Callable[[web.Request], Awaitable[web.StreamResponse]]
AioExpect = Callable[[web.Request], Awaitable[web.StreamResponse | None]]


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
        app = web.Application(client_max_size=MAX_BODY, middlewares=[_json_errors(gate)])
        _add(app, self.routes(), self.served)
        app.on_shutdown.append(self._closing)
        return app

    async def _closing(self, app: web.Application) -> None:
        """masd is stopping: long polls answer and streams end now."""
        del app
        self.served.feed.close()


def _add(app: web.Application, routes: Iterable[Route], served: Served) -> None:
    for r in routes:
        app.router.add_route(
            r.method, r.path, _bound(r.handler, served), expect_handler=_expecting(r, served)
        )


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


def _json_errors(gate: Gate | None) -> Middleware:
    @web.middleware
    async def json_errors(request: web.Request, handler: AioHandler) -> web.StreamResponse:
        """JSON for aiohttp's own 404/405 (never its HTML pages) and for faults."""
        transport = request.transport
        if gate is not None:
            gate.started(transport)
        try:
            return await handler(request)
        except web.HTTPNotFound:
            return refusal("not-found", f"path: {request.path} is not served here")
        except web.HTTPMethodNotAllowed as exc:
            response = refusal(
                "method-not-allowed", f"method: {request.method} is not allowed on {request.path}"
            )
            response.headers[hdrs.ALLOW] = exc.headers.get(hdrs.ALLOW, "")
            return response
        except web.HTTPException as exc:
            if exc.status >= 500:
                log.error("fault method=%s path=%s: %s", request.method, request.path, exc)
                return refusal("unavailable", "masd failed; retry later (see its log)")
            code = "too-large" if exc.status == 413 else "invalid-message"
            return refusal(code, f"{exc.reason}: {exc.text or ''}".strip(), status=exc.status)
        except Exception:  # masd's own fault: JSON and 503, never a traceback
            log.exception("fault method=%s path=%s", request.method, request.path)
            return refusal("unavailable", "masd failed; retry later (see its log)")
        finally:
            if gate is not None:
                gate.finished(transport)

    return json_errors
