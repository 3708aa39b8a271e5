"""The HTTP listener (docs/protocol.md §9, §16): contract messages in, health, metrics, the read
side.

``POST /mas/v0.1/messages`` runs docs/protocol.md §9's checks in order, the first
failure answers: 401 (the body is not read) -> 415 -> 413 -> envelope
(400) -> 403 for a type the peer may not send -> one store job
(:func:`masd.service.receive`: idempotency, schema, 404, 403, stale, 409).
Every answer is JSON; :data:`REPLIES` lists the ones this module gives itself.

Nothing a client sends yields a 5xx: a malformed ``Authorization`` header is
401, a body :mod:`masd.core.wire` cannot decode is 400.  A 5xx says masd
itself failed: ``503 unavailable`` with ``Retry-After``, and the same ``id``
may be sent again.

Limits (docs/protocol.md §9, :class:`HttpLimits`): a request head must arrive within
10 s of its first byte (or of the connection), an idle keep-alive connection
is closed after 75 s, and at most ``server.max_http_connections`` are open at
once; one more is answered 503 as it is accepted and closed
(:mod:`masd.edges.limits`).

Gauges on ``GET /metrics`` are read from the store at each scrape (they
survive restarts); :func:`masd.metrics.store_gauges` says what each one counts.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import re
import socket
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Final

from aiohttp import hdrs, web
from aiohttp.http import HttpVersion11
from aiohttp.http_exceptions import HttpProcessingError

from masd import readside, service
from masd.clock import TestClock
from masd.config import Listen
from masd.core import wire
from masd.core.errors import WireError
from masd.edges.accept import AcceptServer
from masd.edges.context import EdgeContext
from masd.edges.limits import Gate
from masd.edges.sockets import ListenError, serve
from masd.feed import FeedWatch
from masd.logs import parser_refusal
from masd.metrics import health_gauges, store_gauges
from masd.peers import Principal
from masd.store import StoreError

log = logging.getLogger("masd.http")

MESSAGES_PATH: Final = "/mas/v0.1/messages"
CASES_PATH: Final = "/mas/v0.1/cases"
#: The test clock (masd serve --test-clock only).
CLOCK_PATH: Final = "/mas/v0.1/test/clock"
#: docs/protocol.md §9: "413 too-large (body over 256 KiB)".
MAX_BODY: Final = 256 * 1024
_CHUNK: Final = 64 * 1024
METRICS_CONTENT_TYPE: Final = "text/plain; version=0.0.4; charset=utf-8"
#: Seconds a client should wait before sending again after a 503.
RETRY_AFTER: Final = 5
#: docs/protocol.md §9: the limits, by default (``server.max_http_connections`` for the cap).
HEADER_TIMEOUT: Final = 10.0
KEEPALIVE_TIMEOUT: Final = 75.0
MAX_CONNECTIONS: Final = 1000
#: ``Authorization: Bearer <secret>``; a secret is printable ASCII without
#: spaces (what check-config allows in a token file).
_BEARER: Final = re.compile(r"[Bb][Ee][Aa][Rr][Ee][Rr] +([!-~]+)")

#: The replies this edge gives itself (status by error code).  The rest come
#: from :mod:`masd.core.wire` and :func:`masd.service.receive` as WireError.
REPLIES: Final[Mapping[str, int]] = MappingProxyType(
    {
        "unauthenticated": 401,
        "unsupported-media-type": 415,
        "too-large": 413,
        "invalid-message": 400,  # read side: a bad query parameter
        "unknown-case": 404,  # read side
        "unknown-item": 404,  # the outbound queue (masd.queue)
        "wrong-state": 409,  # the outbound queue: an item already sent or withdrawn
        "not-found": 404,
        "method-not-allowed": 405,
        "expectation-failed": 417,
        "unavailable": 503,
    }
)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def refusal(code: str, detail: str, *, status: int | None = None) -> web.Response:
    """``{"ok": false, "error": code, "detail": ...}`` with the code's status."""
    body = {"ok": False, "error": code, "detail": detail}
    response = web.json_response(body, status=status or REPLIES[code])
    if code == "unauthenticated":
        response.headers[hdrs.WWW_AUTHENTICATE] = 'Bearer realm="masd"'
    elif response.status == 503:
        response.headers[hdrs.RETRY_AFTER] = str(RETRY_AFTER)
    return response


def _bearer(request: web.Request) -> str | None:
    """The secret of ``Authorization: Bearer <secret>``; None when the header is
    missing or is not that (another scheme, a secret that is not printable ASCII)."""
    match = _BEARER.fullmatch(request.headers.get(hdrs.AUTHORIZATION, "").strip())
    return match.group(1) if match else None


_NO_BEARER: Final = "Authorization: no Bearer secret of printable ASCII"


def _envelope_refs(env: wire.Envelope) -> tuple[object, object]:
    case = env.body.get("case")
    key = case.get("key") if isinstance(case, dict) else None
    return key, env.body.get("handoff_id")


class HttpEdge:
    """The request handlers; :meth:`app` builds the aiohttp application."""

    def __init__(self, ctx: EdgeContext, feed: FeedWatch | None = None) -> None:
        """``feed``: told of every commit (the app's); by default the event feed
        looks for new entries every second."""
        self.rt = ctx.rt
        self.store = ctx.store
        self.clock = ctx.clock
        self.metrics = ctx.metrics
        self.on_commit = ctx.listener
        self.feed = feed or FeedWatch()

    def app(self, gate: Gate | None = None) -> web.Application:
        """The application; ``gate`` (the listener's) is told when each request
        head has been read and when its answer is done."""
        self._gate = gate
        app = web.Application(client_max_size=MAX_BODY, middlewares=[self._json_errors])
        app.router.add_post(MESSAGES_PATH, self._messages, expect_handler=self._expect)
        app.router.add_get("/healthz", self._healthz)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get(CASES_PATH + "/{key}", self._case)
        app.router.add_get(CASES_PATH + "/{key}/thread", self._thread)
        from masd.edges.http_read import ReadRoutes  # it builds on this module

        ReadRoutes(self, self.feed).add(app)
        if isinstance(self.clock, TestClock):
            # Only with `masd serve --test-clock`, which requires loopback listeners.
            app.router.add_post(CLOCK_PATH, self._tick)
            app.router.add_get(CLOCK_PATH, self._tick)
        return app

    # ------------------------------------------------------------------ plumbing

    @web.middleware
    async def _json_errors(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """JSON for aiohttp's own 404/405 (never its HTML pages) and for faults."""
        gate, transport = getattr(self, "_gate", None), request.transport
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

    def _precheck(self, request: web.Request) -> Principal | web.Response:
        """401 -> 415 -> 413 by Content-Length: what can be decided before the body."""
        secret = _bearer(request)
        if secret is None:
            return refusal("unauthenticated", _NO_BEARER)
        principal = self.rt.directory.authenticate(secret)
        if principal is None:
            return refusal("unauthenticated", "Authorization: the secret matches no peer")
        if hdrs.CONTENT_TYPE not in request.headers:
            return refusal("unsupported-media-type", "Content-Type: missing (application/json)")
        if request.content_type != "application/json":
            return refusal(
                "unsupported-media-type",
                f"Content-Type: {request.content_type} is not application/json",
            )
        charset = request.charset
        if charset is not None and charset.lower() not in ("utf-8", "utf8"):
            return refusal(
                "unsupported-media-type", f"Content-Type: charset {charset} is not utf-8"
            )
        length = request.content_length
        if length is not None and length > MAX_BODY:
            return refusal("too-large", f"Content-Length: {length} bytes, over {MAX_BODY}")
        return principal

    async def _expect(self, request: web.Request) -> web.StreamResponse | None:
        """``Expect: 100-continue``: invite the body only if it would be read."""
        expect = request.headers.get(hdrs.EXPECT, "").lower()
        if request.version != HttpVersion11:
            return None
        if expect != "100-continue":
            return refusal("expectation-failed", f"Expect: {expect} is not 100-continue")
        if isinstance(self._precheck(request), Principal):
            await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            request.writer.output_size = 0
        return None

    @staticmethod
    async def _read_body(request: web.Request) -> bytes | None:
        """The body, or None once it passes :data:`MAX_BODY` (chunked bodies too)."""
        chunks: list[bytes] = []
        size = 0
        while chunk := await request.content.read(_CHUNK):
            size += len(chunk)
            if size > MAX_BODY:
                return None
            chunks.append(chunk)
        return b"".join(chunks)

    # ------------------------------------------------------------------ contract messages

    async def _messages(self, request: web.Request) -> web.StreamResponse:
        response = await self._message(request)
        self.metrics.inc("masd_http_requests_total", status=str(response.status))
        return response

    async def _message(self, request: web.Request) -> web.Response:
        checked = self._precheck(request)
        if isinstance(checked, web.Response):
            log.info("message refused remote=%s status=%d", request.remote, checked.status)
            return checked
        principal = checked
        raw = await self._read_body(request)
        if raw is None:
            log.info("message refused peer=%s status=413 too-large", principal.id)
            return refusal("too-large", f"body: over {MAX_BODY} bytes")
        try:
            env = wire.parse_envelope(raw)
            wire.check_may_send(principal.kind, env)
        except WireError as exc:
            log.info(
                "message refused peer=%s status=%d error=%s", principal.id, exc.status, exc.code
            )
            return refusal(exc.code, exc.detail, status=exc.status)
        key, handoff_id = _envelope_refs(env)
        now = self.clock.now()
        try:
            got = await self.store.write(
                lambda db: service.receive(self.rt, db, principal, env, now)
            )
        except StoreError as exc:
            log.warning(
                "message unavailable peer=%s type=%s id=%s case=%s: %s",
                principal.id,
                env.type,
                env.id,
                key,
                exc.detail,
            )
            return refusal("unavailable", f"store: {exc.detail}")
        self.on_commit.committed(got.wakes)
        # The one line for the message: it names the statuses it recorded.
        recorded = got.statuses
        if handoff_id is None and recorded:
            handoff_id = recorded[-1].handoff_id  # a case.assign that opened a handoff
        log.info(
            "message peer=%s type=%s id=%s case=%s handoff=%s status=%d recorded=%s error=%s",
            principal.id,
            env.type,
            env.id,
            key,
            handoff_id,
            got.status,
            ",".join(s.status for s in recorded) or "-",
            got.body.get("error", "-"),
            extra={"case": key},
        )
        return web.json_response(dict(got.body), status=got.status)

    # ------------------------------------------------------------------ health and metrics

    async def _healthz(self, request: web.Request) -> web.Response:
        """docs/protocol.md §9: 200 only while the store accepts a write (checked at most every 5
        s).
        """
        try:
            health = await self.store.check()
        except Exception as exc:  # noqa: BLE001 (any failure means "not healthy")
            log.warning("healthz store unavailable: %s", exc)
            return refusal("store", "the store does not answer (see the log)", status=503)
        if not health.writable:
            return refusal("store", health.describe(), status=503)
        return web.json_response({"ok": True})

    async def _metrics(self, request: web.Request) -> web.Response:
        try:
            gauges = await self.store.read(store_gauges)
            gauges.update(health_gauges(self.store.health))
        except StoreError as exc:
            log.warning("metrics store unavailable: %s", exc)
            return refusal("unavailable", "store: not answering (see the log)")
        return web.Response(
            body=self.metrics.render(gauges).encode(),
            headers={hdrs.CONTENT_TYPE: METRICS_CONTENT_TYPE},
        )

    # ------------------------------------------------------------------ read side

    def admin_refusal(self, request: web.Request) -> web.Response | None:
        """docs/protocol.md §16: the read side needs the admin secret, else 401."""
        token = self.rt.config.server.admin_token
        if token is None:
            return refusal(
                "unauthenticated",
                "no admin token is configured (server.admin_token_file): the read side is closed",
            )
        secret = _bearer(request)
        if secret is None:
            return refusal("unauthenticated", _NO_BEARER)
        if not hmac.compare_digest(secret.encode(), token.encode()):
            return refusal("unauthenticated", "Authorization: not the admin secret")
        return None

    async def _case(self, request: web.Request) -> web.Response:
        if (denied := self.admin_refusal(request)) is not None:
            return denied
        key = request.match_info["key"]
        try:
            doc = await self.store.read(lambda db: readside.case_json(db, key))
        except StoreError as exc:
            return refusal("unavailable", f"store: {exc.detail}")
        if doc is None:
            return refusal("unknown-case", f"key: no case {key}")
        return web.json_response(doc)

    async def _thread(self, request: web.Request) -> web.Response:
        if (denied := self.admin_refusal(request)) is not None:
            return denied
        key = request.match_info["key"]
        after = int_param(request, "after", 0, 0, 2**63 - 1)
        limit = int_param(request, "limit", readside.DEFAULT_LIMIT, 1, readside.MAX_LIMIT)
        for name, value in (("after", after), ("limit", limit)):
            if isinstance(value, str):
                return refusal("invalid-message", f"{name}: {value}")
        assert isinstance(after, int)
        assert isinstance(limit, int)
        try:
            doc = await self.store.read(lambda db: readside.thread_json(db, key, after, limit))
        except StoreError as exc:
            return refusal("unavailable", f"store: {exc.detail}")
        if doc is None:
            return refusal("unknown-case", f"key: no case {key}")
        return web.json_response(doc)

    async def _tick(self, request: web.Request) -> web.Response:
        """The test clock: ``POST {"advance": seconds}`` moves masd's time forward."""
        if (denied := self.admin_refusal(request)) is not None:
            return denied
        assert isinstance(self.clock, TestClock)
        if request.method == "POST":
            try:
                body = wire.loads(await request.read())
                seconds = body["advance"]
                if isinstance(seconds, bool) or not isinstance(seconds, int | float):
                    raise TypeError(seconds)
                if not 0 <= seconds <= 10 * 365 * 86400:
                    raise ValueError(seconds)
            except WireError as exc:
                return refusal(exc.code, exc.detail, status=exc.status)
            except (ValueError, TypeError, KeyError) as exc:
                return refusal(
                    "invalid-message", f"advance: {exc!s:.80} is not a number of seconds >= 0"
                )
            self.clock.advance(float(seconds))
            # Deadlines and retries may be due now: the timer and the outbox look again.
            self.on_commit.committed(service.ALL_WAKES)
        return web.json_response({"ok": True, "now": self.clock.now()})


def int_param(request: web.Request, name: str, default: int, low: int, high: int) -> int | str:
    """The integer query parameter ``name``, or a text saying why it is refused."""
    text = request.query.get(name)
    if text is None:
        return default
    if not text.isascii() or not text.isdigit() or not low <= int(text) <= high:
        shown = text if len(text) <= 40 else text[:40] + "…"
        return f'"{shown}" is not an integer from {low} to {high}'
    return int(text)


class _ServerLog(logging.Logger):
    """The HTTP server's own log: a request it cannot parse is the client's
    fault, one INFO line; anything else keeps its traceback."""

    def exception(
        self, msg: object, *args: object, exc_info: object = True, **kwargs: object
    ) -> None:
        if isinstance(exc_info, HttpProcessingError):
            text = str(msg) % args if args else str(msg)
            reason = parser_refusal(str(exc_info))  # never the header line it quotes
            log.info("%s: not a valid HTTP request (%s)", text, reason[:300])
            return
        log.error(msg, *args, exc_info=exc_info if isinstance(exc_info, BaseException) else True)


_SERVER_LOG: Final = _ServerLog("masd.http.server")


class HttpListenError(ListenError):
    """The HTTP listener cannot start (address in use, a non-socket at the path)."""

    code = "http-listen"


@dataclass(frozen=True)
class HttpLimits:
    """docs/protocol.md §9's limits on the HTTP listener (seconds and a count)."""

    max_connections: int = MAX_CONNECTIONS
    header_timeout: float = HEADER_TIMEOUT
    keepalive_timeout: float = KEEPALIVE_TIMEOUT


def _over_the_limit(limit: int) -> bytes:
    """The whole answer to a connection over the limit: 503, then the close."""
    body = json.dumps(
        {
            "ok": False,
            "error": "unavailable",
            "detail": f"{limit} connections open (server.max_http_connections); retry later",
        }
    ).encode()
    head = (
        "HTTP/1.1 503 Service Unavailable\r\n"
        "Content-Type: application/json; charset=utf-8\r\n"
        f"Retry-After: {RETRY_AFTER}\r\n"
        "Connection: close\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    return head.encode("ascii") + body


class HttpServer:
    """A started listener: ``addresses`` as bound, ``gate`` its counts, ``close()``."""

    def __init__(self, runner: web.AppRunner, server: AcceptServer, gate: Gate) -> None:
        self._runner = runner
        self._server = server
        self.gate = gate
        self.addresses: list[tuple[str, int] | str] = []
        for sock in server.sockets:
            name = sock.getsockname()
            if isinstance(name, tuple):
                self.addresses.append((str(name[0]), int(name[1])))
            else:
                self.addresses.append(str(name))

    async def close(self) -> None:
        """Stop accepting, let requests in flight finish, then close."""
        self._server.close()
        await self._runner.cleanup()
        await self._server.wait_closed()


async def start_http(
    listen: Listen,
    edge: HttpEdge,
    *,
    sock: socket.socket | None = None,
    limits: HttpLimits = HttpLimits(),
) -> HttpServer:
    """Bind ``listen`` (TCP, port 0 allowed, or a unix socket, mode 0660 before
    it accepts anyone) and serve.

    ``sock``, an already listening socket (socket activation), is served
    instead of binding ``listen``.
    """
    gate = Gate(
        _unset,
        name="http",
        limit=limits.max_connections,
        refusal=_over_the_limit(limits.max_connections),
        header_timeout=limits.header_timeout,
        on_refused=lambda: edge.metrics.inc("masd_connections_refused_total", listener="http"),
    )
    runner = web.AppRunner(
        edge.app(gate),
        access_log=None,
        shutdown_timeout=10.0,
        keepalive_timeout=limits.keepalive_timeout,
        logger=_SERVER_LOG,
    )
    await runner.setup()
    assert runner.server is not None
    gate.factory = runner.server
    try:
        server = await serve(gate, listen, sock=sock, error=HttpListenError)
    except BaseException:
        await runner.cleanup()
        raise
    started = HttpServer(runner, server, gate)
    log.info("http listening on %s", ", ".join(str(a) for a in started.addresses))
    return started


def _unset() -> asyncio.Protocol:
    raise AssertionError("the HTTP gate is used before the server is set up")
